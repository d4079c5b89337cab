//! XA transactions: rows logged at `XA PREPARE`, decided by a later `XA COMMIT` or `XA ROLLBACK`.
//!
//! # How the binlog shows them
//! Checked on MariaDB 10.11 with `mariadb-binlog --hexdump` (the fixture
//! `testdata/mariadb-xa.000001`, see `testdata/README.md`), and in MySQL 8's source
//! (`MYSQL_BIN_LOG::commit`, `XA_prepare_log_event`):
//!
//! * The prepared transaction is one event group ending with an `XA_PREPARE_LOG_EVENT` (type 38)
//!   whose body is `one_phase: u8, formatID: u32, gtrid_length: u32, bqual_length: u32,
//!   data[gtrid_length + bqual_length]` (little-endian). MariaDB opens the group with a GTID event
//!   flagged `FL_PREPARED_XA` (64); MySQL with its GTID event and a query `XA START X'…',X'…',n`.
//!   Both log `XA END X'…',X'…',n` just before the prepare event.
//! * The outcome is a group of its own, later in the binlog (possibly in another file, possibly
//!   written by another connection): a query `XA COMMIT X'…',X'…',n` or `XA ROLLBACK X'…',X'…',n`
//!   (MariaDB flags its GTID event `FL_COMPLETED_XA`, 128). The XID is always printed in this
//!   canonical form: gtrid and bqual as lower-case hex literals, then formatID in decimal.
//! * `XA COMMIT … ONE PHASE` is logged by MariaDB as an ordinary transaction (`START
//!   TRANSACTION` … `Xid`), by MySQL as an XA group whose prepare event has `one_phase = 1`.
//! * An XA transaction that wrote nothing, or was rolled back before `XA PREPARE`, is not logged.
//!
//! # What the relay does
//! The outbox rows of an XA group are kept (in binlog order) instead of being relayed. At the
//! group's `XA PREPARE` they are parked under the transaction's [`Xid`]; its `XA COMMIT` releases
//! them as rows of the commit's group (so their records follow everything committed before the
//! `XA COMMIT`: commit order), its `XA ROLLBACK` drops them. A one-phase commit releases them at
//! once.
//!
//! While any XA transaction is prepared and undecided, no transaction boundary is reported
//! ([`XaTracker::release`]), so the checkpoint never passes an `XA PREPARE` whose outcome has
//! not been read. To the pipeline everything from the last boundary before the oldest undecided
//! `XA PREPARE` up to the outcome that leaves none undecided is one long transaction; a restart
//! re-reads it from that boundary (where no XA transaction was undecided, so a fresh decoder is
//! in the same state as the one that reported it), rebuilds the same parked rows, and emits the
//! same rows in the same order, so skipping the checkpoint's `rows_acked` rows stays exact.
//!
//! An `XA COMMIT` whose `XA PREPARE` this decoder has not read (it was logged before the point
//! the relay started from, e.g. a first start at the end of the binlog while an XA transaction was
//! prepared) is an error naming the XID and its position: the relay cannot know which rows it
//! committed and does not guess. An unknown `XA ROLLBACK` is ignored: it commits nothing.
//!
//! # Memory
//! The records of every prepared, undecided XA transaction are held in memory until its outcome
//! is read (plus the XID and position of each): as many rows as those transactions inserted
//! into the outbox. Rows of other transactions are not held.

use std::collections::HashMap;
use std::fmt;

use outbox_relay_core::position::BinlogPosition;

use super::{DecodedRow, TxBoundary};

/// The id of an XA transaction (X/Open XA `XID`): format id, global transaction id, branch
/// qualifier. Two XIDs are the same transaction when all three are equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Xid {
    /// `formatID` as the binlog's XA_PREPARE event stores it (32 bits; the query text prints the
    /// server's `long` in decimal, of which the low 32 bits are kept).
    pub format_id: u32,
    /// `gtrid` bytes (at most 64).
    pub gtrid: Vec<u8>,
    /// `bqual` bytes (at most 64, often empty).
    pub bqual: Vec<u8>,
}

/// Longest gtrid and bqual (`MAXGTRIDSIZE`, `MAXBQUALSIZE` of the XA specification).
const MAX_XID_PART: usize = 64;

