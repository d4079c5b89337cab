//! `outbox-relay reset --to …`: moves the connector's checkpoint row.
//!
//! The new position is always one the server has (a file of `SHOW BINARY LOGS`, not past its
//! end) and a transaction boundary; `rows_acked` becomes 0 and `gtid_set` the GTID state there
//! (MariaDB: `BINLOG_GTID_POS(file, pos)`; MySQL: read from the binlog; a GTID target is kept as
//! given). Without `--yes` nothing is written (exit code [`super::EXIT_NOT_CONFIRMED`]). With it,
//! the command takes the connector's lease first ([`Lease::try_acquire`]; refused while a relay
//! holds it) — which bumps `lease_token`, so an instance that lost its lease can never write
//! over the reset — writes the row fenced by that token, and releases the lease. In
//! exactly-once mode it also commits the new point to the progress topic (where such runs
//! resume from) with the connector's transactional producer, before releasing the lease.
//!
//! A TIMESTAMP target is resolved by reading the binlog through a dump connection (as replica
//! `mysql.server_id`): whole files are skipped by their creation time (the timestamp of their
//! format description event), then the transactions of the remaining files are read and the
//! target is the boundary before the first transaction whose commit event (Xid or COMMIT) has a
//! timestamp at or after the given time — the same rule as `replay --start-datetime`. When no
//! transaction committed at or after it yet, the target is the current end.

use std::fmt;
use std::time::Duration;

use mysql_async::Pool;

use super::scan;
use super::{binary_logs, lease_holder, read_state_row, StateRow};
use outbox_relay_core::config::{Delivery, RelayConfig, TableName};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::position::gtid::MysqlGtidSet;
use outbox_relay_core::position::{BinlogPosition, MariadbGtidPos};
use outbox_relay_core::sink::RecordSink;
use outbox_relay_core::state::checkpoint::{Checkpoint, CheckpointStore};
use outbox_relay_kafka::sink::TransactionalSink;
use outbox_relay_mysql::preflight::{self, ServerInfo};
use outbox_relay_mysql::state::lease::Lease;
use outbox_relay_mysql::state::store::MysqlCheckpointStore;

/// Where `--to` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The start of the oldest binlog file the server has.
    Earliest,
    /// The server's current end of binlog.
    Latest,
    /// A binlog position (`FILE:POS`); must be a transaction boundary.
    Position(BinlogPosition),
    /// A GTID position (MariaDB `0-1-42,…`) or GTID set (MySQL `uuid:1-42,…`).
    Gtid(String),
    /// A time, seconds since the epoch (UTC).
    Time(i64),
}

impl std::str::FromStr for Target {
    type Err = RelayError;

    /// `earliest`, `latest`, `YYYY-MM-DD HH:MM:SS` (UTC), `FILE:POS` (a file name with a
    /// numeric extension, as `SHOW BINARY LOGS` lists them), a MariaDB GTID position or a MySQL
    /// GTID set, tried in that order.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("earliest") {
            return Ok(Self::Earliest);
        }
        if t.eq_ignore_ascii_case("latest") {
            return Ok(Self::Latest);
        }
        if let Ok(secs) = outbox_relay_mysql::binlog::replay::parse_datetime(t) {
            return Ok(Self::Time(secs));
        }
        if let Ok(p) = t.parse::<BinlogPosition>() {
            let numeric_ext = p
                .file
                .rsplit_once('.')
                .is_some_and(|(_, ext)| !ext.is_empty() && ext.bytes().all(|b| b.is_ascii_digit()));
            if numeric_ext {
                return Ok(Self::Position(p));
            }
        }
        if let Ok(g) = t.parse::<MariadbGtidPos>() {
            if !g.is_empty() {
                return Ok(Self::Gtid(g.to_string()));
            }
        }
        if let Ok(g) = t.parse::<MysqlGtidSet>() {
            if !g.is_empty() {
                return Ok(Self::Gtid(g.to_string()));
            }
        }
        Err(RelayError::Argument(format!(
            "--to {s:?}: expected earliest, latest, FILE:POS (mariadb-bin.000042:1234), a GTID \
             position (MariaDB 0-1-42) or set (MySQL 3e11fa47-71ca-11e1-9e33-c80aa9429562:1-42), \
             or a time \"YYYY-MM-DD HH:MM:SS\" (UTC)"
        )))
    }
}

