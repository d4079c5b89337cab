//! A small real TCP proxy for fault injection: put it between the relay and MariaDB (or any TCP
//! server) and cut, freeze or refuse connections on demand.
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use outbox_relay_testkit::proxy::TcpProxy;
//! let proxy = TcpProxy::start("127.0.0.1:3306").await?;
//! let url = format!("mysql://root@127.0.0.1:{}/shop", proxy.port());
//! // … start the relay with `url` …
//! proxy.freeze(); // half-open: sockets stay open, no byte moves either way
//! proxy.thaw();
//! proxy.cut(); // close every current connection; new ones are accepted
//! proxy.set_down(true); // new connections are closed at once
//! // One connection only, e.g. the one that carried the most bytes (a binlog stream):
//! if let Some(c) = proxy.connections().iter().max_by_key(|c| c.bytes_down) {
//!     proxy.freeze_connection(c.id);
//! }
//! # Ok(()) }
//! ```
//!
//! Each accepted connection gets its own connection to the target and two pumps (one per
//! direction). An end of stream on one side is passed on as a half-close (`shutdown(Write)`) to
//! the other, so clients that close cleanly (or die: the kernel closes their sockets) are seen as
//! gone by the server at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy currently does with bytes and connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Mode {
    /// No byte is forwarded; new connections are accepted but not connected onwards.
    frozen: bool,
    /// New connections are closed right after accept.
    down: bool,
    /// Incremented by [`TcpProxy::cut`]: connections accepted under an older value close.
    cut_generation: u64,
}

/// Counters, for tests and reports.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    cut: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

struct Shared {
    target: String,
    mode: watch::Sender<Mode>,
    counters: Counters,
    /// Live connections, by id (their tasks are aborted when the proxy is dropped).
    conns: Mutex<HashMap<u64, Conn>>,
    next_id: AtomicU64,
    /// Armed by [`TcpProxy::arm_tripwire`]; taken by the first connection that sends the
    /// pattern.
    tripwire: Tripwire,
    /// Kafka framing (see [`TcpProxy::start_kafka`]): requests are parsed for their header and
    /// responses forwarded frame by frame.
    kafka: bool,
    /// Armed by [`TcpProxy::arm_kafka_fault`]: the API key whose next response is dropped or
    /// delayed (one-shot).
    kafka_fault: Mutex<Option<(i16, KafkaFault)>>,
    /// Responses [`TcpProxy::arm_kafka_fault`] dropped or delayed so far.
    kafka_fired: AtomicU64,
}

/// What the proxy does with the response to a Kafka request of the armed API key (see
/// [`TcpProxy::arm_kafka_fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaFault {
    /// The response never reaches the client; the connection stays open and later responses
    /// flow (a lost answer: the client waits until its request times out).
    Drop,
    /// The response, and with it every later response of the connection (Kafka answers in
    /// order), reaches the client this much later (a late answer).
    Delay(std::time::Duration),
}

/// Kafka protocol API key of EndTxn (KIP-98): the request that commits or aborts a transaction.
pub const END_TXN: i16 = 26;

/// The armed tripwire: pattern and when to close.
type Tripwire = Mutex<Option<(Vec<u8>, Trip)>>;

/// When a tripwire (see [`TcpProxy::arm_tripwire`]) closes its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trip {
    /// The matching bytes never reach the target.
    Before,
    /// The matching bytes reach the target, its answer never reaches the client.
    After,
}

impl Shared {
    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|_, c| !c.task.is_finished());
        conns
    }
}

/// One proxied connection.
struct Conn {
    task: JoinHandle<()>,
    /// This connection alone is frozen (see [`TcpProxy::freeze_connection`]).
    frozen: watch::Sender<bool>,
    bytes: Arc<ConnBytes>,
    opened: Instant,
}

#[derive(Debug, Default)]
struct ConnBytes {
    up: AtomicU64,
    down: AtomicU64,
}

/// A snapshot of one proxied connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// Id, for [`TcpProxy::freeze_connection`] (increasing in accept order).
    pub id: u64,
    /// Bytes forwarded client → target.
    pub bytes_up: u64,
    /// Bytes forwarded target → client.
    pub bytes_down: u64,
    /// When it was accepted.
    pub opened: Instant,
    /// Frozen individually.
    pub frozen: bool,
}

