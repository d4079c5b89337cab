//! The names of the relay's metrics, served at `/metrics` by [`super::metrics::Metrics`]. They
//! are the relay's external contract (dashboards, alerts and docs/src/operations/metrics.md use
//! them): every metric is registered under one of these constants, and [`ALL`] lists them
//! (a unit test checks that the registry holds exactly these). The help texts, buckets and
//! label values are in [`super::metrics`]. Every series of a source's metrics also carries the
//! label `source` (its connector name); `outbox_relay_build_info`,
//! `outbox_relay_config_reloads_total` and `outbox_relay_fleet_joined` are the process's and
//! have none.

/// Gauge, always 1; label `version`: the outbox-relay version. A process metric: no `source`
/// label.
pub const BUILD_INFO: &str = "outbox_relay_build_info";

/// Counter (reloads), label `result` (`applied`, `failed`): reloads of a many-source
/// configuration. A process metric: no `source` label.
pub const CONFIG_RELOADS: &str = "outbox_relay_config_reloads_total";

/// Gauge, no labels, only with `[fleet]`: 1 while the process is a member of its fleet's
/// consumer group (assigned its share, possibly empty), 0 while it joins or rejoins. A process
/// metric: no `source` label.
pub const FLEET_JOINED: &str = "outbox_relay_fleet_joined";

/// Gauge, no labels: 1 while the source is stopped on an error retrying cannot fix.
pub const SOURCE_FAILED: &str = "outbox_relay_source_failed";

/// Counter (events), no labels: binlog events read from the source, heartbeats not included.
pub const BINLOG_EVENTS_READ: &str = "outbox_relay_binlog_events_read_total";

/// Counter (heartbeats), no labels: heartbeats the source sent while it had no events to send.
pub const BINLOG_HEARTBEATS: &str = "outbox_relay_binlog_heartbeats_total";

/// Counter (delivery reports), no labels: successes reported without an offset (the broker
/// answered `DUPLICATE_SEQUENCE_NUMBER`); not trusted, the records are sent again.
pub const UNPROVEN_ACKS: &str = "outbox_relay_unproven_acks_total";

/// Counter (acknowledgements), label `result` (`stored`, `missing`): first acknowledgements of
/// partitions new to the process, read back from the log before the checkpoint passes them.
pub const READ_BACKS: &str = "outbox_relay_read_backs_total";

/// Counter (rows), label `table` (`database.table`): inserted outbox rows read from the binlog
/// and handed to the producer.
pub const OUTBOX_ROWS_READ: &str = "outbox_relay_outbox_rows_read_total";

/// Counter (records), label `topic` (the first 100 topics, then `_other`): records of outbox
/// rows acknowledged by Kafka (dead letters not included).
pub const RECORDS_PRODUCED: &str = "outbox_relay_records_produced_total";

/// Counter (bytes), label `topic`: key, value and header bytes of the records counted by
/// [`RECORDS_PRODUCED`].
pub const BYTES_PRODUCED: &str = "outbox_relay_bytes_produced_total";

/// Counter (rows), label `kind` (`decode`, `route`, `producer`, `broker`): rows sent to the
/// dead-letter topic, by why.
pub const RECORDS_DEAD_LETTERED: &str = "outbox_relay_records_dead_lettered_total";

/// Gauge (records), no labels: records produced and not yet acknowledged by Kafka.
pub const RECORDS_IN_FLIGHT: &str = "outbox_relay_records_in_flight";

/// Gauge (sequence number), no labels: the stored checkpoint's binlog file
/// (`mariadb-bin.000042` is 42).
pub const CHECKPOINT_BINLOG_FILE_SEQUENCE: &str = "outbox_relay_checkpoint_binlog_file_sequence";

/// Gauge (bytes), no labels: the stored checkpoint's offset in its binlog file.
pub const CHECKPOINT_BINLOG_POSITION: &str = "outbox_relay_checkpoint_binlog_position_bytes";

/// Gauge (seconds), no labels: since the stored checkpoint was last known to include every
/// acknowledged record. Computed at scrape time.
pub const CHECKPOINT_AGE: &str = "outbox_relay_checkpoint_age_seconds";

/// Counter (writes), no labels: checkpoint rows written to the state table.
pub const CHECKPOINT_WRITES: &str = "outbox_relay_checkpoint_writes_total";

/// Counter (records), no labels: records sent with the transaction's commit time because their
/// topic would refuse their `created_at` (`timestamp_refused = "commit"`).
pub const TIMESTAMP_FALLBACKS: &str = "outbox_relay_timestamp_fallbacks_total";

/// Gauge (records), label `table` (`database.table`, capped as for [`OUTBOX_ROWS_READ`]):
/// records held because their topic is refused (`dead_letter.refused_topic = "hold"`), not
/// produced yet.
pub const HELD_RECORDS: &str = "outbox_relay_held_records";

/// Counter (holds), no labels: outbox tables held because the brokers refused a record's topic
/// (`dead_letter.refused_topic = "hold"`).
pub const HOLDS_STARTED: &str = "outbox_relay_holds_started_total";

