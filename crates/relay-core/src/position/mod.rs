//! Binlog coordinates, a leaf every stage uses: a file + offset position, MariaDB's GTID
//! position and MySQL's GTID sets ([`gtid`]), and the GTID state of a stream in either form
//! ([`GtidState`], with the GTID of one transaction, [`TransactionGtid`]).
//!
//! Each has a stable text form that is stored in the checkpoint table, so `Display` and
//! `FromStr` round-trip and the format is pinned by tests.

pub mod gtid;
mod state;

pub use state::{GtidState, GtidStateError, TransactionGtid};

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A position in the server's binlog: a file name exactly as `SHOW BINARY LOGS` lists it, and a
/// byte offset in that file.
///
/// The offset of a stored position is always the end of an event (an event header's `log_pos`,
/// MySQL Internals "Binlog Event Header"), so dumping from it starts at the next event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BinlogPosition {
    /// Binlog file name, e.g. `mariadb-bin.000042` (no directory).
    pub file: String,
    /// Byte offset in the file (events start at 4, after the magic header).
    pub pos: u64,
}

impl BinlogPosition {
    /// A position from its parts.
    pub fn new(file: impl Into<String>, pos: u64) -> Self {
        Self {
            file: file.into(),
            pos,
        }
    }

    /// Splits `base.000123` into (`base`, 123); `None` when the extension is not numeric.
    fn file_parts(&self) -> Option<(&str, u64)> {
        let (base, ext) = self.file.rsplit_once('.')?;
        Some((base, ext.parse().ok()?))
    }
}

/// Positions compare by file sequence number, then offset. Positions in files of different base
/// names (different servers) are unordered.
impl PartialOrd for BinlogPosition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        let (a_base, a_seq) = self.file_parts()?;
        let (b_base, b_seq) = other.file_parts()?;
        if a_base != b_base {
            return None;
        }
        Some(a_seq.cmp(&b_seq).then(self.pos.cmp(&other.pos)))
    }
}

impl fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

/// Error for text that is not a position or GTID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {text:?}: expected {expected}")]
pub struct ParsePositionError {
    what: &'static str,
    text: String,
    expected: &'static str,
}

impl FromStr for BinlogPosition {
    type Err = ParsePositionError;

    /// Parses `FILE:POS`, e.g. `mariadb-bin.000042:1234`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParsePositionError {
            what: "binlog position",
            text: s.to_owned(),
            expected: "FILE:POS, e.g. mariadb-bin.000042:1234",
        };
        let (file, pos) = s.rsplit_once(':').ok_or_else(err)?;
        if file.is_empty() || file.contains(['/', '\0']) {
            return Err(err());
        }
        Ok(Self::new(file, pos.parse().map_err(|_| err())?))
    }
}

/// One MariaDB GTID, `domain-server-sequence` (MariaDB KB "Global Transaction ID").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MariadbGtid {
    /// Replication domain id.
    pub domain_id: u32,
    /// `server_id` of the server that committed the transaction.
    pub server_id: u32,
    /// Sequence number within the domain.
    pub sequence: u64,
}

impl fmt::Display for MariadbGtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain_id, self.server_id, self.sequence)
    }
}

impl FromStr for MariadbGtid {
    type Err = ParsePositionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParsePositionError {
            what: "MariaDB GTID",
            text: s.to_owned(),
            expected: "DOMAIN-SERVER-SEQUENCE, e.g. 0-1-42",
        };
        let mut it = s.trim().splitn(3, '-');
        let mut next = || it.next().ok_or_else(err);
        let domain_id = next()?.parse().map_err(|_| err())?;
        let server_id = next()?.parse().map_err(|_| err())?;
        let sequence = next()?.parse().map_err(|_| err())?;
        Ok(Self {
            domain_id,
            server_id,
            sequence,
        })
    }
}

/// MariaDB's GTID position: the last GTID applied per replication domain, as in
/// `@@gtid_binlog_pos` and `@slave_connect_state` (comma-separated, ordered by domain).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MariadbGtidPos {
    by_domain: BTreeMap<u32, MariadbGtid>,
}

impl MariadbGtidPos {
    /// Records `gtid` as the latest of its domain.
    pub fn apply(&mut self, gtid: MariadbGtid) {
        self.by_domain.insert(gtid.domain_id, gtid);
    }

    /// `true` when no domain has a GTID yet.
    pub fn is_empty(&self) -> bool {
        self.by_domain.is_empty()
    }