/// What `reset` does (or would do).
#[derive(Debug, Clone)]
pub struct ResetReport {
    /// `connector_name`.
    pub connector: String,
    /// The checkpoint table.
    pub table: TableName,
    /// The row before the reset, if any.
    pub before: Option<StateRow>,
    /// The new position.
    pub position: BinlogPosition,
    /// The new `gtid_set`.
    pub gtid_set: Option<String>,
    /// How the position was found.
    pub how: String,
    /// `true` when the row was written.
    pub applied: bool,
    /// The lease token the write was fenced with.
    pub lease_token: Option<u64>,
    /// A forward move: the outbox rows it skips ([`scan::skipped_rows`]), or why they were not
    /// counted.
    pub skipped: Option<Result<scan::Skipped, String>>,
}

/// Resolves `target` and, with `yes`, writes it as `config`'s checkpoint.
///
/// # Errors
/// [`RelayError::Argument`] for a target the server does not have (purged, past a file's end,
/// not a transaction boundary, an unknown GTID); [`RelayError::Prerequisite`] while another
/// instance holds the lease or when the checkpoint table is missing; [`RelayError::Mysql`]
/// otherwise.
pub async fn reset(
    config: &RelayConfig,
    target: &Target,
    yes: bool,
) -> Result<ResetReport, RelayError> {
    let table = config.checkpoint_table()?;
    let connector = config.connector_name.clone();
    let pool = Pool::new(super::opts(config)?);
    let store = MysqlCheckpointStore::new(pool.clone(), table.clone(), connector.clone());
    store.verify().await?;
    let mut conn = super::connect(config).await?;
    let server = preflight::server_identity(&mut conn).await?;
    if let Some(holder) = lease_holder(&mut conn, &table, &connector).await? {
        return Err(lease_held(config, &mut conn, &table, Some(holder)).await);
    }
    let lease = if yes {
        Some(take_lease(config, &mut conn, &table, "reset").await?)
    } else {
        None
    };
    let before = read_state_row(&mut conn, &table, &connector).await?;
    let resolved = resolve(config, &mut conn, &server, target).await;
    let (position, gtid_set, how) = match resolved {
        Ok(r) => r,
        Err(e) => {
            if let Some(l) = lease {
                l.release().await;
            }
            return Err(e);
        }
    };
    let skipped = skipped(config, &mut conn, &server, before.as_ref(), &position).await;
    let mut report = ResetReport {
        connector,
        table,
        before,
        position,
        gtid_set,
        how,
        applied: false,
        lease_token: None,
        skipped,
    };
    if let Some(lease) = lease {
        let token = lease.token();
        let point = Checkpoint {
            position: report.position.clone(),
            rows_acked: 0,
            gtid_set: report.gtid_set.clone(),
            source_server_id: server.server_id,
            source_server_uuid: server.server_uuid.clone(),
            // The layouts at the new position are not known here: with
            // binlog_row_metadata=FULL none are needed, otherwise the relay takes the
            // current ones from information_schema at its next start.
            table_layouts: None,
        };
        write_point(config, &store, lease, &point).await?;
        report.applied = true;
        report.lease_token = Some(token);
    }
    let _ = conn.disconnect().await;
    let _ = pool.disconnect().await;
    Ok(report)
}

/// The outbox rows a move from `before`'s checkpoint forward to `to` skips; `None` when it is
/// no forward move.
async fn skipped(
    config: &RelayConfig,
    conn: &mut mysql_async::Conn,
    server: &ServerInfo,
    before: Option<&StateRow>,
    to: &BinlogPosition,
) -> Option<Result<scan::Skipped, String>> {
    let current = before?.checkpoint.as_ref()?;
    if current.position.partial_cmp(to) != Some(std::cmp::Ordering::Less) {
        return None;
    }
    if current.source_server_id != server.server_id {
        return Some(Err(format!(
            "the current checkpoint was written for server_id {}, not this server's {}",
            current.source_server_id, server.server_id
        )));
    }
    Some(
        scan::skipped_rows(config, conn, server, current, to)
            .await
            .map_err(|e| e.to_string()),
    )
}

