//! Test support for `outbox-relay`: end-to-end tests against the real MariaDB and Kafka that run
//! on the test machine (`tests/services/mariadb.sh up`, `tests/services/kafka.sh up`).
//!
//! Every test isolates itself so that tests can run in parallel against the one shared server
//! and broker:
//!
//! * its own database ([`TestDb::create`], both migrations applied from the repository's
//!   `migrations/` folder),
//! * its own topic prefix and connector name ([`unique_suffix`]),
//! * its own replica `server_id` ([`next_server_id`]).
//!
//! Tests synchronise only on observable state, with timeouts ([`wait_until`],
//! [`wait_for_checkpoint_row`], [`collect_records`], …), never on fixed sleeps.
//!
//! Connection settings come from the environment: `MARIADB_PORT` (default 3306) and
//! `KAFKA_PORT` (default 9092), the same variables the service scripts honour.
//!
//! The crates the helpers speak in are re-exported ([`mysql_async`], [`rdkafka`]) so a test can
//! name their types without depending on a different version.

pub mod audit;
pub mod binlog;
#[cfg(test)]
mod binlog_tests;
pub mod checkpoint;
pub mod db;
pub mod debezium;
pub mod env;
pub mod http;
pub mod kafka;
pub mod outbox;
pub mod per_server;
pub mod relay;
pub mod relay_bin;
pub mod script;
pub mod unique;
pub mod wait;
pub mod watchdog;

pub use mysql_async;
pub use rdkafka;
pub use relay_bin::relay_bin;
pub use watchdog::Watchdog;

pub use binlog::{
    binary_logs, binlog_event_ending_at, binlog_events_from, compare_positions,
    current_binlog_position, is_transaction_boundary, BinlogEvent, BinlogPosition,
};
pub use checkpoint::{
    read_checkpoint, wait_for_checkpoint_row, Checkpoint, DEFAULT_CHECKPOINT_TABLE,
};
pub use db::{GlobalVariableGuard, TestDb};
pub use env::{
    jaeger_otlp_endpoint, jaeger_query_port, kafka_bootstrap, kafka_port, mysql_port, mysql_url,
    test_server, TestServer,
};
pub use http::{http_get, metric, source_metric, wait_for_status};
pub use kafka::{
    collect_records, collect_until, create_topic, deleted_record_count, high_watermark_total,
    list_topics, read_all_records, read_committed_records, Record,
};
pub use outbox::{
    epoch_micros_to_datetime6, insert_outbox_rows, recent_created_at_base, InsertStyle, OutboxRow,
};
pub use per_server::{
    canonical_gtid_set, column_type_as_shown, gtid_of_event, gtid_set_at, gtid_state_includes,
    gtid_state_variable, integer_sequence, replica_port, replica_script, server_json_text,
    stored_payload, stored_payloads, unreached_gtid_state, xa_statement_gtid, xid_literal,
};
pub use relay::{describe_exit, free_local_port, RelayConfigSpec, RelayProcess};
pub use unique::{next_server_id, unique_suffix};
pub use wait::wait_until;

// Resume, lease and dead-letter tests (tests/resume_e2e.rs, tests/server_globals.rs).
pub mod binlog_scan;
pub mod state;
pub use binlog_scan::{
    binlog_transactions, count_other_transactions, count_table_writes, find_transaction,
    global_variable, last_gtid, names_table, newest_binlog_file, scan_binlog,
    write_rows_event_ending_at, BinlogTransaction, TransactionTables,
};
pub use relay::wait_for_stderr;
pub use state::{crc32, lease_lock_name, read_state_row, StateRow};
pub mod fixture;
pub use fixture::{
    all_seen, commit_rows, connection_state, describe_record, ensure_at_least_once,
    ensure_boundary, ensure_exactly_once, ensure_per_key_order, event_key_counts, expect_exit_code,
    registered_replica_ids, RowGen, World,
};

// Fault injection (tests/failover.rs, tests/faults.rs, the `faults` binary, `make faults`).
pub mod faults;
pub mod proxy;
pub use proxy::{ConnectionInfo, KafkaFault, TcpProxy, Trip, END_TXN};

// Private servers started by a test binary itself (tests/security_e2e.rs): a MariaDB with TLS,
// a Kafka with SASL/SCRAM, and test certificates.
pub mod private;
pub use private::{PrivateService, ServiceSpec, TestPki};