/// A TCP proxy on `127.0.0.1:<ephemeral port>` forwarding to one target address. Runs on the
/// tokio runtime it was started on; dropping it closes the listener and every connection.
pub struct TcpProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept_task: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on `127.0.0.1:0` and forwards every accepted connection to `target`
    /// (`host:port`, resolved at each connect, so a restarted server is found again).
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start(target: impl Into<String>) -> Result<Self> {
        Self::start_on("127.0.0.1:0", target, false).await
    }

    /// A proxy on `listen` (`host:port`) that forwards to a Kafka broker at `target` and reads
    /// the Kafka protocol's framing (each message a 4-byte big-endian size, then a request
    /// header: API key, API version, correlation id; a response header: the correlation id), so
    /// that [`TcpProxy::arm_kafka_fault`] can drop or delay the response to one kind of request.
    /// For clients to stay behind the proxy the broker must advertise `listen` as its listener
    /// (`KAFKA_ADVERTISED_PORT` of `tests/services/kafka.sh`).
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start_kafka(listen: &str, target: impl Into<String>) -> Result<Self> {
        Self::start_on(listen, target, true).await
    }

    async fn start_on(listen: &str, target: impl Into<String>, kafka: bool) -> Result<Self> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the proxy's listener on {listen}"))?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::default());
        let shared = Arc::new(Shared {
            target: target.into(),
            mode,
            counters: Counters::default(),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            tripwire: Mutex::new(None),
            kafka,
            kafka_fault: Mutex::new(None),
            kafka_fired: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self {
            shared,
            addr,
            accept_task,
        })
    }

    /// The listening address (`127.0.0.1:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address connections are forwarded to.
    pub fn target(&self) -> &str {
        &self.shared.target
    }

    /// Closes every current connection (both sides); new connections are accepted as usual.
    pub fn cut(&self) {
        self.shared.mode.send_modify(|m| m.cut_generation += 1);
    }

    /// Stops forwarding bytes in both directions without closing any socket: to both ends each
    /// connection looks alive but silent (a half-open, black-holed connection). New connections
    /// are accepted but hang (not connected to the target) until [`TcpProxy::thaw`].
    pub fn freeze(&self) {
        self.shared.mode.send_modify(|m| m.frozen = true);
    }

    /// Resumes forwarding: bytes held back during the freeze are delivered, hanging new
    /// connections are connected onwards.
    pub fn thaw(&self) {
        self.shared.mode.send_modify(|m| m.frozen = false);
    }

    /// Whether the proxy is frozen.
    pub fn is_frozen(&self) -> bool {
        self.shared.mode.borrow().frozen
    }

    /// `true`: new connections are closed right after they are accepted (the client sees the
    /// connection reset or closed before any byte). Existing connections are not touched (use
    /// [`TcpProxy::cut`]). `false`: normal service.
    pub fn set_down(&self, down: bool) {
        self.shared.mode.send_modify(|m| m.down = down);
    }

    /// Connections accepted and forwarded (or hanging while frozen) since the start.
    pub fn accepted(&self) -> u64 {
        self.shared.counters.accepted.load(Ordering::Relaxed)
    }

    /// Connections closed at once because the proxy was down, or because the target refused.
    pub fn refused(&self) -> u64 {
        self.shared.counters.refused.load(Ordering::Relaxed)
    }

    /// Connections closed by [`TcpProxy::cut`].
    pub fn cut_connections(&self) -> u64 {
        self.shared.counters.cut.load(Ordering::Relaxed)
    }

    /// Arms a one-shot tripwire: the first chunk a client sends that contains `pattern` closes
    /// that connection (both sides), [`Trip::Before`] or [`Trip::After`] forwarding the chunk.
    /// With `b"\x03COMMIT"` (a MySQL COM_QUERY `COMMIT`), `After` makes a COMMIT whose outcome
    /// the client cannot know although the server committed, `Before` one that did not commit.
    pub fn arm_tripwire(&self, pattern: &[u8], trip: Trip) {
        *self
            .shared
            .tripwire
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((pattern.to_vec(), trip));
    }

    /// Whether the tripwire is still armed (it disarms when it fires).
    pub fn tripwire_armed(&self) -> bool {
        self.shared
            .tripwire
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Disarms the tripwire; returns whether it was still armed.
    pub fn disarm_tripwire(&self) -> bool {
        self.shared
            .tripwire
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
    }

    /// Arms a one-shot Kafka fault (a proxy of [`TcpProxy::start_kafka`] only): the response to
    /// the next request with `api_key` (e.g. [`END_TXN`]) is dropped or delayed.
    pub fn arm_kafka_fault(&self, api_key: i16, fault: KafkaFault) {
        *self
            .shared
            .kafka_fault
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((api_key, fault));
    }

    /// Disarms the Kafka fault; returns whether it was still armed (no matching request yet).
    pub fn disarm_kafka_fault(&self) -> bool {
        self.shared
            .kafka_fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
    }

    /// Responses dropped or delayed by [`TcpProxy::arm_kafka_fault`] so far (counted when the
    /// response arrives from the broker).
    pub fn kafka_faults_fired(&self) -> u64 {
        self.shared.kafka_fired.load(Ordering::Relaxed)
    }

    /// Connections currently open (including hanging ones).
    pub fn active(&self) -> usize {
        self.shared.conns().len()
    }

    /// The connections currently open, in accept order.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        let mut list: Vec<ConnectionInfo> = self
            .shared
            .conns()
            .iter()
            .map(|(id, c)| ConnectionInfo {
                id: *id,
                bytes_up: c.bytes.up.load(Ordering::Relaxed),
                bytes_down: c.bytes.down.load(Ordering::Relaxed),
                opened: c.opened,
                frozen: *c.frozen.borrow(),
            })
            .collect();
        list.sort_by_key(|c| c.id);
        list
    }

    /// Freezes one connection only (as [`TcpProxy::freeze`] does for all): its bytes stop in
    /// both directions, its sockets stay open. Returns `false` when no such connection is open.
    pub fn freeze_connection(&self, id: u64) -> bool {
        self.shared
            .conns()
            .get(&id)
            .map(|c| c.frozen.send_replace(true))
            .is_some()
    }

    /// Undoes [`TcpProxy::freeze_connection`]. Returns `false` when no such connection is open.
    pub fn thaw_connection(&self, id: u64) -> bool {
        self.shared
            .conns()
            .get(&id)
            .map(|c| c.frozen.send_replace(false))
            .is_some()
    }

    /// Bytes forwarded client → target and target → client.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.shared.counters.bytes_up.load(Ordering::Relaxed),
            self.shared.counters.bytes_down.load(Ordering::Relaxed),
        )
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        for (_, conn) in self.shared.conns().drain() {
            conn.task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let (client, _) = match listener.accept().await {
            Ok(c) => c,
            Err(_) => {
                // Out of file descriptors or similar: back off a little and go on.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let mode = *shared.mode.borrow();
        if mode.down {
            shared.counters.refused.fetch_add(1, Ordering::Relaxed);
            drop(client);
            continue;
        }
        shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (frozen, frozen_rx) = watch::channel(false);
        let bytes = Arc::new(ConnBytes::default());
        // Registered before the task runs, so a fast connection cannot finish unregistered.
        let mut conns = shared.conns();
        let task = tokio::spawn(serve(
            client,
            Arc::clone(&shared),
            mode.cut_generation,
            frozen_rx,
            Arc::clone(&bytes),
        ));
        conns.insert(
            id,
            Conn {
                task,
                frozen,
                bytes,
                opened: Instant::now(),
            },
        );
    }
}

/// Forwards one connection until both directions ended, or a cut.
async fn serve(
    client: TcpStream,
    shared: Arc<Shared>,
    generation: u64,
    frozen: watch::Receiver<bool>,
    bytes: Arc<ConnBytes>,
) {
    let mut cut_rx = shared.mode.subscribe();
    let tripped = tokio::sync::Notify::new();
    let forward = async {
        // While frozen, a new connection hangs before it reaches the target.
        wait_thawed(shared.mode.subscribe(), frozen.clone()).await;
        let Ok(server) = TcpStream::connect(shared.target.as_str()).await else {
            shared.counters.refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_r, client_w) = client.into_split();
        let (server_r, server_w) = server.into_split();
        if shared.kafka {
            let pending = Mutex::new(HashMap::new());
            let up = kafka_requests(
                client_r,
                server_w,
                (shared.mode.subscribe(), frozen.clone()),
                (&shared, &pending),
                [&shared.counters.bytes_up, &bytes.up],
            );
            let down = kafka_responses(
                server_r,
                client_w,
                (shared.mode.subscribe(), frozen.clone()),
                (&shared, &pending),
                [&shared.counters.bytes_down, &bytes.down],
            );
            let _ = tokio::join!(up, down);
            return;
        }
        let up = pump(
            client_r,
            server_w,
            (shared.mode.subscribe(), frozen.clone()),
            [&shared.counters.bytes_up, &bytes.up],
            Some((&shared.tripwire, &tripped)),
        );
        let down = pump(
            server_r,
            client_w,
            (shared.mode.subscribe(), frozen.clone()),
            [&shared.counters.bytes_down, &bytes.down],
            None,
        );
        let _ = tokio::join!(up, down);
    };
    tokio::select! {
        () = forward => {}
        () = tripped.notified() => {
            shared.counters.cut.fetch_add(1, Ordering::Relaxed);
        }
        _ = cut_rx.wait_for(|m| m.cut_generation != generation) => {
            // Dropping `forward` drops both sockets: the client and the server see the close.
            shared.counters.cut.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Waits until neither the whole proxy nor this connection is frozen.
async fn wait_thawed(mut mode: watch::Receiver<Mode>, mut conn: watch::Receiver<bool>) {
    // An error means the proxy is gone; the task is being aborted anyway.
    loop {
        if mode.wait_for(|m| !m.frozen).await.is_err() || conn.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if !mode.borrow().frozen && !*conn.borrow() {
            return;
        }
    }
}

/// Copies `from` to `to` until end of stream (then half-closes `to`) or an error, holding bytes
/// back while the proxy is frozen.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    (mode, frozen): (watch::Receiver<Mode>, watch::Receiver<bool>),
    counters: [&AtomicU64; 2],
    tripwire: Option<(&Tripwire, &tokio::sync::Notify)>,
) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        wait_thawed(mode.clone(), frozen.clone()).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // A freeze that began while this read waited holds the bytes here.
        wait_thawed(mode.clone(), frozen.clone()).await;
        let trip = tripwire.and_then(|(armed, notify)| {
            let mut armed = armed.lock().unwrap_or_else(|e| e.into_inner());
            let hit = armed.as_ref().is_some_and(|(pattern, _)| {
                !pattern.is_empty() && buf[..n].windows(pattern.len()).any(|w| w == pattern)
            });
            hit.then(|| armed.take().map(|(_, t)| (t, notify)))
                .flatten()
        });
        if let Some((Trip::Before, notify)) = trip {
            notify.notify_one();
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Some((Trip::After, notify)) = trip {
            let _ = to.flush().await;
            notify.notify_one();
            return;
        }
        for c in counters {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// Correlation ids of one connection's requests whose responses get a [`KafkaFault`].
type Pending = Mutex<HashMap<i32, KafkaFault>>;

/// Forwards Kafka requests unchanged, reading each one's header (size, API key, API version,
/// correlation id): a request of the armed API key takes the armed fault for its response.
async fn kafka_requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    (mode, frozen): (watch::Receiver<Mode>, watch::Receiver<bool>),
    (shared, pending): (&Shared, &Pending),
    counters: [&AtomicU64; 2],
) {
    let mut buf = vec![0u8; 32 * 1024];
    let mut header = Vec::with_capacity(12);
    let mut skip = 0usize;
    loop {
        wait_thawed(mode.clone(), frozen.clone()).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        wait_thawed(mode.clone(), frozen.clone()).await;
        let mut i = 0;
        while i < n {
            if skip > 0 {
                let k = skip.min(n - i);
                skip -= k;
                i += k;
                continue;
            }
            let k = (12 - header.len()).min(n - i);
            header.extend_from_slice(&buf[i..i + k]);
            i += k;
            if header.len() == 12 {
                let size = i32::from_be_bytes([header[0], header[1], header[2], header[3]]);
                let api_key = i16::from_be_bytes([header[4], header[5]]);
                let correlation =
                    i32::from_be_bytes([header[8], header[9], header[10], header[11]]);
                skip = usize::try_from(size).unwrap_or(0).saturating_sub(8);
                header.clear();
                let mut armed = shared.kafka_fault.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((key, fault)) = *armed {
                    if key == api_key {
                        *armed = None;
                        pending
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(correlation, fault);
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        for c in counters {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// Forwards Kafka responses frame by frame, dropping or delaying the ones whose correlation id
/// [`kafka_requests`] marked.
async fn kafka_responses(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    (mode, frozen): (watch::Receiver<Mode>, watch::Receiver<bool>),
    (shared, pending): (&Shared, &Pending),
    counters: [&AtomicU64; 2],
) {
    let mut buf = vec![0u8; 32 * 1024];
    let mut header = Vec::with_capacity(8);
    // Bytes left of the current response, and whether they are dropped.
    let mut rest = 0usize;
    let mut dropping = false;
    loop {
        wait_thawed(mode.clone(), frozen.clone()).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        wait_thawed(mode.clone(), frozen.clone()).await;
        let mut out = Vec::with_capacity(n);
        let mut i = 0;
        while i < n {
            if rest > 0 {
                let k = rest.min(n - i);
                if !dropping {
                    out.extend_from_slice(&buf[i..i + k]);
                }
                rest -= k;
                i += k;
                continue;
            }
            let k = (8 - header.len()).min(n - i);
            header.extend_from_slice(&buf[i..i + k]);
            i += k;
            if header.len() < 8 {
                continue;
            }
            let size = i32::from_be_bytes([header[0], header[1], header[2], header[3]]);
            let correlation = i32::from_be_bytes([header[4], header[5], header[6], header[7]]);
            rest = usize::try_from(size).unwrap_or(0).saturating_sub(4);
            let fault = pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&correlation);
            dropping = fault == Some(KafkaFault::Drop);
            if fault.is_some() {
                shared.kafka_fired.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(KafkaFault::Delay(d)) = fault {
                // Everything before this response goes now; it and what follows, later.
                if to.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
                tokio::time::sleep(d).await;
            }
            if !dropping {
                out.extend_from_slice(&header);
            }
            header.clear();
        }
        if to.write_all(&out).await.is_err() {
            return;
        }
        for c in counters {
            c.fetch_add(out.len() as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::timeout;

    /// An echo server on an ephemeral port; returns its address.
    async fn echo_server() -> Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    loop {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if sock.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        Ok(addr)
    }

    async fn roundtrip(sock: &mut TcpStream, msg: &[u8]) -> Result<Vec<u8>> {
        sock.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        sock.read_exact(&mut got).await?;
        Ok(got)
    }

    const SHORT: Duration = Duration::from_millis(300);
    const LONG: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn forwards_both_ways_and_counts() -> Result<()> {
        let proxy = TcpProxy::start(echo_server().await?.to_string()).await?;
        let mut a = TcpStream::connect(proxy.addr()).await?;
        let mut b = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut a, b"hello").await?, b"hello");
        assert_eq!(roundtrip(&mut b, b"world!").await?, b"world!");
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (mut r, mut w) = a.into_split();
        let expect = big.clone();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; expect.len()];
            r.read_exact(&mut got).await.map(|_| got == expect)
        });
        w.write_all(&big).await?;
        assert!(timeout(LONG, reader).await???);
        assert_eq!(proxy.accepted(), 2);
        assert_eq!(proxy.active(), 2);
        let (up, down) = proxy.bytes();
        assert_eq!(up, 5 + 6 + 200_000);
        assert_eq!(down, up);
        Ok(())
    }

    #[tokio::test]
    async fn cut_closes_current_connections_and_keeps_accepting() -> Result<()> {
        let proxy = TcpProxy::start(echo_server().await?.to_string()).await?;
        let mut a = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut a, b"x").await?, b"x");
        proxy.cut();
        // The client sees end of stream (or a reset), not silence.
        let mut buf = [0u8; 8];
        let n = timeout(LONG, a.read(&mut buf)).await?;
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        let mut b = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut b, b"again").await?, b"again");
        assert_eq!(proxy.cut_connections(), 1);
        Ok(())
    }

    #[tokio::test]
    async fn freeze_holds_bytes_without_closing_and_thaw_delivers_them() -> Result<()> {
        let proxy = TcpProxy::start(echo_server().await?.to_string()).await?;
        let mut a = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut a, b"before").await?, b"before");
        proxy.freeze();
        assert!(proxy.is_frozen());
        a.write_all(b"during").await?;
        let mut buf = [0u8; 6];
        // Nothing comes back while frozen, and the connection is not closed.
        assert!(timeout(SHORT, a.read_exact(&mut buf)).await.is_err());
        // A new connection hangs too.
        let mut b = TcpStream::connect(proxy.addr()).await?;
        b.write_all(b"new").await?;
        let mut nb = [0u8; 3];
        assert!(timeout(SHORT, b.read_exact(&mut nb)).await.is_err());
        proxy.thaw();
        timeout(LONG, a.read_exact(&mut buf)).await??;
        assert_eq!(&buf, b"during");
        timeout(LONG, b.read_exact(&mut nb)).await??;
        assert_eq!(&nb, b"new");
        assert_eq!(roundtrip(&mut a, b"after").await?, b"after");
        Ok(())
    }

    #[tokio::test]
    async fn down_refuses_new_connections_only() -> Result<()> {
        let proxy = TcpProxy::start(echo_server().await?.to_string()).await?;
        let mut a = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut a, b"1").await?, b"1");
        proxy.set_down(true);
        // The TCP handshake completes (the listener stays open) but the connection is closed.
        let mut b = TcpStream::connect(proxy.addr()).await?;
        let mut buf = [0u8; 1];
        let _ = b.write_all(b"x").await;
        let n = timeout(LONG, b.read(&mut buf)).await?;
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        assert_eq!(roundtrip(&mut a, b"2").await?, b"2");
        proxy.set_down(false);
        let mut c = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut c, b"3").await?, b"3");
        assert_eq!(proxy.refused(), 1);
        Ok(())
    }

    #[tokio::test]
    async fn client_close_reaches_the_server_and_unreachable_targets_close_the_client() -> Result<()>
    {
        // A target that accepts and reports when its peer closes.
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let target = listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            if let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 16];
                let n = s.read(&mut buf).await.ok();
                let _ = tx.send(n);
            }
        });
        let proxy = TcpProxy::start(target.to_string()).await?;
        let a = TcpStream::connect(proxy.addr()).await?;
        drop(a);
        assert_eq!(timeout(LONG, rx).await??, Some(0));

        // Nothing listens on the target any more: the client is closed.
        let dead = {
            let l = TcpListener::bind("127.0.0.1:0").await?;
            l.local_addr()?
        };
        let proxy = TcpProxy::start(dead.to_string()).await?;
        let mut b = TcpStream::connect(proxy.addr()).await?;
        let mut buf = [0u8; 1];
        let n = timeout(LONG, b.read(&mut buf)).await?;
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        Ok(())
    }

    #[tokio::test]
    async fn one_connection_can_be_frozen_alone() -> Result<()> {
        let proxy = TcpProxy::start(echo_server().await?.to_string()).await?;
        let mut a = TcpStream::connect(proxy.addr()).await?;
        let mut b = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut a, b"aaaa").await?, b"aaaa");
        assert_eq!(roundtrip(&mut b, b"bb").await?, b"bb");
        let conns = proxy.connections();
        assert_eq!(conns.len(), 2);
        // Accept order; bytes per connection.
        assert_eq!((conns[0].bytes_up, conns[0].bytes_down), (4, 4));
        assert_eq!((conns[1].bytes_up, conns[1].bytes_down), (2, 2));
        assert!(proxy.freeze_connection(conns[0].id));
        assert!(proxy.connections()[0].frozen);
        a.write_all(b"held").await?;
        let mut buf = [0u8; 4];
        assert!(timeout(SHORT, a.read_exact(&mut buf)).await.is_err());
        assert_eq!(roundtrip(&mut b, b"free").await?, b"free");
        // A global freeze and thaw do not thaw the single connection.
        proxy.freeze();
        proxy.thaw();
        assert!(timeout(SHORT, a.read_exact(&mut buf)).await.is_err());
        assert!(proxy.thaw_connection(conns[0].id));
        timeout(LONG, a.read_exact(&mut buf)).await??;
        assert_eq!(&buf, b"held");
        assert!(!proxy.freeze_connection(9_999));
        Ok(())
    }

    /// A Kafka request frame: size, API key, API version 0, correlation id, a small body.
    fn kafka_request(api_key: i16, correlation: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&api_key.to_be_bytes());
        m.extend_from_slice(&0i16.to_be_bytes());
        m.extend_from_slice(&correlation.to_be_bytes());
        m.extend_from_slice(b"body");
        let mut out = (m.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&m);
        out
    }

    #[tokio::test]
    async fn a_kafka_fault_drops_or_delays_one_response() -> Result<()> {
        // A "broker" answering each request with its correlation id and a 3-byte body.
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let target = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    loop {
                        let mut size = [0u8; 4];
                        if s.read_exact(&mut size).await.is_err() {
                            return;
                        }
                        let mut req = vec![0u8; i32::from_be_bytes(size) as usize];
                        if s.read_exact(&mut req).await.is_err() {
                            return;
                        }
                        let mut resp = 7i32.to_be_bytes().to_vec();
                        resp.extend_from_slice(&req[4..8]);
                        resp.extend_from_slice(b"ack");
                        if s.write_all(&resp).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let proxy = TcpProxy::start_kafka("127.0.0.1:0", target.to_string()).await?;
        let mut c = TcpStream::connect(proxy.addr()).await?;
        let answer = async |c: &mut TcpStream| -> Result<i32> {
            let mut frame = [0u8; 11];
            c.read_exact(&mut frame).await?;
            Ok(i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]))
        };
        proxy.arm_kafka_fault(END_TXN, KafkaFault::Drop);
        c.write_all(&kafka_request(END_TXN, 1)).await?;
        c.write_all(&kafka_request(3, 2)).await?;
        // The EndTxn answer (1) never comes; the next one does.
        assert_eq!(timeout(LONG, answer(&mut c)).await??, 2);
        assert_eq!(proxy.kafka_faults_fired(), 1);
        proxy.arm_kafka_fault(END_TXN, KafkaFault::Delay(Duration::from_millis(400)));
        let sent = std::time::Instant::now();
        c.write_all(&kafka_request(END_TXN, 3)).await?;
        assert_eq!(timeout(LONG, answer(&mut c)).await??, 3);
        assert!(sent.elapsed() >= Duration::from_millis(400));
        assert!(!proxy.disarm_kafka_fault());
        Ok(())
    }

    #[tokio::test]
    async fn tripwire_closes_the_connection_before_or_after_the_matching_bytes() -> Result<()> {
        // A target that records what it received.
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let target = listener.local_addr()?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..n]);
                    }
                    let _ = tx.send(got);
                });
            }
        });
        let proxy = TcpProxy::start(target.to_string()).await?;
        for (trip, want) in [
            (Trip::Before, &b"hello "[..]),
            (Trip::After, &b"hello COMMIT"[..]),
        ] {
            proxy.arm_tripwire(b"COMMIT", trip);
            let mut c = TcpStream::connect(proxy.addr()).await?;
            c.write_all(b"hello ").await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            c.write_all(b"COMMIT").await?;
            let mut buf = [0u8; 1];
            let n = timeout(LONG, c.read(&mut buf)).await?;
            assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
            assert_eq!(timeout(LONG, rx.recv()).await?.as_deref(), Some(want));
            assert!(!proxy.tripwire_armed());
        }
        assert!(!proxy.disarm_tripwire());
        Ok(())
    }
}
