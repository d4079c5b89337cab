//! Small helpers for what differs between the test servers ([`crate::TestServer`]): how a JSON
//! document comes back, GTID state, replication statements. Each says what it does per server.

use anyhow::{Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::env::test_server;

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
                    let gtid = ev
                        .info
                        .split('\'')
                        .nth(1)
                        .with_context(|| format!("GTID event {:?}", ev.info))?;
                    for (uuid, intervals) in parse_mysql_gtids(gtid)? {
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

/// The port of the test server's GTID replica (`tests/services/replica.sh`, same flavor):
/// `REPLICA_PORT` as the script reads it, else the primary's port + 1 (3307, 3317, 3327).
pub fn replica_port() -> u16 {
    std::env::var("REPLICA_PORT")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| crate::env::mysql_port() + 1)
}

/// Runs `tests/services/replica.sh <test server> <action>` (`up`, `down`, `status`) to its end,
/// blocking; the replica replicates only the `failover_%` databases of the primary.
///
/// # Errors
/// The script cannot run or fails; the error carries its output.
pub fn replica_script(action: &str) -> Result<()> {
    let script = crate::faults::services::default_repo_root()
        .join("tests")
        .join("services")
        .join("replica.sh");
    let server = test_server().name();
    let out = std::process::Command::new(&script)
        .args([server, action])
        .env("REPLICA_PORT", replica_port().to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {} {server} {action}", script.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} {server} {action} failed ({}):\n{}{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