/// Takes the connector's lease for an operator command (`command` names it in `lease_owner`),
/// refused while an instance holds it. Taking it bumps `lease_token`, so an instance that lost
/// its lease can never write over what the command writes under it.
///
/// # Errors
/// [`RelayError::Prerequisite`] naming the holder while the lease is held; [`RelayError::Mysql`]
/// otherwise.
pub(crate) async fn take_lease(
    config: &RelayConfig,
    conn: &mut mysql_async::Conn,
    table: &TableName,
    command: &str,
) -> Result<Lease, RelayError> {
    match Lease::try_acquire(
        super::opts(config)?,
        table,
        &config.connector_name,
        &format!(
            "{} (outbox-relay {command})",
            outbox_relay_mysql::state::lease::instance_name()
        ),
        Duration::from_millis(config.mysql.read_timeout_ms),
    )
    .await?
    {
        Ok(l) => Ok(l),
        Err(holder) => Err(lease_held(config, conn, table, holder).await),
    }
}

/// Writes `point` as the connector's checkpoint under `lease` (the state table row, fenced by
/// the lease token; in exactly-once mode also the progress topic, where such runs resume
/// from), then releases the lease, also when a write failed. Returns the lease token.
///
/// # Errors
/// The store's or the transactional producer's.
pub(crate) async fn write_point(
    config: &RelayConfig,
    store: &MysqlCheckpointStore,
    lease: Lease,
    point: &Checkpoint,
) -> Result<u64, RelayError> {
    let token = lease.token();
    let mut written = store.fenced(token).save(point).await;
    if written.is_ok() && config.kafka.delivery == Delivery::ExactlyOnce {
        // Exactly-once runs resume from the progress topic: the new point goes there too,
        // committed by the connector's own transactional producer while the command holds the
        // lease (which also ends any transaction a crashed relay left open).
        written = commit_progress(config, point).await;
    }
    lease.release().await;
    written.map(|()| token)
}

/// Commits `point` to the progress topic with the connector's transactional producer.
async fn commit_progress(config: &RelayConfig, point: &Checkpoint) -> Result<(), RelayError> {
    let sink = TransactionalSink::start(
        config,
        std::sync::Arc::new(outbox_relay_core::observe::metrics::Metrics::new()),
    )
    .await?;
    sink.commit(point).await
}

pub(crate) async fn lease_held(
    config: &RelayConfig,
    conn: &mut mysql_async::Conn,
    table: &TableName,
    holder: Option<u64>,
) -> RelayError {
    let owner = read_state_row(conn, table, &config.connector_name)
        .await
        .ok()
        .flatten()
        .and_then(|r| r.lease_owner)
        .unwrap_or_else(|| "unknown".into());
    RelayError::Prerequisite {
        setting: format!("lease of connector {:?}", config.connector_name),
        expected: "no running instance of this connector".into(),
        found: format!(
            "held by connection {} (lease_owner {owner})",
            holder.map_or_else(|| "?".into(), |h| h.to_string())
        ),
        fix:
            "stop every instance of this connector (SIGTERM), then run the command again; a relay \
              started while it runs waits for it"
                .into(),
    }
}

