//! Per-server SQL and GTID forms for the end-to-end suites, where MariaDB and MySQL differ
//! ([`crate::TestServer`]): what the server stores as a JSON payload, a row source without
//! MariaDB's SEQUENCE engine, GTID states (MariaDB positions `0-1-42,1-2-7`, MySQL sets
//! `uuid:1-42`) and the GTIDs of XA statements.

use std::collections::HashMap;
use std::ops::ControlFlow;

use anyhow::{bail, Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::binlog::{BinlogEvent, BinlogPosition};
use crate::binlog_scan::scan_binlog;
use crate::env::test_server;

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

/// A GTID state the server never reached, to store as a checkpoint's `gtid_set`: resuming
/// there must fail with error 1236. MariaDB: `0-1-999999999` (domain 0 far ahead); MySQL:
/// `<@@server_uuid>:1-999999999` (more of the server's own transactions than it has
/// executed).
///
/// # Errors
/// The query fails (MySQL).
pub async fn unreached_gtid_state(conn: &mut Conn) -> Result<String> {
    if test_server().is_mysql() {
        let uuid: String = conn
            .query_first("SELECT @@GLOBAL.server_uuid")
            .await?
            .context("@@server_uuid is NULL")?;
        Ok(format!("{uuid}:1-999999999"))
    } else {
        Ok("0-1-999999999".into())
    }
}

/// Whether the GTID state `state` includes the transaction `gtid`.
///
/// * MariaDB (`gtid` `D-S-N`, `state` a position `D-S-N,…`): the state's entry for domain `D`
///   has a sequence number ≥ `N`.
/// * MySQL (`gtid` `uuid:N`, `state` a set `uuid:1-5:7,uuid2:3`): `N` is in one of the
///   intervals of `uuid`.
///
/// # Errors
/// `gtid` or `state` is not in either form.
pub fn gtid_state_includes(state: &str, gtid: &str) -> Result<bool> {
    if let Some((uuid, n)) = gtid.split_once(':') {
        let n: u64 = n.trim().parse().with_context(|| format!("GTID {gtid:?}"))?;
        for member in state.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let mut parts = member.split(':');
            let sid = parts.next().unwrap_or_default();
            if !sid.eq_ignore_ascii_case(uuid.trim()) {
                continue;
            }
            for interval in parts {
                let (lo, hi) = interval.split_once('-').unwrap_or((interval, interval));
                let lo: u64 = lo.parse().with_context(|| format!("GTID set {state:?}"))?;
                let hi: u64 = hi.parse().with_context(|| format!("GTID set {state:?}"))?;
                if (lo..=hi).contains(&n) {
                    return Ok(true);
                }
            }
        }
        return Ok(false);
    }
    let parse = |g: &str| -> Result<(u32, u64)> {
        let parts: Vec<&str> = g.trim().split('-').collect();
        let [d, _, n] = parts.as_slice() else {
            bail!("not a MariaDB GTID: {g:?}");
        };
        Ok((d.parse()?, n.parse()?))
    };
    let (domain, seq) = parse(gtid)?;
    for member in state.split(',').filter(|m| !m.trim().is_empty()) {
        let (d, n) = parse(member)?;
        if d == domain {
            return Ok(n >= seq);
        }
    }
    Ok(false)
}

/// The GTID a `Gtid` event's `Info` names: MariaDB `BEGIN GTID 0-1-42`, `GTID 0-1-42`,
/// `XA START X'…',X'',1 GTID 0-1-42`; MySQL `SET @@SESSION.GTID_NEXT= 'uuid:42'`.
pub fn gtid_of_event(ev: &BinlogEvent) -> Option<String> {
    if ev.event_type != "Gtid" {
        return None;
    }
    if let Some(rest) = ev.info.split("GTID_NEXT=").nth(1) {
        let g = rest
            .trim()
            .trim_matches(|c| c == '\'' || c == ';' || c == ' ');
        return (!g.is_empty()).then(|| g.to_owned());
    }
    let mut tokens = ev.info.split_whitespace();
    while let Some(t) = tokens.next() {
        if t == "GTID" {
            return tokens.next().map(str::to_owned);
        }
    }
    None
}