impl Xid {
    /// Parses the body of an `XA_PREPARE_LOG_EVENT` (checksum excluded): `one_phase: u8,
    /// formatID: u32, gtrid_length: u32, bqual_length: u32, data` (little-endian). Returns the
    /// XID and whether the event is a one-phase commit (MySQL's `XA COMMIT … ONE PHASE`).
    ///
    /// # Errors
    /// A truncated body or lengths over 64, described.
    pub fn from_prepare_event(body: &[u8]) -> Result<(Self, bool), String> {
        let u32_at = |at: usize| -> Result<u32, String> {
            body.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or_else(|| format!("XA_PREPARE event body is truncated ({} bytes)", body.len()))
        };
        let one_phase = *body
            .first()
            .ok_or_else(|| "XA_PREPARE event body is empty".to_owned())?;
        let format_id = u32_at(1)?;
        let gtrid_len = usize::try_from(u32_at(5)?).unwrap_or(usize::MAX);
        let bqual_len = usize::try_from(u32_at(9)?).unwrap_or(usize::MAX);
        if gtrid_len > MAX_XID_PART || bqual_len > MAX_XID_PART {
            return Err(format!(
                "XA_PREPARE event has gtrid_length {gtrid_len} and bqual_length {bqual_len} \
                 (at most {MAX_XID_PART} each)"
            ));
        }
        let data = body.get(13..13 + gtrid_len + bqual_len).ok_or_else(|| {
            format!(
                "XA_PREPARE event body is truncated ({} bytes for a {gtrid_len}+{bqual_len}-byte \
                 XID)",
                body.len()
            )
        })?;
        let (gtrid, bqual) = data.split_at(gtrid_len);
        Ok((
            Self {
                format_id,
                gtrid: gtrid.to_vec(),
                bqual: bqual.to_vec(),
            },
            one_phase != 0,
        ))
    }
}

/// The server's canonical form: `X'6774',X'',1`.
impl fmt::Display for Xid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = |f: &mut fmt::Formatter<'_>, bytes: &[u8]| -> fmt::Result {
            f.write_str("X'")?;
            for b in bytes {
                write!(f, "{b:02x}")?;
            }
            f.write_str("'")
        };
        hex(f, &self.gtrid)?;
        f.write_str(",")?;
        hex(f, &self.bqual)?;
        write!(f, ",{}", self.format_id)
    }
}

/// An XA statement logged as a query event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XaStatement {
    /// `XA START` / `XA BEGIN`: MySQL's first event of an XA group.
    Start,
    /// `XA END`, `XA PREPARE` (MariaDB and MySQL log the prepare as its own event type; the
    /// query form is accepted for completeness), or anything else inside an XA group.
    InGroup,
    /// `XA COMMIT xid [ONE PHASE]`.
    Commit {
        /// The transaction.
        xid: Xid,
        /// `ONE PHASE`: the group this query ends holds the rows.
        one_phase: bool,
    },
    /// `XA ROLLBACK xid`.
    Rollback(Xid),
}

/// Classifies a query event's statement (already trimmed): `None` when it is not an `XA`
/// statement.
///
/// # Errors
/// An `XA COMMIT` or `XA ROLLBACK` whose XID cannot be read (described).
pub fn parse_xa_statement(stmt: &str) -> Option<Result<XaStatement, String>> {
    let rest = strip_keyword(stmt, "XA")?;
    let (verb, rest) = split_word(rest);
    let verb = verb.to_ascii_uppercase();
    Some(match verb.as_str() {
        "START" | "BEGIN" => Ok(XaStatement::Start),
        "END" | "PREPARE" => Ok(XaStatement::InGroup),
        "COMMIT" | "ROLLBACK" => parse_xid_text(rest)
            .and_then(|(xid, tail)| {
                let tail = tail.trim();
                let one_phase = verb == "COMMIT"
                    && strip_keyword(tail, "ONE")
                        .and_then(|t| strip_keyword(t, "PHASE"))
                        .is_some_and(|t| t.trim().is_empty());
                if !tail.is_empty() && !one_phase {
                    return Err(format!("unexpected {tail:?} after the XID"));
                }
                Ok(if verb == "COMMIT" {
                    XaStatement::Commit { xid, one_phase }
                } else {
                    XaStatement::Rollback(xid)
                })
            })
            .map_err(|e| format!("cannot read the XID of {stmt:?}: {e}")),
        _ => return None, // XA RECOVER and the like are not logged; nothing to do
    })
}

/// `s` without its leading `keyword` (case-insensitive) and the whitespace after it; `None`
/// when `s` does not start with the keyword as a whole word.
fn strip_keyword<'a>(s: &'a str, keyword: &str) -> Option<&'a str> {
    let s = s.trim_start();
    let head = s.get(..keyword.len())?;
    let rest = &s[keyword.len()..];
    (head.eq_ignore_ascii_case(keyword)
        && rest
            .chars()
            .next()
            .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_'))
    .then(|| rest.trim_start())
}

/// The first word of `s` (letters) and the rest.
fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// Parses `gtrid [, bqual [, formatID]]` at the start of `s`; returns the XID and the rest.
/// gtrid and bqual are hex literals (`X'0a1b'`, `0x0a1b`) or quoted strings (`'…'`, `"…"`, with
/// backslash escapes and doubled quotes); formatID is a decimal integer (default 1, SQL syntax).
fn parse_xid_text(s: &str) -> Result<(Xid, &str), String> {
    let (gtrid, mut rest) = parse_xid_part(s.trim_start())?;
    let mut bqual = Vec::new();
    let mut format_id = 1u32;
    if let Some(r) = rest.trim_start().strip_prefix(',') {
        let (b, r) = parse_xid_part(r.trim_start())?;
        bqual = b;
        rest = r;
        if let Some(r) = rest.trim_start().strip_prefix(',') {
            let (f, r) = parse_format_id(r.trim_start())?;
            format_id = f;
            rest = r;
        }
    }
    if gtrid.len() > MAX_XID_PART || bqual.len() > MAX_XID_PART {
        return Err(format!("gtrid and bqual are at most {MAX_XID_PART} bytes"));
    }
    Ok((
        Xid {
            format_id,
            gtrid,
            bqual,
        },
        rest,
    ))
}