/// The position, GTID state and description of `target` on this server.
async fn resolve(
    config: &RelayConfig,
    conn: &mut mysql_async::Conn,
    server: &ServerInfo,
    target: &Target,
) -> Result<(BinlogPosition, Option<String>, String), RelayError> {
    let logs = binary_logs(conn).await?;
    let (Some((first, _)), Some(_)) = (logs.first(), logs.last()) else {
        return Err(RelayError::Prerequisite {
            setting: "SHOW BINARY LOGS".into(),
            expected: "at least one binlog file".into(),
            found: "none".into(),
            fix: "enable log_bin".into(),
        });
    };
    let available = || {
        let (lf, ls) = logs
            .last()
            .map(|(f, s)| (f.as_str(), *s))
            .unwrap_or(("", 0));
        format!("{first}:4 to {lf}:{ls}")
    };
    let flavor = server.flavor;
    let (end, executed) = preflight::current_position(conn, flavor).await?;
    match target {
        Target::Earliest => {
            let p = BinlogPosition::new(first.clone(), 4);
            let scanned = if flavor.gtid_state_from_binlog() {
                scan::check_boundary(config, flavor, &p).await?
            } else {
                None
            };
            let g = flavor.gtid_at(conn, &p, scanned).await?;
            Ok((
                p,
                g,
                "the start of the oldest binlog file (earliest)".into(),
            ))
        }
        Target::Latest => {
            // MySQL's binlog status row is not one snapshot: it prints Executed_Gtid_Set before
            // it reads the position (`show_master_status`, sql/rpl_source.cc), and a transaction's
            // GTID joins that set only at its commit stage, after its events are in the binlog.
            // Under concurrent commits the set can lack transactions before the position; the
            // binlog itself says exactly which GTIDs precede it.
            let scanned = if flavor.gtid_state_from_binlog() && executed.is_some() {
                scan::check_boundary(config, flavor, &end).await?
            } else {
                None
            };
            let g = flavor.gtid_at(conn, &end, scanned.or(executed)).await?;
            Ok((end, g, "the server's current end of binlog (latest)".into()))
        }
        Target::Position(p) => {
            match logs.iter().find(|(f, _)| *f == p.file) {
                None => {
                    return Err(RelayError::Argument(format!(
                        "the server no longer has (or never had) binlog file {:?}: purged, or \
                         the binlog history was reset. Available: {}",
                        p.file,
                        available()
                    )))
                }
                Some((_, size)) if p.pos > *size || p.pos < 4 => {
                    return Err(RelayError::Argument(format!(
                        "{p} is outside the file (its size is {size} bytes; events start at 4). \
                         Available: {}",
                        available()
                    )))
                }
                Some(_) => {}
            }
            let scanned = scan::check_boundary(config, flavor, p).await?;
            let g = flavor.gtid_at(conn, p, scanned).await?;
            Ok((
                p.clone(),
                g,
                "the given position (a transaction boundary)".into(),
            ))
        }
        Target::Gtid(g) => {
            let state = flavor.parse_gtid_state(g).map_err(|e| {
                RelayError::Argument(format!("--to {g:?} is not a {}: {e}", flavor.gtid_form()))
            })?;
            let current = flavor
                .current_gtid(conn, executed)
                .await?
                .and_then(|c| flavor.parse_gtid_state(&c).ok())
                .map(|c| c == state);
            let normalized = state.to_string();
            let p = if current == Some(true) {
                end
            } else {
                scan::gtid_start(config, flavor, &normalized).await?
            };
            Ok((
                p,
                Some(normalized),
                "where the server's binlog continues after the given GTIDs".into(),
            ))
        }
        Target::Time(t) => {
            // The last file created before the time: transactions in earlier files committed
            // before it was created.
            let mut start: Option<&str> = None;
            for (file, _) in logs.iter().rev() {
                let created = scan::file_created(config, flavor, file).await?;
                if i64::from(created) < *t {
                    start = Some(file);
                    break;
                }
                if file == first && i64::from(created) == *t {
                    start = Some(file);
                }
            }
            let Some(start) = start else {
                return Err(RelayError::Argument(format!(
                    "{} is before the oldest binlog file the server has ({first}): transactions \
                     from then on may have been purged. Use --to earliest to accept that gap",
                    super::format_utc(*t)
                )));
            };
            let from = BinlogPosition::new(start, 4);
            let (p, scanned, next) =
                scan::first_boundary_at(config, flavor, &from, &end, *t).await?;
            let g = flavor.gtid_at(conn, &p, scanned).await?;
            let how = match next {
                Some(c) => format!(
                    "the boundary before the first transaction committed at or after {} (it \
                     committed at {})",
                    super::format_utc(*t),
                    super::format_utc(i64::from(c))
                ),
                None => format!(
                    "the current end: no transaction committed at or after {} yet",
                    super::format_utc(*t)
                ),
            };
            Ok((p, g, how))
        }
    }
}

