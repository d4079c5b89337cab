//! An infrastructure error is not a failed attempt (`inbox/CONTRACT.md`, "Attempts and
//! outages"), against the real database (`OUTBOX_TEST_SERVER`, a database of its own per test)
//! and Kafka. The database is made unreachable through a TCP proxy of the test's own (the shared
//! server keeps running): the proxy's listener is closed and its connections cut, then it listens
//! again on the same port.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Pool, Transaction};
use outbox_inbox::{
    is_infrastructure_error, Handler, HandlerError, Inbox, InboxConfig, InboxConsumer, InboxError,
    InboxRecord,
};
use outbox_relay_testkit::db::migrations_dir;
use outbox_relay_testkit::kafka::{create_topic, high_watermark_total};
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::rdkafka::consumer::{BaseConsumer, Consumer};
use outbox_relay_testkit::rdkafka::message::{Header, OwnedHeaders};
use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_relay_testkit::rdkafka::{Offset, TopicPartitionList};
use outbox_relay_testkit::unique::unique_suffix;
use outbox_relay_testkit::{kafka_bootstrap, wait_until, TestDb};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// Forwards a local port to the database server. [`DbProxy::down`] closes the listener (new
/// connections are refused) and cuts the open connections; [`DbProxy::up`] listens again on the
/// same port.
struct DbProxy {
    addr: SocketAddr,
    target: String,
    listener: Mutex<Option<JoinHandle<()>>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl DbProxy {
    async fn start(target: String) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let proxy = DbProxy {
            addr: listener.local_addr()?,
            target,
            listener: Mutex::new(None),
            conns: Arc::new(Mutex::new(Vec::new())),
        };
        proxy.serve(listener)?;
        Ok(proxy)
    }

    fn serve(&self, listener: TcpListener) -> Result<()> {
        let (target, conns) = (self.target.clone(), self.conns.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let target = target.clone();
                let pump = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                if let Ok(mut c) = conns.lock() {
                    c.push(pump);
                }
            }
        });
        *self.listener.lock().map_err(|_| anyhow::anyhow!("lock"))? = Some(task);
        Ok(())
    }

    /// Closes the listener and every open connection; waits until the port refuses.
    async fn down(&self) -> Result<()> {
        let listener = self
            .listener
            .lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .take();
        if let Some(task) = listener {
            task.abort();
            let _ = task.await;
        }
        let pumps: Vec<_> = self
            .conns
            .lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .drain(..)
            .collect();
        for pump in pumps {
            pump.abort();
        }
        wait_until("the proxy port to refuse", TIMEOUT, POLL, async || {
            Ok(TcpStream::connect(self.addr).await.is_err().then_some(()))
        })
        .await
    }

    /// Listens again on the same port.
    async fn up(&self) -> Result<()> {
        let listener = wait_until("the proxy port to bind again", TIMEOUT, POLL, async || {
            Ok(TcpListener::bind(self.addr).await.ok())
        })
        .await?;
        self.serve(listener)
    }
}

/// A database with the inbox tables and `coupons`, reached through a [`DbProxy`]; a source topic
/// and a dead-letter topic; a consumer group.
struct World {
    db: TestDb,
    proxy: DbProxy,
    pool: Pool,
    topic: String,
    dlq: String,
    group: String,
    bootstrap: String,
    producer: FutureProducer,
}