/// Counter (retries), no labels: retries of held tables (each asks the brokers about the
/// topic again or, for a topic refused only when written to, sends the first held record alone
/// with a producer of its own).
pub const HOLD_RETRIES: &str = "outbox_relay_hold_retries_total";

/// Counter (rows), no labels: outbox rows not produced because `[cutover]` says the previous
/// relay already sent them.
pub const CUTOVER_SKIPPED: &str = "outbox_relay_cutover_skipped_total";

/// Counter (queries), no labels: queries of `cutover.skip_if` against an outbox table.
pub const CUTOVER_CHECKS: &str = "outbox_relay_cutover_checks_total";

/// Gauge (seconds), no labels: how far behind the source the relay reads (1 s resolution).
/// Computed at scrape time.
pub const LAG: &str = "outbox_relay_lag_seconds";

/// Gauge (0 or 1), no labels: 1 while the binlog stream is connected.
pub const SOURCE_CONNECTED: &str = "outbox_relay_source_connected";

/// Histogram (seconds), no labels: per produced record, from its binlog event's timestamp to
/// Kafka's acknowledgement (up to 1 s too high: whole-second timestamps).
pub const BINLOG_TO_ACK: &str = "outbox_relay_binlog_to_ack_seconds";

/// Histogram (seconds), no labels: per produced record, from reading its row in the relay to
/// Kafka's acknowledgement.
pub const READ_TO_ACK: &str = "outbox_relay_read_to_ack_seconds";

/// Counter (reconnections), label `cause` (`mysql`, `kafka`, `lease`): reconnections after a
/// failure.
pub const RECONNECTS: &str = "outbox_relay_reconnects_total";

/// Counter (errors), label `kind` (the `RelayError` variant in snake case): errors that ended a
/// run.
pub const ERRORS: &str = "outbox_relay_errors_total";

/// Counter (transactions), no labels, exactly-once: Kafka transactions committed.
pub const TRANSACTIONS_COMMITTED: &str = "outbox_relay_transactions_committed_total";

/// Counter (transactions), no labels, exactly-once: Kafka transactions aborted.
pub const TRANSACTIONS_ABORTED: &str = "outbox_relay_transactions_aborted_total";

/// Histogram (seconds), no labels, exactly-once: from a transaction's first record to its
/// commit.
pub const TRANSACTION_DURATION: &str = "outbox_relay_transaction_duration_seconds";

/// Histogram (seconds), no labels, exactly-once: the commit call (EndTxn) itself.
pub const TRANSACTION_COMMIT: &str = "outbox_relay_transaction_commit_seconds";

/// Histogram (records), no labels, exactly-once: records (dead letters included) per committed
/// transaction.
pub const TRANSACTION_RECORDS: &str = "outbox_relay_transaction_records";

/// Gauge (seconds), no labels, exactly-once: how long the current Kafka transaction has been
/// open (0 when none is). Computed at scrape time.
pub const TRANSACTION_OPEN: &str = "outbox_relay_transaction_open_seconds";

/// Gauge (records), no labels, exactly-once: high watermark minus last stable offset, summed
/// over the partitions the relay writes. Sampled.
pub const LAST_STABLE_OFFSET_LAG: &str = "outbox_relay_last_stable_offset_lag_records";

/// Gauge (seconds), no labels, exactly-once: the longest time a last stable offset of those
/// partitions has not moved while records follow it. Sampled.
pub const LAST_STABLE_OFFSET_STUCK: &str = "outbox_relay_last_stable_offset_stuck_seconds";

/// Every metric name above, each once.
pub const ALL: &[&str] = &[
    CONFIG_RELOADS,
    FLEET_JOINED,
    SOURCE_FAILED,
    BUILD_INFO,
    BINLOG_EVENTS_READ,
    BINLOG_HEARTBEATS,
    UNPROVEN_ACKS,
    READ_BACKS,
    OUTBOX_ROWS_READ,
    RECORDS_PRODUCED,
    BYTES_PRODUCED,
    RECORDS_DEAD_LETTERED,
    RECORDS_IN_FLIGHT,
    CHECKPOINT_BINLOG_FILE_SEQUENCE,
    CHECKPOINT_BINLOG_POSITION,
    CHECKPOINT_AGE,
    CHECKPOINT_WRITES,
    TIMESTAMP_FALLBACKS,
    HELD_RECORDS,
    HOLDS_STARTED,
    HOLD_RETRIES,
    CUTOVER_SKIPPED,
    CUTOVER_CHECKS,
    LAG,
    SOURCE_CONNECTED,
    BINLOG_TO_ACK,
    READ_TO_ACK,
    RECONNECTS,
    ERRORS,
    TRANSACTIONS_COMMITTED,
    TRANSACTIONS_ABORTED,
    TRANSACTION_DURATION,
    TRANSACTION_COMMIT,
    TRANSACTION_RECORDS,
    TRANSACTION_OPEN,
    LAST_STABLE_OFFSET_LAG,
    LAST_STABLE_OFFSET_STUCK,
];
