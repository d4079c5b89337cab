//! Statements of QUERY events: the DDL parser (`ddl::parse`, `ddl::apply`, `ddl::mentions`),
//! the layout tracker that follows an outbox table through them (`schema::LayoutTracker`,
//! whose checkpoint JSON it also restores), ENUM/SET column types, and the decoder's XA
//! statement and XA_PREPARE event parsers.
//!
//! The first byte chooses the dialect (flavor, version, `sql_mode` quoting); the rest is the
//! statement. Errors are fine; panics are not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_relay_mysql::server::Flavor;
use outbox_relay_core::config::TableName;
use outbox_relay_mysql::decode::ddl::{self, Ddl, Dialect};
use outbox_relay_mysql::decode::schema::{enum_set_labels, LayoutTracker};
use outbox_relay_mysql::decode::xa::{parse_xa_statement, Xid};
use outbox_relay_core::position::BinlogPosition;

/// Server versions whose executable comments differ (`/*!80013 ... */`, `/*M!100500 ... */`).
const VERSIONS: [(Flavor, &str); 4] = [
    (Flavor::MariaDb, "10.11.9-MariaDB-log"),
    (Flavor::MariaDb, "11.4.3-MariaDB"),
    (Flavor::MySql, "8.0.36"),
    (Flavor::MySql, "8.4.0"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let statement = String::from_utf8_lossy(rest);
    let (flavor, version) = VERSIONS[usize::from(mode & 3)];
    let sql_mode = u64::from(mode & 4) | (u64::from(mode & 8) << 17);
    let dialect =
        Dialect::new(flavor, ddl::version_id(version).unwrap_or(0)).with_sql_mode(sql_mode);

    if let Ok(Ddl::AlterTable { ops, .. }) = ddl::parse(&statement, &dialect) {
        let mut columns: Vec<String> = ["id", "aggregate_type", "payload", "status"]
            .map(String::from)
            .to_vec();
        let _ = ddl::apply(&mut columns, &ops);
    }
    let _ = ddl::mentions(&statement, "outbox");
    let _ = ddl::version_id(&statement);
    let _ = enum_set_labels(&statement);
    let _ = parse_xa_statement(&statement);
    let _ = Xid::from_prepare_event(rest);

    // The tracker as the decoder drives it: a known layout, the server version, the statement.
    let outbox = TableName::parse("shop.outbox", None).expect("table name");
    let mut tracker = LayoutTracker::new([outbox.clone()]);
    tracker.set(
        &outbox,
        ["id", "aggregate_type", "kind", "payload"]
            .map(String::from)
            .to_vec(),
    );
    tracker.set_server_version(version);
    if mode & 16 != 0 {
        // A checkpoint's stored layouts are outside input too.
        let _ = tracker.restore(&statement);
    } else {
        tracker.observe(
            &statement,
            "shop",
            &BinlogPosition::new("mysql-bin.000001", 4),
        );
    }
    let _ = tracker.get(&outbox);
    if let Some(snapshot) = tracker.snapshot() {
        // What the checkpoint stores must restore.
        let mut again = LayoutTracker::new([outbox]);
        if let Err(e) = again.restore(&snapshot) {
            panic!("a stored snapshot does not restore: {e}: {snapshot}");
        }
    }
});