impl World {
    async fn new() -> Result<Self> {
        let db = TestDb::create("inbox_outage").await?;
        let mut conn = db.conn().await?;
        conn.query_drop(std::fs::read_to_string(
            migrations_dir().join("0004_inbox.sql"),
        )?)
        .await?;
        conn.query_drop(
            "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_key VARCHAR(255))",
        )
        .await?;
        let opts = Opts::from_url(&db.url())?;
        let proxy =
            DbProxy::start(format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port())).await?;
        // prefer_socket(false): through the proxy, never the server's Unix socket.
        let pool = Pool::new(
            OptsBuilder::from_opts(opts)
                .tcp_port(proxy.addr.port())
                .prefer_socket(false),
        );
        let suffix = unique_suffix();
        let bootstrap = kafka_bootstrap();
        let (topic, dlq) = (
            format!("inbox-rust-outage-{suffix}"),
            format!("inbox-rust-outage-{suffix}.dlq"),
        );
        create_topic(&bootstrap, &topic, 1_000_000).await?;
        create_topic(&bootstrap, &dlq, 1_000_000).await?;
        let producer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("acks", "all")
            .create()?;
        Ok(World {
            db,
            proxy,
            pool,
            topic,
            dlq,
            group: format!("inbox-rust-outage-{suffix}"),
            bootstrap,
            producer,
        })
    }

    /// Produces records `from..to` (key `order-i`, header `event_key` = `e-i`) and waits for them.
    async fn produce(&self, from: usize, to: usize) -> Result<()> {
        for i in from..to {
            let (key, event_key) = (format!("order-{i}"), format!("e-{i}"));
            let headers = OwnedHeaders::new().insert(Header {
                key: "event_key",
                value: Some(event_key.as_str()),
            });
            self.producer
                .send(
                    FutureRecord::to(&self.topic)
                        .key(&key)
                        .payload("{}")
                        .headers(headers),
                    TIMEOUT,
                )
                .await
                .map_err(|(e, _)| e)?;
        }
        Ok(())
    }

    /// A consumer of the group running in a task, with `config`'s outage budget and attempts.
    fn start(&self, config: InboxConfig) -> Result<Running> {
        let inbox = Inbox::new(self.pool.clone(), config, &self.bootstrap)?;
        let mut kafka = ClientConfig::new();
        kafka
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", &self.group)
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000");
        let consumer = InboxConsumer::with_config(kafka, &[&self.topic], inbox, Coupons)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(consumer.run(async move {
            let _ = stopped.await;
        }));
        Ok(Running { stop, task })
    }

    fn config(&self) -> InboxConfig {
        let mut config = InboxConfig::new("outage", &self.dlq);
        config.max_attempts = 3;
        config.backoff_initial = Duration::from_millis(10);
        config.backoff_max = Duration::from_millis(20);
        config
    }

    /// The group's committed offset of partition 0 (`None`: nothing committed).
    async fn committed(&self) -> Result<Option<i64>> {
        let (bootstrap, group, topic) = (
            self.bootstrap.clone(),
            self.group.clone(),
            self.topic.clone(),
        );
        tokio::task::spawn_blocking(move || -> Result<Option<i64>> {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("group.id", &group)
                .create()?;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, 0);
            let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
            Ok(
                match committed.find_partition(&topic, 0).map(|p| p.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                },
            )
        })
        .await?
    }

    async fn wait_committed(&self, offset: i64) -> Result<()> {
        wait_until(
            &format!("offset {offset} committed"),
            TIMEOUT,
            POLL,
            async || Ok((self.committed().await? == Some(offset)).then_some(())),
        )
        .await
    }

    /// Every record `0..n` had its business effect exactly once, and nothing else did.
    async fn assert_effects_once(&self, n: usize) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let rows: Vec<(String, u64)> = conn
            .query("SELECT event_key, COUNT(*) FROM coupons GROUP BY event_key ORDER BY event_key")
            .await?;
        let mut want: Vec<(String, u64)> = (0..n).map(|i| (format!("e-{i}"), 1)).collect();
        want.sort();
        assert_eq!(rows, want, "coupons per event_key");
        Ok(())
    }

    async fn dead_letters(&self) -> Result<u64> {
        high_watermark_total(&self.bootstrap, std::slice::from_ref(&self.dlq)).await
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), InboxError>>,
}

impl Running {
    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        Ok(self.task.await??)
    }
}

/// One coupon per record, in the inbox transaction.
struct Coupons;

impl Handler for Coupons {
    async fn handle(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
    ) -> Result<(), HandlerError> {
        tx.exec_drop(
            "INSERT INTO coupons (event_key) VALUES (?)",
            (record.header_str("event_key").unwrap_or_default(),),
        )
        .await?;
        Ok(())
    }
}

/// The database is unreachable for far longer than max_attempts × backoff (3 attempts, waits of
/// 10 and 20 ms) while records arrive; once it is back every record is processed once, none is
/// dead-lettered, and the offsets are committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_not_a_failed_attempt() -> Result<()> {
    let w = World::new().await?;
    let running = w.start(w.config())?;
    w.produce(0, 3).await?;
    w.wait_committed(3).await?;

    w.proxy.down().await?;
    w.produce(3, 8).await?;
    // The outage itself lasts a fixed time (the stimulus, not a wait for a result): 2 s, about
    // 70 times the old retry budget.
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(w.committed().await?, Some(3), "committed during the outage");
    w.proxy.up().await?;

    w.wait_committed(8).await?;
    running.stop().await?;
    w.assert_effects_once(8).await?;
    assert_eq!(w.dead_letters().await?, 0, "dead letters");
    Ok(())
}

/// An outage longer than the outage budget stops the consumer with `InboxError::Outage`,
/// nothing past the last processed record committed; a restarted consumer processes the rest
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_budget_stops_the_consumer() -> Result<()> {
    let w = World::new().await?;
    let mut config = w.config();
    config.outage_budget = Duration::from_secs(1);
    let running = w.start(config)?;
    w.produce(0, 3).await?;
    w.wait_committed(3).await?;

    w.proxy.down().await?;
    w.produce(3, 6).await?;
    let ended = tokio::time::timeout(TIMEOUT, running.task)
        .await
        .context("the consumer did not stop after an outage longer than its budget")??;
    match &ended {
        Err(
            e @ InboxError::Outage {
                topic,
                partition: 0,
                offset: 3,
                ..
            },
        ) if topic == &w.topic => {
            assert!(e.to_string().contains("outage budget"), "{e}");
        }
        other => panic!("the consumer ended with {other:?}, want InboxError::Outage at offset 3"),
    }
    assert_eq!(w.committed().await?, Some(3), "committed after the outage");
    w.proxy.up().await?;

    let restarted = w.start(w.config())?;
    w.wait_committed(6).await?;
    restarted.stop().await?;
    w.assert_effects_once(6).await?;
    assert_eq!(w.dead_letters().await?, 0, "dead letters");
    Ok(())
}

/// The classification seen from a handler: an error passed on with `?` keeps its source.
#[test]
fn a_handler_error_wrapping_a_lost_connection_is_infrastructure() {
    let lost = mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed);
    let handler_error: HandlerError = Box::new(lost);
    assert!(is_infrastructure_error(handler_error.as_ref()));
}
