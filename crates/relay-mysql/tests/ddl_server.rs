//! Cross-checks `ddl::parse` + `ddl::apply` against the test server (`MARIADB_PORT`, default
//! 3306): each ALTER TABLE runs on a fresh table (a, b, c) in a scratch database, and the
//! layout `apply` computes must equal `information_schema.columns` afterwards; a statement the
//! server refuses must be refused by `apply` (or `parse`) too.

use mysql_async::prelude::Queryable;
use outbox_relay_mysql::decode::ddl::{self, Ddl, Dialect};
use outbox_relay_mysql::server::Flavor;

const CLAUSES: &[&str] = &[
    "ADD d INT, ADD e INT FIRST, ADD f INT AFTER a",
    "ADD x INT AFTER y, ADD y INT",
    "ADD COLUMN (d INT, e INT, INDEX (d))",
    "DROP A, ADD a INT",
    "DROP a, DROP b, DROP c",
    "ADD x INT AFTER a, DROP a",
    "CHANGE a b INT, CHANGE b a INT",
    "CHANGE a a2 INT, ADD x INT AFTER a2, ALGORITHM=COPY, LOCK=SHARED",
    "CHANGE a a INT AFTER c, ADD x INT FIRST, ADD y INT AFTER a",
    "MODIFY a INT AFTER b, MODIFY b INT FIRST",
    "MODIFY C INT AFTER A",
    "RENAME COLUMN a TO b, RENAME COLUMN b TO a, ADD x INT AFTER b",
    "RENAME COLUMN a TO x, DROP x",
    "ADD IF NOT EXISTS d INT, ADD IF NOT EXISTS D INT, DROP IF EXISTS z",
    "MODIFY IF EXISTS z INT, ADD IF NOT EXISTS z INT",
    "DROP IF EXISTS a, ADD IF NOT EXISTS a INT",
    "ADD `we``ird` INT /*M!100100 FIRST */, ADD `first` INT AFTER `we``ird`",
    "ADD d INT AFTER b PARTITION BY HASH(a) PARTITIONS 2",
    "ADD d INT DEFAULT (2--1) COMMENT 'after c', ADD e ENUM('x,y', 'FIRST') AFTER a",
    "ALTER COLUMN a SET DEFAULT 1, ADD CONSTRAINT ck CHECK (b > 0), ENGINE=InnoDB",
];

#[tokio::test]
async fn apply_matches_the_server() {
    let port = std::env::var("MARIADB_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok());
    let url = format!("mysql://root@127.0.0.1:{}", port.unwrap_or(3306));
    let pool = mysql_async::Pool::new(url.as_str());
    let mut conn = pool.get_conn().await.expect("test MariaDB/MySQL reachable");
    let version: String = conn
        .query_first("SELECT @@version")
        .await
        .expect("version")
        .expect("row");
    let flavor = if version.contains("MariaDB") {
        Flavor::MariaDb
    } else {
        Flavor::MySql
    };
    let dialect = Dialect::new(flavor, ddl::version_id(&version).expect("version id"));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let db = format!("ddl_check_{}_{nanos}", std::process::id());
    conn.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .expect("create database");
    let mut failures = Vec::new();
    for (n, clauses) in CLAUSES.iter().enumerate() {
        let table = format!("{db}.t{n}");
        conn.query_drop(format!("CREATE TABLE {table} (a INT, b INT, c INT)"))
            .await
            .expect("create table");
        let statement = format!("ALTER TABLE {table} {clauses}");
        let server = match conn.query_drop(&statement).await {
            Ok(()) => {
                let query = format!(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = '{db}' \
                     AND table_name = 't{n}' ORDER BY ordinal_position"
                );
                Ok(conn.query::<String, _>(query).await.expect("columns"))
            }
            Err(e) => Err(e.to_string()),
        };
        let mut columns = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let ours = match ddl::parse(&statement, &dialect) {
            Ok(Ddl::AlterTable { ops, .. }) => ddl::apply(&mut columns, &ops).map(|()| columns),
            other => Err(format!("{other:?}")),
        };
        if server.is_ok() != ours.is_ok() || server.as_ref().ok() != ours.as_ref().ok() {
            failures.push(format!(
                "{statement}\n  server: {server:?}\n  ours:   {ours:?}"
            ));
        }
    }
    conn.query_drop(format!("DROP DATABASE {db}"))
        .await
        .expect("drop database");
    drop(conn);
    pool.disconnect().await.ok();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