    /// The GTIDs of `self` that `other` has not reached: a domain `other` lacks, or a higher
    /// sequence number than `other`'s in the same domain.
    pub fn beyond(&self, other: &MariadbGtidPos) -> Vec<MariadbGtid> {
        self.by_domain
            .iter()
            .filter(|(d, g)| {
                other
                    .by_domain
                    .get(d)
                    .is_none_or(|o| o.sequence < g.sequence)
            })
            .map(|(_, g)| *g)
            .collect()
    }
}

impl fmt::Display for MariadbGtidPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for gtid in self.by_domain.values() {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{gtid}")?;
        }
        Ok(())
    }
}

impl FromStr for MariadbGtidPos {
    type Err = ParsePositionError;

    /// Parses `0-1-42,1-7-9`; the empty string is the empty position.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut pos = Self::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            pos.apply(part.parse()?);
        }
        Ok(pos)
    }
}

/// An event of `type_code` from server 1 with `body` (no checksum), for tests.
#[cfg(test)]
pub(crate) fn test_event(type_code: u8, body: &[u8]) -> mysql_async::binlog::events::Event {
    use mysql_async::binlog::events::{Event, FormatDescriptionEvent};
    use mysql_async::binlog::BinlogVersion;
    let size = u32::try_from(19 + body.len()).expect("small event");
    let mut bytes = vec![0, 0, 0, 0, type_code, 1, 0, 0, 0];
    bytes.extend_from_slice(&size.to_le_bytes());
    bytes.extend_from_slice(&size.to_le_bytes());
    bytes.extend_from_slice(&[0, 0]);
    bytes.extend_from_slice(body);
    let fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
    Event::read(&fde, &bytes[..]).expect("event")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn persisted_position_format_is_pinned() {
        let p = BinlogPosition::new("mariadb-bin.000042", 1234);
        assert_eq!(p.to_string(), "mariadb-bin.000042:1234");
        assert_eq!("mariadb-bin.000042:1234".parse::<BinlogPosition>(), Ok(p));
    }

    #[test]
    fn positions_order_by_file_sequence_then_offset() {
        let a = BinlogPosition::new("bin.000009", 9000);
        let b = BinlogPosition::new("bin.000010", 4);
        let c = BinlogPosition::new("bin.1000000", 4);
        assert!(a < b);
        assert!(b < c);
        assert!(BinlogPosition::new("bin.000010", 5) > b);
        assert_eq!(
            BinlogPosition::new("other.000001", 4).partial_cmp(&a),
            None,
            "files of different servers are unordered"
        );
    }

    #[test]
    fn bad_positions_are_rejected() {
        for s in [
            "",
            "file",
            ":12",
            "file:",
            "file:-1",
            "file:12x",
            "dir/file:4",
        ] {
            assert!(s.parse::<BinlogPosition>().is_err(), "{s:?}");
        }
    }

    #[test]
    fn gtid_pos_keeps_latest_per_domain_in_domain_order() {
        let mut pos: MariadbGtidPos = "1-2-5,0-1-42".parse().expect("valid");
        assert_eq!(pos.to_string(), "0-1-42,1-2-5");
        pos.apply("0-3-43".parse().expect("valid"));
        assert_eq!(pos.to_string(), "0-3-43,1-2-5");
        assert!("".parse::<MariadbGtidPos>().expect("empty").is_empty());
        assert!("0-1".parse::<MariadbGtidPos>().is_err());
        assert!("a-1-2".parse::<MariadbGtidPos>().is_err());
    }

    proptest! {
        #[test]
        fn binlog_position_round_trips(base in "[a-z][a-z0-9_-]{0,20}", seq in 1u32..10_000_000, pos in any::<u64>()) {
            let p = BinlogPosition::new(format!("{base}.{seq:06}"), pos);
            prop_assert_eq!(p.to_string().parse::<BinlogPosition>(), Ok(p));
        }

        #[test]
        fn gtid_pos_round_trips(gtids in proptest::collection::vec((any::<u32>(), any::<u32>(), any::<u64>()), 0..8)) {
            let mut pos = MariadbGtidPos::default();
            for (domain_id, server_id, sequence) in gtids {
                pos.apply(MariadbGtid { domain_id, server_id, sequence });
            }
            prop_assert_eq!(pos.to_string().parse::<MariadbGtidPos>(), Ok(pos));
        }
    }
}
