//! One active relay per connector name: a lease held as a MySQL user lock, plus a fencing token.
//!
//! The lease is `GET_LOCK('<name>')` on a dedicated connection (MySQL "Locking Functions"): the
//! server releases it when that connection ends, so a killed instance frees it without any other
//! infrastructure, and a second instance waiting in `GET_LOCK` takes over within about one
//! poll interval. On acquiring it, the instance increments `lease_token` in its checkpoint row;
//! every checkpoint write requires that token (see
//! [`crate::state::store::MysqlCheckpointStore::fenced`]), so an instance that lost the lease —
//! for example after a network partition it has not noticed yet — can never overwrite a newer
//! checkpoint.
//!
//! # A lease with a time to live (fleets)
//! A process that freezes (SIGSTOP, a stalled VM) or is cut off keeps its session, and so the
//! lock, for as long as the server keeps the session. [`Lease::acquire`] with a `ttl` bounds
//! that: the lease connection sets `SET SESSION wait_timeout = ceil(ttl / 1 s)`, so the server
//! closes it (and `GET_LOCK` is released with the session) once it was idle that long; a
//! keeper task confirms the lock every `ttl / 4`, which keeps it busy; and the holder may hand
//! a record to its producer only while the lease was confirmed within the last `ttl / 2`
//! ([`LeaseClock::check`], a local monotonic deadline each successful confirmation renews). A
//! resumed process thus finds its deadline passed and stops before producing, while the server
//! frees the lock for the next owner only after that deadline (`ttl / 2` after the last
//! confirmation the server saw, at the latest, versus `ttl` of idleness).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use tokio::sync::{watch, Mutex};

use outbox_relay_core::config::TableName;
use outbox_relay_core::error::RelayError;

/// How long one `GET_LOCK` call waits before the instance checks for shutdown and logs again.
const LOCK_POLL: Duration = Duration::from_secs(1);
/// How often a waiting instance says it is still waiting.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(30);
/// MySQL user lock names are limited to 64 characters.
const MAX_LOCK_NAME: usize = 64;

/// A held lease.
pub struct Lease {
    conn: Arc<Mutex<Conn>>,
    lock_name: String,
    token: u64,
    /// Longest wait for the lease connection before it counts as lost.
    io_timeout: Duration,
    /// With a time to live: the confirmation deadline and the keeper renewing it.
    ttl: Option<(LeaseClock, Keeper)>,
}

/// The keeper task; aborted when dropped.
struct Keeper(tokio::task::JoinHandle<()>);

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// When the lease was last confirmed, as a deadline on the monotonic clock (see the module
/// documentation). Cheap to clone and to check.
#[derive(Clone, Debug)]
pub struct LeaseClock {
    origin: Instant,
    /// ms after `origin` until which the lease counts as confirmed.
    deadline_ms: Arc<AtomicU64>,
    /// How long a confirmation counts: `ttl / 2`.
    window: Duration,
}

impl LeaseClock {
    fn new(window: Duration) -> Self {
        Self {
            origin: Instant::now(),
            deadline_ms: Arc::new(AtomicU64::new(0)),
            window,
        }
    }

    /// The lease was confirmed by a query sent at `sent`.
    fn renew(&self, sent: Instant) {
        let until = (sent + self.window).saturating_duration_since(self.origin);
        self.deadline_ms
            .fetch_max(until.as_millis() as u64, Ordering::SeqCst);
    }

    /// `Ok` while the lease was confirmed within the window.
    ///
    /// # Errors
    /// [`RelayError::LeaseLost`] past the deadline: the process may have been frozen or cut
    /// off long enough for the server to end the lease's session and another instance to take
    /// the lease; nothing more may be produced before the lease is taken again.
    pub fn check(&self) -> Result<(), RelayError> {
        let now = self.origin.elapsed().as_millis() as u64;
        let deadline = self.deadline_ms.load(Ordering::SeqCst);
        if now < deadline {
            return Ok(());
        }
        Err(RelayError::LeaseLost(format!(
            "the lease was last confirmed {} ms ago, more than its time to live allows ({} ms): \
             this process may have been frozen or cut off, and another instance may hold the \
             lease now",
            (now + self.window.as_millis() as u64).saturating_sub(deadline),
            self.window.as_millis()
        )))
    }
}

