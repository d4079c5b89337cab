//! Preparing one run: the server's checks, the resume point (the stored checkpoint, or the
//! current end of the binlog on a first start) and how to ask the server for it.

use std::time::Duration;

use outbox_relay_mysql::Pool;

use outbox_relay_core::config::{RelayConfig, ResumeMode};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::state::checkpoint::{Checkpoint, CheckpointStore};
use outbox_relay_mysql::binlog::source::StartFrom;
use outbox_relay_mysql::preflight::ServerInfo;
use outbox_relay_mysql::state::store::MysqlCheckpointStore;

use outbox_relay_mysql::binlog::source;
use outbox_relay_mysql::preflight;

/// Checks the server and finds where to start: the in-memory resume point, else the stored
/// checkpoint, else the current end of the binlog (stored at once, so rows committed from now on
/// are relayed even if the relay dies before its first record).
pub(super) async fn prepare(
    config: &RelayConfig,
    pool: &Pool,
    store: &MysqlCheckpointStore,
    resume: Option<Checkpoint>,
) -> Result<(ServerInfo, Checkpoint, StartFrom), RelayError> {
    let mut conn = pool.get_conn().await?;
    let server = preflight::check_server(&mut conn).await?;
    preflight::check_outbox_tables(&mut conn, &config.table_mappings()?).await?;
    store.verify().await?;
    if !server.row_metadata_full && !store.stores_layouts() {
        return Err(RelayError::Prerequisite {
            setting: "binlog_row_metadata".into(),
            expected: "FULL (column names in the binlog), or a checkpoint table that can store \
                       the outbox tables' column layouts"
                .into(),
            found: format!(
                "no column names in table maps, and {} has no table_layouts column",
                store.table()
            ),
            fix: format!(
                "SET GLOBAL binlog_row_metadata=FULL (MySQL 8.0.1+, MariaDB 10.5+), or apply \
                 migrations/0003_checkpoint_layouts.sql to {} so the relay can follow the \
                 layouts itself",
                store.table()
            ),
        });
    }
    // Our own previous dump connection may still be registered until the server notices it is
    // gone (at its next heartbeat).
    let grace = Duration::from_millis(config.mysql.heartbeat_interval_ms * 2 + 1000);
    preflight::check_server_id_unique(
        &mut conn,
        &server,
        config.mysql.server_id,
        &source::report_host(&config.connector_name),
        grace,
    )
    .await?;
    let start = match resume {
        Some(resume) => resume,
        None => match store.load().await? {
            Some(stored) => {
                tracing::info!(position = %stored.position, rows_acked = stored.rows_acked,
                    gtid = ?stored.gtid_set, "resuming from stored checkpoint");
                stored
            }
            None => {
                let start = first_start(config, &mut conn, &server).await?;
                store.save(&start).await?;
                tracing::info!(position = %start.position, gtid = ?start.gtid_set,
                    "no checkpoint: starting at the current end of the binlog");
                start
            }
        },
    };
    let mut start = start;
    if !server.row_metadata_full && start.table_layouts.is_none() {
        // A checkpoint moved by `reset` or by hand carries no layouts: today's are the best
        // known, right unless an outbox table's columns changed after the checkpoint.
        start.table_layouts =
            preflight::current_layouts(&mut conn, &config.outbox_tables()).await?;
        tracing::warn!(position = %start.position,
            "the checkpoint carries no outbox table layouts (moved by reset or by hand) and table \
             maps carry no column names: using the tables' current columns from \
             information_schema. If an outbox table's columns changed after this position, move \
             the checkpoint past that change (or SET GLOBAL binlog_row_metadata=FULL)");
    }
    let from = start_from(config.mysql.resume, &server, &start)?;
    match &from {
        StartFrom::Position(p) => {
            preflight::check_position_available(&mut conn, server.flavor, p).await?;
        }
        StartFrom::MysqlGtid(set) => {
            preflight::check_gtid_set_available(&mut conn, &set.to_string()).await?;
        }
        StartFrom::MariadbGtid(pos) => {
            preflight::check_mariadb_gtid_available(&mut conn, pos).await?;
        }
    }
    Ok((server, start, from))
}

/// The current end of the binlog as a resume point (with the GTID state there and the outbox
/// tables' layouts): where a connector without a checkpoint starts.
async fn first_start(
    config: &RelayConfig,
    conn: &mut outbox_relay_mysql::Conn,
    server: &ServerInfo,
) -> Result<Checkpoint, RelayError> {
    let (position, executed, table_layouts) =
        preflight::position_with_layouts(conn, server.flavor, &config.outbox_tables()).await?;
    let gtid_set = server.flavor.gtid_at(conn, &position, executed).await?;
    Ok(Checkpoint {
        position,
        rows_acked: 0,
        gtid_set,
        source_server_id: server.server_id,
        source_server_uuid: server.server_uuid.clone(),
        table_layouts,
    })
}

