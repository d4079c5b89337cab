//! GTID states and sets as each test server has them: MariaDB positions (`0-1-42,1-2-7`, one
//! `domain-server-seq` per domain), MySQL sets (`uuid:1-5:7,uuid2:3`); and the GTIDs of events
//! and XA statements in `SHOW BINLOG EVENTS`.

use std::ops::ControlFlow;

use anyhow::{bail, Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::binlog::{BinlogEvent, BinlogPosition};
use crate::binlog_scan::scan_binlog;
use crate::env::test_server;

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
        let set = parse_mysql_gtids(state)?;
        return Ok(set
            .get(&uuid.trim().to_ascii_lowercase())
            .is_some_and(|intervals| intervals.iter().any(|&(lo, hi)| (lo..=hi).contains(&n))));
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

/// A MySQL GTID set: intervals per source UUID.
type MysqlGtids = std::collections::BTreeMap<String, Vec<(u64, u64)>>;

/// Parses MySQL's GTID set text (`uuid:1-5:7,uuid2:3`, whitespace and newlines ignored).
fn parse_mysql_gtids(text: &str) -> Result<MysqlGtids> {
    let mut set = MysqlGtids::new();
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    for part in compact.split(',').filter(|p| !p.is_empty()) {
        let mut fields = part.split(':');
        let uuid = fields.next().context("a GTID set part without a UUID")?;
        let intervals = set.entry(uuid.to_ascii_lowercase()).or_default();
        for interval in fields {
            let (a, b) = interval.split_once('-').unwrap_or((interval, interval));
            let a: u64 = a
                .parse()
                .with_context(|| format!("GTID interval {interval:?}"))?;
            let b: u64 = b
                .parse()
                .with_context(|| format!("GTID interval {interval:?}"))?;
            intervals.push((a, b));
        }
    }
    Ok(set)
}

/// Prints a MySQL GTID set canonically: UUIDs in order, intervals sorted and merged.
fn print_mysql_gtids(set: &mut MysqlGtids) -> String {
    let mut parts = Vec::new();
    for (uuid, intervals) in set.iter_mut() {
        intervals.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for &(a, b) in intervals.iter() {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        if merged.is_empty() {
            continue;
        }
        let mut part = uuid.clone();
        for (a, b) in merged {
            part.push_str(&if a == b {
                format!(":{a}")
            } else {
                format!(":{a}-{b}")
            });
        }
        parts.push(part);
    }
    parts.join(",")
}

/// A GTID state in one comparable form: MySQL sets (`uuid:1-5:7`, as `@@gtid_executed` prints
/// them, with newlines after commas) canonically (UUIDs in order, intervals merged, no
/// whitespace); MariaDB positions (`0-1-42,2-2-7`) only trimmed.
///
/// # Errors
/// A MySQL set that does not parse.
pub fn canonical_gtid_set(text: &str) -> Result<String> {
    if text.contains(':') {
        Ok(print_mysql_gtids(&mut parse_mysql_gtids(text)?))
    } else {
        Ok(text.trim().to_owned())
    }
}

/// The server's GTID state at the transaction boundary `at` (what a relay starting there has
/// executed), in [`canonical_gtid_set`] form; `None` when there are no GTIDs there.
///
/// MariaDB: `BINLOG_GTID_POS(file, pos)`. MySQL has no such function: the `Previous_gtids`
/// event of `at.file` plus the GTID of every transaction that starts in the file before `at`
/// (`SET @@SESSION.GTID_NEXT= 'uuid:n'` events of `SHOW BINLOG EVENTS`).
///
/// # Errors
/// A query fails, or a GTID in the binlog does not parse.
pub async fn gtid_set_at(conn: &mut Conn, at: &crate::BinlogPosition) -> Result<Option<String>> {
    if !test_server().is_mysql() {
        let g: Option<Option<String>> = conn
            .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (&at.file, at.pos))
            .await?;
        return Ok(g.flatten().filter(|g| !g.trim().is_empty()));
    }
    let start = crate::BinlogPosition {
        file: at.file.clone(),
        pos: 4,
    };
    let mut set = MysqlGtids::new();
    let mut done = false;
    let mut from = start;
    // Pages start at the last event of the page before (an event start, whatever End_log_pos
    // says), which is skipped the second time.
    let mut read_up_to: Option<u64> = None;
    while !done {
        let events = crate::binlog_events_from(conn, &from, 5_000).await?;
        let Some(last) = events.last() else { break };
        let next = last.pos;
        for ev in &events {
            if read_up_to.is_some_and(|p| ev.pos <= p) {
                continue;
            }
            if ev.pos >= at.pos || ev.log_name != at.file {
                done = true;
                break;
            }
            match ev.event_type.as_str() {
                "Previous_gtids" => {
                    for (uuid, intervals) in parse_mysql_gtids(&ev.info)? {
                        set.entry(uuid).or_default().extend(intervals);
                    }
                }
                "Gtid" => {
                    let gtid =
                        gtid_of_event(ev).with_context(|| format!("GTID event {:?}", ev.info))?;
                    for (uuid, intervals) in parse_mysql_gtids(&gtid)? {
                        set.entry(uuid).or_default().extend(intervals);
                    }
                }
                _ => {}
            }
        }
        if events.len() < 5_000 || read_up_to.is_some_and(|p| next <= p) {
            break;
        }
        read_up_to = Some(next);
        from.pos = next;
    }
    let printed = print_mysql_gtids(&mut set);
    Ok((!printed.is_empty()).then_some(printed))
}

/// The global variable holding the server's GTID state, as a relay resuming by GTID would
/// start after it: MySQL `@@GLOBAL.gtid_executed` (`uuid:1-n`), MariaDB
/// `@@GLOBAL.gtid_binlog_pos` (`domain-server-seq`, one per domain).
pub fn gtid_state_variable() -> &'static str {
    if test_server().is_mysql() {
        "@@GLOBAL.gtid_executed"
    } else {
        "@@GLOBAL.gtid_binlog_pos"
    }
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
    fn mysql_gtid_sets_print_canonically() {
        let set = "B1e0a8b6-0000-0000-0000-000000000002:5,\n\
                   a1e0a8b6-0000-0000-0000-000000000001:3-4:1-2:7,\
                   b1e0a8b6-0000-0000-0000-000000000002:1-4";
        assert_eq!(
            canonical_gtid_set(set).expect("parses"),
            "a1e0a8b6-0000-0000-0000-000000000001:1-4:7,\
             b1e0a8b6-0000-0000-0000-000000000002:1-5"
        );
        assert_eq!(
            canonical_gtid_set(" 0-1-42,2-2-7\n").expect("as is"),
            "0-1-42,2-2-7"
        );
    }
}