/// One of gtrid/bqual: a hex literal or a quoted string.
fn parse_xid_part(s: &str) -> Result<(Vec<u8>, &str), String> {
    let bytes = s.as_bytes();
    match bytes {
        [b'x' | b'X', b'\'', ..] => {
            let body = &s[2..];
            let end = body
                .find('\'')
                .ok_or_else(|| format!("unterminated hex literal in {s:?}"))?;
            Ok((decode_hex(&body[..end])?, &body[end + 1..]))
        }
        [b'0', b'x', ..] => {
            let body = &s[2..];
            let end = body
                .find(|c: char| !c.is_ascii_hexdigit())
                .unwrap_or(body.len());
            Ok((decode_hex(&body[..end])?, &body[end..]))
        }
        [q @ (b'\'' | b'"'), ..] => {
            let quote = *q;
            let mut out = Vec::new();
            let mut i = 1;
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' => {
                        let c = *bytes
                            .get(i + 1)
                            .ok_or_else(|| format!("unterminated string in {s:?}"))?;
                        out.push(match c {
                            b'0' => 0,
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'Z' => 0x1a,
                            b'b' => 0x08,
                            other => other,
                        });
                        i += 2;
                    }
                    c if c == quote => {
                        if bytes.get(i + 1) == Some(&quote) {
                            out.push(quote);
                            i += 2;
                        } else {
                            return Ok((out, &s[i + 1..]));
                        }
                    }
                    c => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            Err(format!("unterminated string in {s:?}"))
        }
        _ => Err(format!(
            "expected a hex literal or a quoted string at {s:?}"
        )),
    }
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("{hex:?} is not an even number of hex digits"));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

/// A decimal formatID, optionally signed; the low 32 bits of its two's complement are kept,
/// as the XA_PREPARE event stores them.
fn parse_format_id(s: &str) -> Result<(u32, &str), String> {
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let value: u64 = digits[..end]
        .parse()
        .map_err(|_| format!("expected a decimal formatID at {s:?}"))?;
    let value = if negative {
        value.wrapping_neg()
    } else {
        value
    };
    let low = u32::try_from(value & 0xFFFF_FFFF).unwrap_or_default();
    Ok((low, &digits[end..]))
}

/// What an `XA COMMIT`/`XA ROLLBACK` found.
#[derive(Debug)]
pub enum Outcome {
    /// The transaction was prepared after the decoder's start: its rows (empty after a rollback).
    Known(Vec<DecodedRow>),
    /// Its `XA PREPARE` was not read by this decoder.
    Unknown,
}

/// A prepared XA transaction whose outcome has not been read yet.
#[derive(Debug)]
struct Prepared {
    /// Its outbox rows, in binlog order.
    rows: Vec<DecodedRow>,
    /// End of its XA_PREPARE event (for logs and errors).
    at: BinlogPosition,
}

/// The XA state of one stream: the open XA group's rows, the prepared transactions, and the
/// boundaries withheld while any is undecided.
#[derive(Debug, Default)]
pub struct XaTracker {
    /// Rows of the XA group being read (between its start and its XA_PREPARE event); `None`
    /// outside XA groups.
    group: Option<Vec<DecodedRow>>,
    /// Prepared, undecided XA transactions.
    prepared: HashMap<Xid, Prepared>,
    /// A withheld boundary advanced past something other than the relay's own checkpoints.
    held_advances: bool,
}

impl XaTracker {
    /// An XA group starts (MariaDB GTID event with `FL_PREPARED_XA`, MySQL `XA START`).
    ///
    /// # Errors
    /// The previous XA group kept outbox rows and never reached its XA PREPARE (a binlog this
    /// decoder does not understand): its rows would be lost.
    pub fn start_group(&mut self) -> Result<(), String> {
        self.end_group_without_prepare()?;
        self.group = Some(Vec::new());
        Ok(())
    }

    /// A new event group starts that is not an XA group.
    ///
    /// # Errors
    /// As for [`XaTracker::start_group`].
    pub fn end_group_without_prepare(&mut self) -> Result<(), String> {
        match self.group.take() {
            Some(rows) if !rows.is_empty() => Err(format!(
                "an XA transaction with {} outbox rows ended without an XA PREPARE or XA COMMIT \
                 event",
                rows.len()
            )),
            _ => Ok(()),
        }
    }

    /// `true` inside an XA group: its rows must be given to [`XaTracker::keep`].
    pub fn in_group(&self) -> bool {
        self.group.is_some()
    }

    /// Keeps rows of the open XA group; returns them back when no XA group is open.
    pub fn keep(&mut self, rows: Vec<DecodedRow>) -> Option<Vec<DecodedRow>> {
        match &mut self.group {
            Some(group) => {
                group.extend(rows);
                None
            }
            None => Some(rows),
        }
    }