/// Exactly-once, before the producer is built: a connector without a checkpoint stores the
/// current end of the binlog in the state table now, as at-least-once does in [`prepare`], so
/// a first start that cannot reach Kafka (or whose transactions the brokers refuse) still
/// starts from this position once they work, instead of from the binlog's end then (which
/// would skip the rows committed meanwhile). Does nothing when a checkpoint is stored.
///
/// # Errors
/// [`RelayError::Mysql`] when the server cannot be queried or the checkpoint not written;
/// [`RelayError::Prerequisite`] from the server checks of [`preflight::check_server`].
pub(super) async fn store_first_start(
    config: &RelayConfig,
    pool: &Pool,
    store: &MysqlCheckpointStore,
) -> Result<(), RelayError> {
    store.verify().await?;
    if store.load().await?.is_some() {
        return Ok(());
    }
    let mut conn = pool.get_conn().await?;
    let server = preflight::check_server(&mut conn).await?;
    let start = first_start(config, &mut conn, &server).await?;
    store.save(&start).await?;
    tracing::info!(position = %start.position, gtid = ?start.gtid_set,
        "no checkpoint: the first start position (the current end of the binlog) is stored \
         before the transactional producer starts");
    Ok(())
}

/// Chooses how to resume from `start` under `mode`.
/// A checkpoint inside a transaction (`rows_acked` > 0) resumed by GTID on another server than
/// the one it was written on (a failover): its `rows_acked` becomes 0, so that transaction's
/// first rows are sent again rather than trusted.
///
/// Why: `rows_acked` counts rows of "the transaction after the GTID set", which is a fact of the
/// server the checkpoint was written on. Another server may log other transactions first (ones
/// the old replica's replication filters left out, other GTID domains) or may not have that
/// transaction at all (an asynchronous failover that lost it); skipping rows there could skip
/// rows that were never sent. Sending them twice is within at-least-once.
pub(super) fn forget_rows_acked_on_another_server(
    start: &mut Checkpoint,
    server: &ServerInfo,
    from: &StartFrom,
) {
    let by_gtid = matches!(from, StartFrom::MariadbGtid(_) | StartFrom::MysqlGtid(_));
    let other_server = start.source_server_id != server.server_id
        || matches!((&start.source_server_uuid, &server.server_uuid), (Some(a), Some(b)) if a != b);
    if by_gtid && other_server && start.rows_acked > 0 {
        tracing::warn!(
            rows_acked = start.rows_acked,
            checkpoint_server_id = start.source_server_id,
            server_id = server.server_id,
            "the checkpoint was written inside a transaction on another server: that \
             transaction cannot be matched here, so its first rows_acked rows are not skipped \
             and may be sent again (at-least-once; consumers deduplicate by event_key)"
        );
        start.rows_acked = 0;
    }
}

pub(super) fn start_from(
    mode: ResumeMode,
    server: &ServerInfo,
    start: &Checkpoint,
) -> Result<StartFrom, RelayError> {
    let bad = |e: String| RelayError::binlog(format!("the checkpoint's gtid_set: {e}"));
    let gtid = match start.gtid_set.as_deref() {
        Some(g) => Some(StartFrom::from(
            server
                .flavor
                .parse_gtid_state(g)
                .map_err(|e| bad(e.to_string()))?,
        )),
        None => None,
    };
    match (mode, gtid) {
        (ResumeMode::Position, _) | (ResumeMode::Auto, None) => {
            if start.source_server_id != server.server_id {
                tracing::warn!(
                    stored_server_id = start.source_server_id,
                    server_id = server.server_id,
                    "the checkpoint was written for another server; resuming from its file and \
                     position, which only makes sense on the same server (use GTIDs to move \
                     between servers)"
                );
            }
            Ok(StartFrom::Position(start.position.clone()))
        }
        (ResumeMode::Gtid | ResumeMode::Auto, Some(from)) => Ok(from),
        (ResumeMode::Gtid, None) => Err(RelayError::Config(
            "mysql.resume = \"gtid\" but the checkpoint has no gtid_set (MySQL needs \
             gtid_mode=ON)"
                .into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_acked_is_kept_only_on_the_checkpoints_own_server_or_by_position() {
        let server = |id: u32, uuid: Option<&str>| ServerInfo {
            flavor: outbox_relay_mysql::server::Flavor::MariaDb,
            version: "10.11".into(),
            server_id: id,
            server_uuid: uuid.map(str::to_owned),
            row_metadata_full: true,
        };
        let checkpoint = |id: u32, uuid: Option<&str>| Checkpoint {
            position: outbox_relay_core::position::BinlogPosition::new("mariadb-bin.000007", 1234),
            rows_acked: 3,
            gtid_set: Some("0-1-50".into()),
            source_server_id: id,
            source_server_uuid: uuid.map(str::to_owned),
            table_layouts: None,
        };
        let by_gtid = StartFrom::MariadbGtid("0-1-50".parse().expect("gtid"));
        let by_position = StartFrom::Position(outbox_relay_core::position::BinlogPosition::new(
            "mariadb-bin.000007",
            1234,
        ));
        let after = |cp: Checkpoint, s: &ServerInfo, from: &StartFrom| {
            let mut cp = cp;
            forget_rows_acked_on_another_server(&mut cp, s, from);
            cp.rows_acked
        };
        // The same server: the transaction after the GTID set is the one counted.
        assert_eq!(after(checkpoint(2, None), &server(2, None), &by_gtid), 3);
        // Another server (a failover): not trusted.
        assert_eq!(after(checkpoint(2, None), &server(1, None), &by_gtid), 0);
        // Same server_id but another server_uuid (MySQL): not trusted either.
        assert_eq!(
            after(checkpoint(2, Some("a")), &server(2, Some("b")), &by_gtid),
            0
        );
        // By position the file and offset name the transaction: kept (and checked by the run).
        assert_eq!(
            after(checkpoint(2, None), &server(1, None), &by_position),
            3
        );
    }
}
