//! The GTID state of a stream (what a checkpoint stores as `gtid_set`) and the GTID of one
//! transaction, in either server's form: MariaDB's position per domain ([`MariadbGtidPos`]) or
//! MySQL's executed set ([`MysqlGtidSet`]).
//!
//! Which form a server uses is its flavor's business
//! ([`outbox_relay_mysql::server::Flavor::parse_gtid_state`]); this module only holds the two forms and how a
//! committed transaction moves them.

use std::fmt;

use mysql_async::binlog::events::Event;

use crate::position::gtid::{Gtid, GtidError, MysqlGtidSet};
use crate::position::{MariadbGtid, MariadbGtidPos, ParsePositionError};

/// The GTID state the decoder keeps up to date: MariaDB's position per domain, or MySQL's
/// executed GTID set. Its text form is what the checkpoint stores as `gtid_set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GtidState {
    /// MariaDB `domain-server-seq` per domain.
    MariaDb(MariadbGtidPos),
    /// MySQL `uuid[:tag]:intervals`.
    MySql(MysqlGtidSet),
}

impl fmt::Display for GtidState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MariaDb(p) => p.fmt(f),
            Self::MySql(s) => s.fmt(f),
        }
    }
}

/// Why a text is not a GTID state of the expected form (the form's own parse error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GtidStateError {
    /// Not a MariaDB GTID position.
    #[error(transparent)]
    MariaDb(#[from] ParsePositionError),
    /// Not a MySQL GTID set.
    #[error(transparent)]
    MySql(#[from] GtidError),
}

/// One transaction's GTID, counted in the [`GtidState`] at its commit (never before: a GTID
/// counted before its commit would let a resume skip the transaction).
#[derive(Debug, Clone)]
pub enum TransactionGtid {
    /// From a MariaDB GTID event.
    MariaDb(MariadbGtid),
    /// From a MySQL GTID (or tagged GTID) event.
    MySql(Gtid),
}

impl GtidState {
    /// Counts a committed transaction's `gtid` in `state`. MariaDB's position starts with the
    /// first GTID seen when none was known (a position per domain needs no history); MySQL's
    /// set is tracked only from a known set (a set without its history would be wrong).
    pub fn count(state: &mut Option<Self>, gtid: TransactionGtid) {
        match (gtid, state) {
            (TransactionGtid::MySql(gtid), Some(Self::MySql(set))) => {
                set.add(&gtid);
            }
            (TransactionGtid::MariaDb(gtid), Some(Self::MariaDb(pos))) => pos.apply(gtid),
            (TransactionGtid::MariaDb(gtid), state @ None) => {
                let mut pos = MariadbGtidPos::default();
                pos.apply(gtid);
                *state = Some(Self::MariaDb(pos));
            }
            _ => {}
        }
    }
}

impl MariadbGtid {
    /// The GTID of a MariaDB GTID event (type 162) and its `flags2` byte. The body is seq_no
    /// u64, domain_id u32, flags2 u8, little-endian (MariaDB KB "GTID_EVENT"); the server_id is
    /// the event header's. `None` when the body is shorter than that (truncated).
    pub fn from_event(event: &Event) -> Option<(Self, u8)> {
        let data = event.data();
        let seq: [u8; 8] = data.get(0..8)?.try_into().ok()?;
        let domain: [u8; 4] = data.get(8..12)?.try_into().ok()?;
        let flags = *data.get(12)?;
        Some((
            Self {
                domain_id: u32::from_le_bytes(domain),
                server_id: event.header().server_id(),
                sequence: u64::from_le_bytes(seq),
            },
            flags,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mariadb(text: &str) -> MariadbGtid {
        text.parse().expect("MariaDB GTID")
    }

    /// A MariaDB GTID event (type 162) with `body`.
    fn gtid_event(body: &[u8]) -> Event {
        crate::position::test_event(162, body)
    }

    #[test]
    fn mariadb_gtid_event_body_is_read() {
        let mut body = 42u64.to_le_bytes().to_vec();
        body.extend_from_slice(&3u32.to_le_bytes());
        body.push(64); // FL_PREPARED_XA
        body.extend_from_slice(&[0; 6]);
        let (gtid, flags) = MariadbGtid::from_event(&gtid_event(&body)).expect("GTID");
        assert_eq!((gtid.to_string().as_str(), flags), ("3-1-42", 64));
        assert_eq!(MariadbGtid::from_event(&gtid_event(&body[..12])), None);
    }

    #[test]
    fn mariadb_state_starts_with_the_first_gtid() {
        let mut state = None;
        GtidState::count(&mut state, TransactionGtid::MariaDb(mariadb("0-1-5")));
        GtidState::count(&mut state, TransactionGtid::MariaDb(mariadb("1-2-9")));
        GtidState::count(&mut state, TransactionGtid::MariaDb(mariadb("0-1-6")));
        assert_eq!(state.map(|s| s.to_string()).as_deref(), Some("0-1-6,1-2-9"));
    }

    #[test]
    fn mysql_state_is_tracked_only_from_a_known_set() {
        let gtid: Gtid = "3e11fa47-71ca-11e1-9e33-c80aa9429562:7"
            .parse()
            .expect("GTID");
        let mut unknown = None;
        GtidState::count(&mut unknown, TransactionGtid::MySql(gtid.clone()));
        assert_eq!(unknown, None);
        let mut known = Some(GtidState::MySql(
            "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-6"
                .parse()
                .expect("set"),
        ));
        GtidState::count(&mut known, TransactionGtid::MySql(gtid));
        assert_eq!(
            known.map(|s| s.to_string()).as_deref(),
            Some("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-7")
        );
        // A GTID of the other form leaves the state alone.
        let mut other = Some(GtidState::MariaDb(MariadbGtidPos::default()));
        let before = other.clone();
        GtidState::count(
            &mut other,
            TransactionGtid::MySql(
                "3e11fa47-71ca-11e1-9e33-c80aa9429562:1"
                    .parse()
                    .expect("GTID"),
            ),
        );
        assert_eq!(other, before);
    }
}