    /// The group's XA_PREPARE event (ending at `at`). A one-phase commit returns the group's rows
    /// to relay now; otherwise they are parked under `xid` and nothing is returned.
    ///
    /// # Errors
    /// `xid` is already prepared and undecided (the server never does this).
    pub fn prepare(
        &mut self,
        xid: Xid,
        one_phase: bool,
        at: &BinlogPosition,
    ) -> Result<Vec<DecodedRow>, String> {
        let rows = self.group.take().unwrap_or_default();
        if one_phase {
            return Ok(rows);
        }
        if let Some(old) = self.prepared.get(&xid) {
            return Err(format!(
                "XA transaction {xid} is prepared again at {at}, but its XA PREPARE at {} has \
                 not been decided",
                old.at
            ));
        }
        if self.prepared.is_empty() {
            tracing::info!(xid = %xid, at = %at, outbox_rows = rows.len(),
                "XA transaction prepared: the checkpoint stays before it until its XA COMMIT or XA ROLLBACK is read");
        } else {
            tracing::debug!(xid = %xid, at = %at, outbox_rows = rows.len(), "XA transaction prepared");
        }
        self.prepared.insert(
            xid,
            Prepared {
                rows,
                at: at.clone(),
            },
        );
        Ok(Vec::new())
    }

    /// `XA COMMIT … ONE PHASE` logged as a query ending the open XA group: its rows.
    pub fn commit_group(&mut self) -> Vec<DecodedRow> {
        self.group.take().unwrap_or_default()
    }

    /// `XA COMMIT` (`commit`) or `XA ROLLBACK` of `xid`: the rows to relay now (none after a
    /// rollback), or [`Outcome::Unknown`].
    pub fn decide(&mut self, xid: &Xid, commit: bool) -> Outcome {
        match self.prepared.remove(xid) {
            Some(p) => {
                tracing::debug!(xid = %xid, prepared_at = %p.at, commit, outbox_rows = p.rows.len(),
                    "XA transaction decided");
                Outcome::Known(if commit { p.rows } else { Vec::new() })
            }
            None => Outcome::Unknown,
        }
    }

    /// Prepared XA transactions whose outcome has not been read.
    pub fn undecided(&self) -> usize {
        self.prepared.len()
    }

    /// Outbox rows held for undecided XA transactions.
    pub fn held_rows(&self) -> usize {
        self.prepared.values().map(|p| p.rows.len()).sum()
    }