impl Lease {
    /// Waits until this instance holds the lease of `connector` (or `shutdown` turns true, then
    /// `Ok(None)`), then takes the next fencing token in `table`.
    ///
    /// # Errors
    /// [`RelayError::Mysql`] when the server cannot be reached (retried by the caller).
    pub async fn acquire(
        opts: Opts,
        table: &TableName,
        connector: &str,
        owner: &str,
        io_timeout: Duration,
        ttl: Option<Duration>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Option<Self>, RelayError> {
        let mut conn = outbox_relay_core::error::with_timeout(
            io_timeout,
            "connecting for the lease",
            Conn::new(opts),
        )
        .await??;
        if let Some(ttl) = ttl {
            // The server ends the session (and so the lock) once it was idle this long.
            let secs = ttl.as_millis().div_ceil(1000).max(1) as u64;
            conn.query_drop(format!("SET SESSION wait_timeout = {secs}"))
                .await?;
        }
        let lock_name = lock_name(table, connector);
        let started = Instant::now();
        let mut last_log: Option<Instant> = None;
        loop {
            if *shutdown.borrow() {
                return Ok(None);
            }
            let got: Option<i64> = outbox_relay_core::error::with_timeout(
                io_timeout + LOCK_POLL,
                "waiting for the lease",
                conn.exec_first("SELECT GET_LOCK(?, ?)", (&lock_name, LOCK_POLL.as_secs())),
            )
            .await??;
            match got {
                Some(1) => break,
                Some(_) => {
                    if last_log.is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY) {
                        let holder: Option<u64> = conn
                            .exec_first("SELECT IS_USED_LOCK(?)", (&lock_name,))
                            .await?;
                        tracing::info!(
                            connector,
                            lock = %lock_name,
                            holder_connection_id = ?holder,
                            waited_s = started.elapsed().as_secs(),
                            "another instance holds this connector's lease; standing by"
                        );
                        last_log = Some(Instant::now());
                    }
                }
                None => {
                    return Err(RelayError::mysql(format!(
                        "GET_LOCK({lock_name:?}) failed on the server"
                    )))
                }
            }
        }
        let sent = Instant::now();
        let token = take_token(&mut conn, table, connector, owner).await?;
        tracing::info!(
            connector,
            lease_token = token,
            owner,
            ttl_ms = ttl.map(|t| t.as_millis() as u64),
            "lease acquired"
        );
        let conn = Arc::new(Mutex::new(conn));
        let ttl = ttl.map(|ttl| {
            let clock = LeaseClock::new(ttl / 2);
            clock.renew(sent);
            let keeper = Keeper(tokio::spawn(keep(
                Arc::clone(&conn),
                lock_name.clone(),
                clock.clone(),
                ttl / 4,
                io_timeout.min(ttl / 4),
            )));
            (clock, keeper)
        });
        Ok(Some(Self {
            conn,
            lock_name,
            token,
            io_timeout,
            ttl,
        }))
    }

    /// Takes the lease of `connector` only if no other instance holds it (`GET_LOCK` with no
    /// wait), then the next fencing token in `table`, as [`Lease::acquire`] does. For operator
    /// commands (`outbox-relay reset`) that must not run while a relay streams, and must keep
    /// one from starting while they change the checkpoint row.
    ///
    /// Returns `Ok(Err(holder))` when another connection holds the lock (`holder`: its
    /// connection id, from `IS_USED_LOCK`, `None` if it was released in between).
    ///
    /// # Errors
    /// [`RelayError::Mysql`] when the server cannot be reached or `GET_LOCK` fails.
    pub async fn try_acquire(
        opts: Opts,
        table: &TableName,
        connector: &str,
        owner: &str,
        io_timeout: Duration,
    ) -> Result<Result<Self, Option<u64>>, RelayError> {
        let mut conn = outbox_relay_core::error::with_timeout(
            io_timeout,
            "connecting for the lease",
            Conn::new(opts),
        )
        .await??;
        let lock_name = lock_name(table, connector);
        let got: Option<i64> = outbox_relay_core::error::with_timeout(
            io_timeout,
            "taking the lease",
            conn.exec_first("SELECT GET_LOCK(?, 0)", (&lock_name,)),
        )
        .await??;
        match got {
            Some(1) => {}
            Some(_) => {
                let holder: Option<u64> = conn
                    .exec_first("SELECT IS_USED_LOCK(?)", (&lock_name,))
                    .await?
                    .flatten();
                let _ = conn.disconnect().await;
                return Ok(Err(holder));
            }
            None => {
                return Err(RelayError::mysql(format!(
                    "GET_LOCK({lock_name:?}) failed on the server"
                )))
            }
        }
        let token = take_token(&mut conn, table, connector, owner).await?;
        tracing::info!(connector, lease_token = token, owner, "lease acquired");
        Ok(Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            lock_name,
            token,
            io_timeout,
            ttl: None,
        }))
    }

    /// This lease's fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Confirms the lock is still held by this connection.
    ///
    /// # Errors
    /// [`RelayError::LeaseLost`] when the lease connection failed or the lock is gone.
    pub async fn verify(&mut self) -> Result<(), RelayError> {
        let mut conn = self.conn.lock().await;
        let sent = Instant::now();
        let check = conn.exec_first(
            "SELECT IS_USED_LOCK(?) = CONNECTION_ID()",
            (&self.lock_name,),
        );
        let holder: Result<Option<Option<u64>>, _> =
            match tokio::time::timeout(self.io_timeout, check).await {
                Ok(result) => result,
                Err(_) => {
                    return Err(RelayError::LeaseLost(format!(
                        "the lease connection did not answer within {} ms",
                        self.io_timeout.as_millis()
                    )))
                }
            };
        match holder {
            Ok(Some(Some(1))) => {
                if let Some((clock, _)) = &self.ttl {
                    clock.renew(sent);
                }
                Ok(())
            }
            Ok(_) => Err(RelayError::LeaseLost(format!(
                "the lock {:?} is no longer held by this instance",
                self.lock_name
            ))),
            Err(e) => Err(RelayError::LeaseLost(format!(
                "the lease connection failed: {}",
                outbox_relay_core::error::redact_error(&e.to_string())
            ))),
        }
    }

    /// The lease's confirmation deadline, when it has a time to live; the pipeline checks it
    /// before every record it hands to the producer.
    pub fn clock(&self) -> Option<LeaseClock> {
        self.ttl.as_ref().map(|(clock, _)| clock.clone())
    }

    /// Releases the lock (also released by the server when the process dies).
    pub async fn release(self) {
        // Aborted; its hold on the connection goes when the task is dropped.
        drop(self.ttl);
        tokio::task::yield_now().await;
        let _ = self
            .conn
            .lock()
            .await
            .exec_drop("DO RELEASE_LOCK(?)", (&self.lock_name,))
            .await;
        // (Otherwise the connection closes when the aborted keeper lets go of it.)
        if let Ok(conn) = Arc::try_unwrap(self.conn) {
            let _ = conn.into_inner().disconnect().await;
        }
    }
}

