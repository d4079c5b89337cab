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

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use tokio::sync::watch;

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
    conn: Conn,
    lock_name: String,
    token: u64,
    /// Longest wait for the lease connection before it counts as lost.
    io_timeout: Duration,
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
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Option<Self>, RelayError> {
        let mut conn = outbox_relay_core::error::with_timeout(
            io_timeout,
            "connecting for the lease",
            Conn::new(opts),
        )
        .await??;
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
        let token = take_token(&mut conn, table, connector, owner).await?;
        tracing::info!(connector, lease_token = token, owner, "lease acquired");
        Ok(Some(Self {
            conn,
            lock_name,
            token,
            io_timeout,
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
            conn,
            lock_name,
            token,
            io_timeout,
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
        let check = self.conn.exec_first(
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
            Ok(Some(Some(1))) => Ok(()),
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

    /// Releases the lock (also released by the server when the process dies).
    pub async fn release(mut self) {
        let _ = self
            .conn
            .exec_drop("DO RELEASE_LOCK(?)", (&self.lock_name,))
            .await;
        let _ = self.conn.disconnect().await;
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
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", std::process::id())
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
}