    /// A transaction ended at `boundary`: returns it when it may be reported, `None` while an XA
    /// transaction is undecided (the first boundary reported afterwards carries the withheld
    /// boundaries' `advances`).
    pub fn release(&mut self, mut boundary: TxBoundary) -> Option<TxBoundary> {
        if self.prepared.is_empty() {
            boundary.advances |= std::mem::take(&mut self.held_advances);
            Some(boundary)
        } else {
            self.held_advances |= boundary.advances;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{OutboxEvent, RowFailure};
    use outbox_relay_core::error::RelayError;

    fn id(gtrid: &[u8], bqual: &[u8], format_id: u32) -> Xid {
        Xid {
            format_id,
            gtrid: gtrid.to_vec(),
            bqual: bqual.to_vec(),
        }
    }

    #[test]
    fn prepare_event_body_gives_the_xid() {
        // Body of the XA_PREPARE event of `XA PREPARE 'gt1','bq1',7` on MariaDB 10.11, from
        // `mariadb-binlog --hexdump` (checksum removed): one_phase 0, formatID 7, lengths 3, 3.
        let body = [
            0x00, 0x07, 0, 0, 0, 0x03, 0, 0, 0, 0x03, 0, 0, 0, b'g', b't', b'1', b'b', b'q', b'1',
        ];
        assert_eq!(
            Xid::from_prepare_event(&body),
            Ok((id(b"gt1", b"bq1", 7), false))
        );
        let mut one_phase = body;
        one_phase[0] = 1;
        assert_eq!(
            Xid::from_prepare_event(&one_phase).map(|(_, p)| p),
            Ok(true)
        );
        assert!(
            Xid::from_prepare_event(&body[..15]).is_err(),
            "truncated data"
        );
        assert!(
            Xid::from_prepare_event(&body[..8]).is_err(),
            "truncated header"
        );
        assert!(Xid::from_prepare_event(&[]).is_err());
        let too_long = [0, 1, 0, 0, 0, 65, 0, 0, 0, 0, 0, 0, 0];
        assert!(Xid::from_prepare_event(&too_long).is_err());
    }

    #[test]
    fn query_forms_give_the_same_xid() {
        // MariaDB 10.11 logs `XA COMMIT 'gt1','bq1',7` as this text (mariadb-binlog -vv).
        assert_eq!(
            parse_xa_statement("XA COMMIT X'677431',X'627131',7"),
            Some(Ok(XaStatement::Commit {
                xid: id(b"gt1", b"bq1", 7),
                one_phase: false
            }))
        );
        // MySQL 8: `XA ROLLBACK X'…',X'',1` (SHOW BINLOG EVENTS of MySQL 8.0).
        assert_eq!(
            parse_xa_statement("XA ROLLBACK X'31353835363338363233',X'',1"),
            Some(Ok(XaStatement::Rollback(id(b"1585638623", b"", 1))))
        );
        // Statement syntax as a user writes it: defaults bqual '' and formatID 1.
        assert_eq!(
            parse_xa_statement("xa commit 'a''b\\'c'"),
            Some(Ok(XaStatement::Commit {
                xid: id(b"a'b'c", b"", 1),
                one_phase: false
            }))
        );
        assert_eq!(
            parse_xa_statement("XA COMMIT x'00FF' , \"q\" , 0 ONE   PHASE"),
            Some(Ok(XaStatement::Commit {
                xid: id(&[0, 0xff], b"q", 0),
                one_phase: true
            }))
        );
        assert_eq!(
            parse_xa_statement("XA COMMIT 0x6162,'',42"),
            Some(Ok(XaStatement::Commit {
                xid: id(b"ab", b"", 42),
                one_phase: false
            }))
        );
        // A formatID printed as an unsigned long keeps its low 32 bits, like the event.
        assert_eq!(
            parse_xa_statement("XA ROLLBACK X'61',X'',18446744073709551615"),
            Some(Ok(XaStatement::Rollback(id(b"a", b"", u32::MAX))))
        );
        assert_eq!(
            parse_xa_statement("XA ROLLBACK X'61',X'',-1"),
            Some(Ok(XaStatement::Rollback(id(b"a", b"", u32::MAX))))
        );
    }

    #[test]
    fn other_xa_statements_and_bad_xids() {
        assert_eq!(
            parse_xa_statement("XA START X'677431',X'',1"),
            Some(Ok(XaStatement::Start))
        );
        assert_eq!(
            parse_xa_statement("XA BEGIN 'x'"),
            Some(Ok(XaStatement::Start))
        );
        assert_eq!(
            parse_xa_statement("XA END X'677431',X'',1"),
            Some(Ok(XaStatement::InGroup))
        );
        assert_eq!(parse_xa_statement("XA RECOVER"), None);
        assert_eq!(parse_xa_statement("XACT"), None);
        assert_eq!(parse_xa_statement("INSERT INTO xa VALUES (1)"), None);
        assert_eq!(parse_xa_statement("COMMIT"), None);
        for bad in [
            "XA COMMIT",
            "XA COMMIT X'abc'",
            "XA COMMIT X'zz'",
            "XA COMMIT 'unterminated",
            "XA COMMIT X'61',X'',1 TWO PHASE",
            "XA ROLLBACK X'61' ONE PHASE",
            "XA COMMIT X'61',X'',",
            "XA COMMIT plain",
        ] {
            assert!(
                matches!(parse_xa_statement(bad), Some(Err(_))),
                "{bad:?} must be refused, got {:?}",
                parse_xa_statement(bad)
            );
        }
    }

    #[test]
    fn display_is_the_canonical_text_and_round_trips() {
        let xid = id(&[0, 0xab], b"", 7);
        assert_eq!(xid.to_string(), "X'00ab',X'',7");
        assert_eq!(
            parse_xa_statement(&format!("XA ROLLBACK {xid}")),
            Some(Ok(XaStatement::Rollback(xid)))
        );
    }

    fn row(n: u8) -> DecodedRow {
        let mapping = std::sync::Arc::new(
            crate::decode::fixture_tests::mappings("tables = [\"d.outbox\"]\n").remove(0),
        );
        Ok(OutboxEvent {
            table: std::sync::Arc::clone(&mapping.table),
            mapping,
            id: Some(vec![n]),
            aggregate_type: "A".into(),
            aggregate_id: vec![n],
            event_type: None,
            event_key: None,
            payload: None,
            payload_is_json: false,
            partition: None,
            extra_headers: Vec::new(),
            envelope: Vec::new(),
            timestamp_ms: 0,
            column_timestamp: false,
            commit_ms: 0,
            position: BinlogPosition::new("b.000001", u64::from(n)),
            debezium: None,
        })
    }

    fn failure(n: u8) -> DecodedRow {
        Err(Box::new(RowFailure {
            error: RelayError::binlog(format!("row {n}")),
            key: Some(vec![n]),
            value: None,
            headers: Vec::new(),
        }))
    }

    fn ids(rows: &[DecodedRow]) -> Vec<u8> {
        rows.iter()
            .map(|r| match r {
                Ok(e) => e.aggregate_id[0],
                Err(f) => f.key.as_ref().map_or(0, |k| k[0]),
            })
            .collect()
    }

    fn boundary(pos: u64, advances: bool) -> TxBoundary {
        TxBoundary {
            position: BinlogPosition::new("b.000001", pos),
            gtid_set: Some(format!("0-1-{pos}")),
            advances,
            table_layouts: None,
        }
    }

    #[test]
    fn rows_wait_for_the_commit_and_boundaries_for_the_last_outcome() {
        let at = BinlogPosition::new("b.000001", 100);
        let mut xa = XaTracker::default();
        assert_eq!(xa.release(boundary(1, true)), Some(boundary(1, true)));

        // A: two rows (one undecodable: kept in place for the dead-letter decision), prepared.
        xa.start_group().expect("starts");
        assert!(xa.keep(vec![row(1), failure(2)]).is_none());
        assert!(xa.keep(vec![row(3)]).is_none());
        assert!(xa
            .prepare(id(b"A", b"", 1), false, &at)
            .expect("ok")
            .is_empty());
        assert_eq!(xa.release(boundary(2, true)), None, "A is undecided");
        // Rows outside XA groups pass through.
        assert_eq!(ids(&xa.keep(vec![row(9)]).expect("not kept")), [9]);

        // B: prepared with no outbox rows; still holds the checkpoint.
        xa.start_group().expect("starts");
        assert!(xa
            .prepare(id(b"B", b"", 1), false, &at)
            .expect("ok")
            .is_empty());
        assert_eq!(xa.release(boundary(3, false)), None);
        assert_eq!((xa.undecided(), xa.held_rows()), (2, 3));

        // Same XID prepared again while undecided: refused.
        xa.start_group().expect("starts");
        assert!(xa.prepare(id(b"A", b"", 1), false, &at).is_err());

        // A committed: its rows in their order; B still undecided, so no boundary yet.
        match xa.decide(&id(b"A", b"", 1), true) {
            Outcome::Known(rows) => assert_eq!(ids(&rows), [1, 2, 3]),
            Outcome::Unknown => panic!("A was prepared"),
        }
        assert_eq!(xa.release(boundary(4, false)), None);
        // The same XID again is unknown now.
        assert!(matches!(
            xa.decide(&id(b"A", b"", 1), true),
            Outcome::Unknown
        ));
        // Same gtrid, other formatID: another transaction.
        assert!(matches!(
            xa.decide(&id(b"B", b"", 2), false),
            Outcome::Unknown
        ));

        // B rolled back: nothing to relay; the boundary is reported and carries the withheld
        // boundaries' progress.
        match xa.decide(&id(b"B", b"", 1), false) {
            Outcome::Known(rows) => assert!(rows.is_empty()),
            Outcome::Unknown => panic!("B was prepared"),
        }
        assert_eq!(xa.release(boundary(5, false)), Some(boundary(5, true)));
        assert_eq!(xa.release(boundary(6, false)), Some(boundary(6, false)));
        assert_eq!((xa.undecided(), xa.held_rows()), (0, 0));
    }

    #[test]
    fn rolled_back_rows_are_dropped_and_one_phase_rows_pass() {
        let at = BinlogPosition::new("b.000001", 100);
        let mut xa = XaTracker::default();
        xa.start_group().expect("starts");
        assert!(xa.keep(vec![row(1)]).is_none());
        xa.prepare(id(b"R", b"q", 3), false, &at).expect("ok");
        match xa.decide(&id(b"R", b"q", 3), false) {
            Outcome::Known(rows) => assert!(rows.is_empty()),
            Outcome::Unknown => panic!("R was prepared"),
        }
        // MySQL one-phase commit: the prepare event itself commits.
        xa.start_group().expect("starts");
        assert!(xa.keep(vec![row(4), row(5)]).is_none());
        assert_eq!(
            ids(&xa.prepare(id(b"O", b"", 1), true, &at).expect("ok")),
            [4, 5]
        );
        assert_eq!(xa.undecided(), 0);
        // One-phase commit as a query ending the group.
        xa.start_group().expect("starts");
        assert!(xa.keep(vec![row(6)]).is_none());
        assert_eq!(ids(&xa.commit_group()), [6]);
        assert!(!xa.in_group());
    }

    #[test]
    fn an_xa_group_with_rows_cannot_end_unnoticed() {
        let mut xa = XaTracker::default();
        xa.start_group().expect("starts");
        assert!(
            xa.end_group_without_prepare().is_ok(),
            "no rows: nothing lost"
        );
        xa.start_group().expect("starts");
        assert!(xa.keep(vec![row(1)]).is_none());
        assert!(xa.start_group().is_err());
        xa.start_group().expect("starts");
        assert!(xa.keep(vec![row(1)]).is_none());
        assert!(xa.end_group_without_prepare().is_err());
    }
}

/// The decoder on a real MariaDB binlog with XA transactions (`testdata/README.md` lists what
/// the file holds, from `mariadb-binlog -vv`).
#[cfg(test)]
mod fixture_tests {
    use crate::binlog::source::BinlogFileSource;
    use crate::decode::Decoder;
    use outbox_relay_core::config::TableName;
    use outbox_relay_core::error::RelayError;

    const FILE: &str = "mariadb-xa-bin.000002";

    /// What the decoder reported, in order: `k1@875` for a row (event key @ end of its rows
    /// event), `|906 0-1-4` for a boundary.
    fn trace(from: u64) -> Result<Vec<String>, RelayError> {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(FILE);
        let mut source = BinlogFileSource::open(&path).expect("fixture opens");
        let mut decoder = Decoder::new(
            crate::decode::fixture_tests::mappings("tables = [\"shop.outbox\"]\n"),
            TableName::parse("shop.outbox_relay_checkpoint", None).expect("table"),
            None,
        );
        let mut out = Vec::new();
        let mut started = from == 0;
        while let Some(ev) = source.next_event() {
            let ev = ev.expect("event reads");
            if !started {
                // Table maps are kept by the file reader either way.
                started = ev.position.pos == from;
                continue;
            }
            let (rows, boundary) = decoder.decode(&ev, |id| source.table_map(id))?.into_parts();
            for row in rows {
                let row = row.expect("row decodes");
                let key = String::from_utf8(row.event_key.unwrap_or_default()).expect("text");
                out.push(format!("{key}@{}", row.position.pos));
            }
            if let Some(b) = boundary {
                assert_eq!(b.position.file, FILE);
                out.push(format!(
                    "|{} {}",
                    b.position.pos,
                    b.gtid_set.unwrap_or_default()
                ));
            }
        }
        Ok(out)
    }

    #[test]
    fn xa_rows_follow_their_commit_and_boundaries_wait_for_every_outcome() {
        assert_eq!(
            trace(0).expect("decodes"),
            [
                "k1@875",
                "|906 0-1-4",
                // xa-c prepared (1825): no boundary until X'00ff' is decided too.
                "k4@2311",
                "k6@3443",
                // XA COMMIT of xa-c (3620): its rows, from its PREPARE group, in order.
                "k2@1540",
                "k3@1540",
                "k7@4106",
                // XA ROLLBACK X'00ff' (4273): k5 dropped; nothing undecided any more.
                "|4273 0-1-11",
                "k8@4759",
                "|4790 0-1-12",
                // XA COMMIT … ONE PHASE: an ordinary transaction on MariaDB.
                "k9@5276",
                "|5307 0-1-13",
                // XA 'other' (no outbox rows): prepared at 5638, committed at 5781.
                "|5781 0-1-15",
            ]
        );
    }

    #[test]
    fn a_restart_from_a_reported_boundary_emits_the_same_rows() {
        let full = trace(0).expect("decodes");
        let after = |pos: &str| {
            let i = full
                .iter()
                .position(|s| s.starts_with(&format!("|{pos} ")))
                .expect("boundary reported");
            full[i + 1..].to_vec()
        };
        assert_eq!(trace(906).expect("decodes"), after("906"));
        assert_eq!(trace(4273).expect("decodes"), after("4273"));
    }

    #[test]
    fn a_commit_whose_prepare_was_not_read_stops_with_the_way_out() {
        // Started after xa-c's XA PREPARE (1825) while X'00ff' gets prepared later (2957).
        let err = trace(1825).expect_err("unknown XA COMMIT").to_string();
        assert!(
            err.contains("XA COMMIT X'78612d63',X'6231',7 (ending at mariadb-xa-bin.000002:3620)"),
            "{err}"
        );
        assert!(err.contains("before that XA PREPARE"), "{err}");
        assert!(
            !err.contains("continue right after"),
            "X'00ff' is undecided: skipping past this commit would strand it: {err}"
        );
        // Started after both PREPAREs: nothing else undecided, so skipping the commit is offered,
        // with the GTID position including it.
        let err = trace(3474).expect_err("unknown XA COMMIT").to_string();
        assert!(
            err.contains(
                "binlog_file = 'mariadb-xa-bin.000002', binlog_pos = 3620, rows_acked = 0, \
                 gtid_set = '0-1-9'"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_rollback_whose_prepare_was_not_read_is_harmless() {
        assert_eq!(
            trace(3620).expect("decodes"),
            [
                "k7@4106",
                "|4137 0-1-10",
                "|4273 0-1-11",
                "k8@4759",
                "|4790 0-1-12",
                "k9@5276",
                "|5307 0-1-13",
                "|5781 0-1-15",
            ]
        );
    }
}

/// The decoder on events shaped as MySQL 8 logs XA transactions (MySQL's `binlog.cc`: GTID,
/// `XA START` query, …, `XA END` query, XA_PREPARE event; the outcome a GTID and an
/// `XA COMMIT`/`XA ROLLBACK` query; ONE PHASE an XA_PREPARE event with `one_phase = 1`). No MySQL
/// server runs here, so the events are built by hand; rows are covered by the MariaDB fixture.
#[cfg(test)]
mod mysql_shape_tests {
    use mysql_async::binlog::events::{Event, FormatDescriptionEvent};
    use mysql_async::binlog::BinlogVersion;

    use crate::binlog::source::SourceEvent;
    use crate::decode::Decoder;
    use outbox_relay_core::config::TableName;
    use outbox_relay_core::error::RelayError;
    use outbox_relay_core::position::gtid::MysqlGtidSet;
    use outbox_relay_core::position::BinlogPosition;
    use outbox_relay_core::position::GtidState;

    const UUID: [u8; 16] = [0x55; 16];
    const UUID_TEXT: &str = "55555555-5555-5555-5555-555555555555";

    /// Events with consecutive positions in `binlog.000001`.
    struct Stream {
        pos: u32,
    }

    impl Stream {
        fn event(&mut self, event_type: u8, body: &[u8]) -> SourceEvent {
            let size = u32::try_from(19 + body.len()).expect("small");
            self.pos += size;
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&1_767_323_045u32.to_le_bytes());
            bytes.push(event_type);
            bytes.extend_from_slice(&1u32.to_le_bytes());
            bytes.extend_from_slice(&size.to_le_bytes());
            bytes.extend_from_slice(&self.pos.to_le_bytes());
            bytes.extend_from_slice(&0u16.to_le_bytes());
            bytes.extend_from_slice(body);
            let fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
            SourceEvent {
                event: Event::read(&fde, &bytes[..]).expect("event parses"),
                position: BinlogPosition::new("binlog.000001", u64::from(self.pos)),
                timestamp: 1_767_323_045,
                in_payload: false,
            }
        }

        /// GTID_LOG_EVENT (33), MySQL 5.6 layout: flags, sid, gno.
        fn gtid(&mut self, gno: i64) -> SourceEvent {
            let mut body = vec![1u8];
            body.extend_from_slice(&UUID);
            body.extend_from_slice(&gno.to_le_bytes());
            self.event(33, &body)
        }

        /// QUERY_EVENT (2): thread id, exec time, db length, error code, no status variables,
        /// db `shop`, the statement.
        fn query(&mut self, sql: &str) -> SourceEvent {
            let mut body = Vec::new();
            body.extend_from_slice(&7u32.to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.push(4);
            body.extend_from_slice(&0u16.to_le_bytes());
            body.extend_from_slice(&0u16.to_le_bytes());
            body.extend_from_slice(b"shop\0");
            body.extend_from_slice(sql.as_bytes());
            self.event(2, &body)
        }

        /// XID_EVENT (16).
        fn xid(&mut self) -> SourceEvent {
            self.event(16, &42u64.to_le_bytes())
        }

        /// XA_PREPARE_LOG_EVENT (38) of gtrid `gtrid`, empty bqual, formatID 1.
        fn xa_prepare(&mut self, gtrid: &[u8], one_phase: bool) -> SourceEvent {
            let mut body = vec![u8::from(one_phase)];
            body.extend_from_slice(&1u32.to_le_bytes());
            body.extend_from_slice(&u32::try_from(gtrid.len()).expect("small").to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(gtrid);
            self.event(38, &body)
        }
    }

    /// Decodes `events`; returns `|pos gtid_set` for each boundary.
    fn boundaries(events: &[SourceEvent]) -> Result<Vec<String>, RelayError> {
        let mut decoder = Decoder::new(
            crate::decode::fixture_tests::mappings("tables = [\"shop.outbox\"]\n"),
            TableName::parse("shop.outbox_relay_checkpoint", None).expect("table"),
            Some(GtidState::MySql(MysqlGtidSet::new())),
        );
        let mut out = Vec::new();
        for ev in events {
            let (rows, b) = decoder.decode(ev, |_| None)?.into_parts();
            assert!(rows.is_empty());
            if let Some(b) = b {
                out.push(format!(
                    "|{} {}",
                    b.position.pos,
                    b.gtid_set.unwrap_or_default()
                ));
            }
        }
        Ok(out)
    }

    #[test]
    fn prepared_groups_hold_boundaries_until_their_outcome() {
        let mut s = Stream { pos: 4 };
        let events = [
            // XA 'a' prepared (gno 1): no boundary, neither at XA START nor at the prepare.
            s.gtid(1),
            s.query("XA START X'61',X'',1"),
            s.query("XA END X'61',X'',1"),
            s.xa_prepare(b"a", false),
            // An ordinary transaction meanwhile (gno 2): held.
            s.gtid(2),
            s.query("BEGIN"),
            s.xid(),
            // XA COMMIT of 'a' (gno 3): the boundary, counting all three GTIDs.
            s.gtid(3),
            s.query("XA COMMIT X'61',X'',1"),
            // XA COMMIT 'b' ONE PHASE (gno 4): the prepare event commits.
            s.gtid(4),
            s.query("XA START X'62',X'',1"),
            s.query("XA END X'62',X'',1"),
            s.xa_prepare(b"b", true),
            // XA 'c' prepared (gno 5) and rolled back (gno 6).
            s.gtid(5),
            s.query("XA START X'63',X'',1"),
            s.query("XA END X'63',X'',1"),
            s.xa_prepare(b"c", false),
            s.gtid(6),
            s.query("XA ROLLBACK X'63',X'',1"),
        ];
        let ends: Vec<u64> = events.iter().map(|e| e.position.pos).collect();
        assert_eq!(
            boundaries(&events).expect("decodes"),
            [
                format!("|{} {UUID_TEXT}:1-3", ends[8]),
                format!("|{} {UUID_TEXT}:1-4", ends[12]),
                format!("|{} {UUID_TEXT}:1-6", ends[18]),
            ]
        );
    }

    #[test]
    fn an_unknown_commit_names_the_xid_and_the_gtid_set_after_it() {
        let mut s = Stream { pos: 4 };
        let events = [s.gtid(9), s.query("XA COMMIT X'7a',X'',1")];
        let err = boundaries(&events)
            .expect_err("unknown XA COMMIT")
            .to_string();
        assert!(
            err.contains("XA COMMIT X'7a',X'',1 (ending at binlog.000001:"),
            "{err}"
        );
        assert!(
            err.contains(&format!("gtid_set = '{UUID_TEXT}:9'")),
            "{err}"
        );
    }
}