impl fmt::Display for ResetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "connector   {} (checkpoint table {})",
            self.connector, self.table
        )?;
        let old = self.before.as_ref().and_then(StateRow::position);
        match self.before.as_ref().and_then(|r| r.checkpoint.as_ref()) {
            Some(c) => writeln!(
                f,
                "current     {} (rows_acked {}, gtid {})",
                c.position,
                c.rows_acked,
                c.gtid_set.as_deref().unwrap_or("none")
            )?,
            _ => writeln!(f, "current     none")?,
        }
        writeln!(
            f,
            "new         {} (rows_acked 0, gtid {}): {}",
            self.position,
            self.gtid_set.as_deref().unwrap_or("none"),
            self.how
        )?;
        let effect = match old.as_ref().and_then(|o| o.partial_cmp(&self.position)) {
            Some(std::cmp::Ordering::Less) => {
                "moves FORWARD: outbox rows committed between the current and the new position \
                 will NOT be relayed"
            }
            Some(std::cmp::Ordering::Greater) => {
                "moves BACK: outbox rows committed between the new and the current position will \
                 be produced again (duplicates)"
            }
            Some(std::cmp::Ordering::Equal) => "same position (rows_acked becomes 0)",
            None => "the relay starts at the new position",
        };
        writeln!(f, "effect      {effect}")?;
        match &self.skipped {
            None => {}
            Some(Ok(s)) if s.rows == 0 && !s.partial => writeln!(
                f,
                "skipped     none: no outbox row lies between the current and the new position"
            )?,
            Some(Ok(s)) => {
                let more = if s.rows > s.first.len() as u64 {
                    format!(", the first {}", s.first.len())
                } else {
                    String::new()
                };
                writeln!(
                    f,
                    "skipped     {}{} outbox rows{}: {}",
                    if s.partial { "at least " } else { "" },
                    s.rows,
                    if s.partial {
                        " (counting stopped after 60 s)".to_owned()
                    } else {
                        more
                    },
                    s.first.join(", ")
                )?;
            }
            Some(Err(why)) => writeln!(f, "skipped     not counted: {why}")?,
        }
        if self.applied {
            write!(
                f,
                "done        checkpoint written under lease token {}",
                self.lease_token.unwrap_or(0)
            )
        } else {
            write!(
                f,
                "not applied: nothing changed (run again with --yes to write it)"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_in_order() {
        let t = |s: &str| s.parse::<Target>();
        assert_eq!(t("earliest").ok(), Some(Target::Earliest));
        assert_eq!(t("LATEST").ok(), Some(Target::Latest));
        assert_eq!(
            t("mariadb-bin.000042:1234").ok(),
            Some(Target::Position(BinlogPosition::new(
                "mariadb-bin.000042",
                1234
            )))
        );
        // 2026-01-02 03:04:05 UTC
        assert_eq!(
            t("2026-01-02 03:04:05").ok(),
            Some(Target::Time(1_767_323_045))
        );
        assert_eq!(
            t("1-2-5,0-1-42").ok(),
            Some(Target::Gtid("0-1-42,1-2-5".into()))
        );
        assert_eq!(
            t("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5").ok(),
            Some(Target::Gtid(
                "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5".into()
            ))
        );
        assert_eq!(
            t("3e11fa47-71ca-11e1-9e33-c80aa9429562:23").ok(),
            Some(Target::Gtid(
                "3e11fa47-71ca-11e1-9e33-c80aa9429562:23".into()
            ))
        );
        for bad in ["", "yesterday", "file:12", "bin.000001:x", "0-1"] {
            let e = t(bad).expect_err(bad).to_string();
            assert!(
                e.contains("expected earliest, latest, FILE:POS"),
                "{bad}: {e}"
            );
        }
    }
}