/// The keeper of a lease with a time to live: confirms the lock every `every` and renews
/// `clock`; stops at the first failure (the deadline then passes and the pipeline stops).
async fn keep(
    conn: Arc<Mutex<Conn>>,
    lock_name: String,
    clock: LeaseClock,
    every: Duration,
    timeout: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let mut c = conn.lock().await;
        let sent = Instant::now();
        let check = c.exec_first::<Option<u64>, _, _>(
            "SELECT IS_USED_LOCK(?) = CONNECTION_ID()",
            (&lock_name,),
        );
        match tokio::time::timeout(timeout, check).await {
            Ok(Ok(Some(Some(1)))) => clock.renew(sent),
            other => {
                let why = match other {
                    Ok(Ok(_)) => "the lock is held by another session".to_owned(),
                    Ok(Err(e)) => outbox_relay_core::error::redact_error(&e.to_string()),
                    Err(_) => format!("no answer within {} ms", timeout.as_millis()),
                };
                tracing::warn!(lock = %lock_name, error = %why, "the lease could not be \
                    confirmed: nothing more is produced until it is taken again");
                return;
            }
        }
    }
}

/// Takes the next fencing token of `connector` in `table`, creating the row if this connector
/// has none yet (an empty `binlog_file` means "no position stored"), and records `owner`.
async fn take_token(
    conn: &mut Conn,
    table: &TableName,
    connector: &str,
    owner: &str,
) -> Result<u64, RelayError> {
    let quoted = table.quoted();
    conn.exec_drop(
        outbox_relay_core::state::codec::take_lease(&quoted),
        (connector, owner),
    )
    .await?;
    let token: Option<u64> = conn
        .exec_first(
            outbox_relay_core::state::codec::select_lease_token(&quoted),
            (connector,),
        )
        .await?;
    token.ok_or_else(|| RelayError::mysql(format!("the checkpoint row of {connector:?} vanished")))
}

/// The name of the MySQL user lock that is `connector`'s lease (checkpoint table `table`):
/// `outbox_relay.<db>.<table>.<connector>`, or a CRC32-shortened form past MySQL's
/// 64-character limit for lock names. `IS_USED_LOCK(name)` tells whether a relay holds it.
pub fn lock_name(table: &TableName, connector: &str) -> String {
    let full = format!(
        "outbox_relay.{}.{}.{connector}",
        table.database, table.table
    );
    if full.len() <= MAX_LOCK_NAME {
        return full;
    }
    let hash = crc32fast::hash(full.as_bytes());
    let prefix: String = connector.chars().take(40).collect();
    format!("outbox_relay.{prefix}.{hash:08x}")
}

/// `host:pid`, stored as the lease owner for operators.
pub fn instance_name() -> String {
    outbox_relay_core::config::process::instance_name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_fit_mysql_limit_and_stay_distinct() {
        let t = TableName {
            database: "shop".into(),
            table: "outbox_relay_checkpoint".into(),
        };
        assert_eq!(
            lock_name(&t, "orders"),
            "outbox_relay.shop.outbox_relay_checkpoint.orders"
        );
        let a = lock_name(&t, &"a".repeat(100));
        let b = lock_name(&t, &format!("{}b", "a".repeat(99)));
        assert!(a.len() <= MAX_LOCK_NAME && b.len() <= MAX_LOCK_NAME);
        assert_ne!(a, b);
    }

    #[test]
    fn a_lease_clock_counts_a_confirmation_for_its_window_only() {
        let clock = LeaseClock::new(Duration::from_millis(60));
        assert!(clock.check().is_err(), "never confirmed");
        clock.renew(Instant::now());
        assert!(clock.check().is_ok());
        // An older confirmation never moves the deadline back.
        clock.renew(Instant::now() - Duration::from_millis(50));
        assert!(clock.check().is_ok());
        std::thread::sleep(Duration::from_millis(80));
        let err = clock.check().expect_err("past the window").to_string();
        assert!(err.contains("last confirmed"), "{err}");
        clock.renew(Instant::now());
        assert!(clock.check().is_ok());
    }
}
