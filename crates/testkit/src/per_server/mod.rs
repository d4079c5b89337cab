//! What differs between the test servers ([`crate::TestServer`]), for the end-to-end suites to
//! assert each server's right outcome: how a payload comes back ([`server_json_text`],
//! [`stored_payloads`]), SQL forms that run on both ([`integer_sequence`],
//! [`column_type_as_shown`]), GTID states and sets ([`gtid`]: MariaDB positions `0-1-42,1-2-7`,
//! MySQL sets `uuid:1-42`), the GTIDs of XA statements, and the GTID replica ([`replica`]).
//! Each helper says what it does per server.

pub mod gtid;
pub mod replica;

use std::collections::HashMap;

use anyhow::{Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::env::test_server;

pub use gtid::{
    canonical_gtid_set, gtid_of_event, gtid_set_at, gtid_state_includes, gtid_state_variable,
    unreached_gtid_state, xa_statement_gtid, xid_literal,
};
pub use replica::{replica_port, replica_script};

/// The text the test server gives back (`SELECT payload`) for the JSON document `text` stored
/// in a `JSON` column, which is what the relay relays.
///
/// MariaDB stores JSON as LONGTEXT: `text` unchanged. MySQL stores binary JSON and prints it
/// normalised (keys ordered by length then bytes, duplicate keys dropped, `": "` and `", "`
/// separators, numbers reformatted): `CAST(CAST(text AS JSON) AS CHAR)`, as MySQL stores it.
pub async fn server_json_text(conn: &mut Conn, text: &str) -> Result<String> {
    if !test_server().is_mysql() {
        return Ok(text.to_owned());
    }
    let printed: Option<String> = conn
        .exec_first("SELECT CAST(CAST(? AS JSON) AS CHAR)", (text,))
        .await
        .context("printing a JSON document as MySQL stores it")?;
    printed.context("CAST(? AS JSON) returned no row")
}

/// `payload` of the row with `event_key` in `table` (of the connection's database) as the
/// server returns it (`CAST(payload AS CHAR)`); `None` when there is no such row or it is NULL.
pub async fn stored_payload(
    conn: &mut Conn,
    table: &str,
    event_key: &str,
) -> Result<Option<String>> {
    let payload: Option<Option<String>> = conn
        .exec_first(
            format!("SELECT CAST(payload AS CHAR) FROM {table} WHERE event_key = ?"),
            (event_key,),
        )
        .await
        .with_context(|| format!("reading the payload of {event_key} from {table}"))?;
    Ok(payload.flatten())
}

/// The `payload` of every row of `table`, keyed by `event_key`, as the server returns it
/// (`CAST(payload AS CHAR)`): the text the relay must produce as the record value. On MariaDB
/// JSON is LONGTEXT, so this is the inserted text byte for byte; MySQL stores binary JSON and
/// prints it normalised (`{"a": 1, "bb": 2}`: keys sorted by length then bytes, `": "` and
/// `", "` separators).
///
/// # Errors
/// The query fails.
pub async fn stored_payloads(
    conn: &mut Conn,
    table: &str,
) -> Result<HashMap<String, Option<String>>> {
    let rows: Vec<(String, Option<String>)> = conn
        .query(format!(
            "SELECT event_key, CAST(payload AS CHAR) FROM {table}"
        ))
        .await
        .with_context(|| format!("reading the payloads of {table}"))?;
    Ok(rows.into_iter().collect())
}

/// `information_schema.COLUMNS.COLUMN_TYPE` of an integer column as the test server shows it,
/// from MariaDB's form: MariaDB keeps the display width (`bigint(20) unsigned`); MySQL 8.0.19+
/// no longer shows it (`bigint unsigned`; display widths are deprecated). Other types are the
/// same on both and returned unchanged.
pub fn column_type_as_shown(mariadb_form: &str) -> String {
    const INTEGERS: [&str; 5] = ["tinyint(", "smallint(", "mediumint(", "int(", "bigint("];
    if !test_server().is_mysql() {
        return mariadb_form.to_owned();
    }
    match INTEGERS.iter().find(|p| mariadb_form.starts_with(*p)) {
        Some(prefix) => match mariadb_form[prefix.len()..].split_once(')') {
            Some((_width, rest)) => format!("{}{rest}", &prefix[..prefix.len() - 1]),
            None => mariadb_form.to_owned(),
        },
        None => mariadb_form.to_owned(),
    }
}

/// A derived table `seq_source` with one column `seq` holding 1..=`rows` (`rows` ≤ 10^9), for
/// `INSERT … SELECT … FROM <this>`: cross joins of a ten-row digit table, which both servers
/// run with their defaults (MariaDB's `seq_1_to_N` tables need its SEQUENCE engine; a recursive
/// CTE on MySQL stops at `cte_max_recursion_depth` = 1000).
pub fn integer_sequence(rows: u64) -> String {
    let digits = rows.max(1).to_string().len();
    let digit = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let sum = (0..digits)
        .map(|i| format!("d{i}.d * {}", 10u64.pow(u32::try_from(i).unwrap_or(0))))
        .collect::<Vec<_>>()
        .join(" + ");
    let from = (0..digits)
        .map(|i| format!("{digit} AS d{i}"))
        .collect::<Vec<_>>()
        .join(" CROSS JOIN ");
    format!(
        "(SELECT seq FROM (SELECT {sum} + 1 AS seq FROM {from}) AS digits WHERE seq <= {rows}) \
         AS seq_source"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_sequence_counts_digits() {
        let s = integer_sequence(100_000);
        assert!(s.contains("d5.d * 100000") && !s.contains("d6"));
        assert!(s.ends_with("WHERE seq <= 100000) AS seq_source"));
    }
}