/// How an XID appears in the binlog's XA statements: `X'<gtrid hex>',X'',1` (an XID given as
/// the string `gtrid` alone; both servers log it so).
pub fn xid_literal(gtrid: &str) -> String {
    let hex: String = gtrid.bytes().map(|b| format!("{b:02x}")).collect();
    format!("X'{hex}',X'',1")
}

/// The GTID of the event group, from `from` on, that holds the XA statement `statement`
/// (`XA PREPARE`, `XA COMMIT` or `XA ROLLBACK`) of `gtrid`. Works on both servers; needed on
/// MySQL, where `performance_schema` does not record the GTID of an `XA COMMIT`/`XA ROLLBACK`
/// of a transaction another session prepared (so [`crate::last_gtid`] cannot tell it).
///
/// # Errors
/// A query fails, or no such statement follows `from`.
pub async fn xa_statement_gtid(
    conn: &mut Conn,
    from: &BinlogPosition,
    statement: &str,
    gtrid: &str,
) -> Result<String> {
    let wanted = format!("{} {}", statement.trim(), xid_literal(gtrid));
    let mut gtid: Option<String> = None;
    let found = scan_binlog(conn, from, |ev| {
        if let Some(g) = gtid_of_event(ev) {
            gtid = Some(g);
        } else if (ev.event_type == "Query" || ev.event_type == "XA_prepare")
            && ev.info.trim().eq_ignore_ascii_case(&wanted)
        {
            return ControlFlow::Break(gtid.clone());
        }
        ControlFlow::Continue(())
    })
    .await?;
    found
        .flatten()
        .with_context(|| format!("no {wanted} with a GTID in the binlog after {from}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gtid_state_inclusion_in_both_forms() {
        let inc = |state: &str, gtid: &str| gtid_state_includes(state, gtid).expect("parses");
        assert!(inc("0-1-42,1-2-7", "0-1-42"));
        assert!(!inc("0-1-41,1-2-7", "0-1-42"));
        assert!(!inc("1-2-7", "0-1-1"));
        let u = "eb13c6f1-ed91-11f1-a8f5-02fc00000001";
        assert!(inc(&format!("{u}:1-5:7-9"), &format!("{u}:8")));
        assert!(!inc(&format!("{u}:1-5:7-9"), &format!("{u}:6")));
        assert!(inc(&format!("{u}:1-5:7"), &format!("{u}:7")));
        assert!(!inc(&format!("x:1-9,{u}:1-5"), &format!("{u}:6")));
    }

    #[test]
    fn gtids_of_both_servers_events() {
        let ev = |info: &str| BinlogEvent {
            log_name: "b.000001".into(),
            pos: 4,
            event_type: "Gtid".into(),
            server_id: 1,
            end_log_pos: 50,
            end_logged: true,
            info: info.into(),
        };
        assert_eq!(
            gtid_of_event(&ev("XA START X'77',X'',1 GTID 0-1-47")).as_deref(),
            Some("0-1-47")
        );
        assert_eq!(
            gtid_of_event(&ev("BEGIN GTID 0-1-9")).as_deref(),
            Some("0-1-9")
        );
        assert_eq!(
            gtid_of_event(&ev("SET @@SESSION.GTID_NEXT= 'ab:12'")).as_deref(),
            Some("ab:12")
        );
        assert_eq!(xid_literal("wtb1"), "X'77746231',X'',1");
    }

    #[test]
    fn integer_sequence_counts_digits() {
        let s = integer_sequence(100_000);
        assert!(s.contains("d5.d * 100000") && !s.contains("d6"));
        assert!(s.ends_with("WHERE seq <= 100000) AS seq_source"));
    }
}
