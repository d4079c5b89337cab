//! MySQL GTID sets (`@@gtid_executed`), including MySQL 8.4 tagged GTIDs.
//!
//! A MySQL GTID is `UUID:NUMBER`, or `UUID:TAG:NUMBER` for a tagged GTID (MySQL 8.3+): the
//! server UUID of the source that committed the transaction, an optional tag naming a group of
//! transactions, and the transaction number (GNO, `1..=`[`MAX_GNO`]). A [`MysqlGtidSet`] holds
//! any number of them as sorted, merged intervals per (UUID, tag).
//!
//! # Text form
//!
//! [`MysqlGtidSet`]'s `Display` writes what MySQL's `Gtid_set::to_string` writes for
//! `@@gtid_executed` (`sql/rpl_gtid_set.cc`), with `,` between UUIDs:
//!
//! ```text
//! 3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:11:domain_1:1-3:15-21:domain_2:8-52,4e11fa47-71ca-11e1-9e33-c80aa9429562:7
//! ```
//!
//! - UUIDs lowercase, canonical `8-4-4-4-12`, sorted (by their 16 bytes, which is also their
//!   text order), each written once;
//! - after a UUID, first its untagged intervals, then for each tag in ascending order `:tag`
//!   followed by that tag's intervals;
//! - intervals ascending, merged (overlapping or adjacent ones become one), written `a-b`, or `a`
//!   when `a == b`;
//! - the empty set is the empty string.
//!
//! MySQL itself separates UUIDs with `,\n`; the alternate form (`{:#}`) writes that.
//!
//! `FromStr` accepts everything `Display` writes plus what MySQL prints or accepts in practice:
//! UUIDs and tags in any letter case (normalised to lowercase, as MySQL does), whitespace
//! (including newlines) around every element, the same UUID in several comma-separated
//! entries, intervals in any order, overlapping or adjacent, and empty entries between commas.
//! It is stricter than MySQL where MySQL silently ignores nonsense: a reversed interval (`5-3`)
//! and a UUID or tag not followed by any interval are errors here (MySQL drops them), and GNOs
//! must be plain decimal numbers.
//!
//! # Requesting a binlog stream
//!
//! [`MysqlGtidSet::to_sids`] gives the `Sid`s that `mysql_async::BinlogStreamRequest::with_gtid_set`
//! encodes into `COM_BINLOG_DUMP_GTID`. Tagged sets are supported; see that method.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

use mysql_async::binlog::events::{Event, GtidEvent, PreviousGtidsEvent};
use mysql_async::{GnoInterval, Sid};

/// The largest transaction number MySQL assigns or accepts (`GNO_END - 1`, `GNO_END` being
/// `INT64_MAX`, in `sql/rpl_gtid.h`).
pub const MAX_GNO: u64 = i64::MAX as u64 - 1;

/// The longest tag MySQL accepts (`mysql::gtid::tag_max_length`).
pub const MAX_TAG_LEN: usize = 32;

/// Why a GTID, a GTID set, or one of their parts is invalid. Each variant carries the offending
/// text (or value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GtidError {
    /// Not a server UUID (`8-4-4-4-12` hexadecimal digits).
    #[error("invalid server UUID {0:?}: expected 8-4-4-4-12 hexadecimal digits")]
    InvalidUuid(String),
    /// Not a GTID tag.
    #[error(
        "invalid GTID tag {0:?}: expected 1 to 32 characters, a letter or '_' first, then \
         letters, digits or '_'"
    )]
    InvalidTag(String),
    /// Not a transaction number: not a decimal number, 0, or above [`MAX_GNO`].
    #[error("invalid transaction number {0:?}: expected a decimal number from 1 to {MAX_GNO}")]
    InvalidGno(String),
    /// An interval that is not `N` or `N-M` with decimal numbers `N` and `M`.
    #[error("invalid interval {0:?}: expected N or N-M, N and M decimal numbers")]
    InvalidInterval(String),
    /// An interval `a-b` with `b < a`.
    #[error("invalid interval {0:?}: its end is before its start")]
    ReversedInterval(String),
    /// An empty element between two `:` or at the end of an entry (`uuid::1`, `uuid:1:`).
    #[error("invalid GTID set entry {0:?}: empty element between ':' separators")]
    EmptyElement(String),
    /// A UUID or tag with no interval after it (`uuid`, `uuid:tag`, `uuid:tag1:tag2:1`).
    #[error("invalid GTID set entry {0:?}: a UUID or tag must be followed by ':' and an interval")]
    MissingInterval(String),
    /// A single GTID that is not `UUID:NUMBER` or `UUID:TAG:NUMBER`.
    #[error("invalid GTID {0:?}: expected UUID:NUMBER or UUID:TAG:NUMBER")]
    InvalidGtid(String),
    /// A PREVIOUS_GTIDS event whose counts do not fit its bytes.
    #[error("malformed PREVIOUS_GTIDS event: {0}")]
    MalformedEvent(String),
    /// An interval from the binary protocol (half-open `[start, end)`) that is empty or out of
    /// range.
    #[error("invalid GTID interval [{start}, {end}) of {source_id}: expected 1 <= start < end <= {}", MAX_GNO + 1)]
    InvalidEncodedInterval {
        /// The source (`uuid` or `uuid:tag`) the interval belongs to.
        source_id: String,
        /// First transaction number of the interval.
        start: u64,
        /// One past its last transaction number.
        end: u64,
    },
}

/// A server UUID (`@@server_uuid`), the source part of a GTID.
///
/// Ordered by its 16 bytes, which is also the order of its lowercase text form. Displayed
/// lowercase, `8-4-4-4-12`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerUuid([u8; 16]);

impl ServerUuid {
    /// The UUID with these bytes (as in binlog events and `COM_BINLOG_DUMP_GTID`).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The 16 bytes of the UUID.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl FromStr for ServerUuid {
    type Err = GtidError;

    /// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hexadecimal digits in either case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || GtidError::InvalidUuid(s.to_owned());
        let text = s.as_bytes();
        if text.len() != 36 {
            return Err(err());
        }
        let mut bytes = [0u8; 16];
        let mut nibbles = 0usize;
        for (i, &c) in text.iter().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                if c != b'-' {
                    return Err(err());
                }
                continue;
            }
            let value = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return Err(err()),
            };
            let byte = &mut bytes[nibbles / 2];
            *byte = (*byte << 4) | value;
            nibbles += 1;
        }
        Ok(Self(bytes))
    }
}

impl fmt::Display for ServerUuid {
    /// `8-4-4-4-12` lowercase hex digits, written at once: a GTID set's text is made at every
    /// transaction's end, and a `write!` per byte was most of its cost.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [b'-'; 36];
        let mut at = 0;
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                at += 1; // the `-` already there
            }
            text[at] = HEX[usize::from(b >> 4)];
            text[at + 1] = HEX[usize::from(b & 0x0f)];
            at += 2;
        }
        // Only ASCII hex digits and `-` were written.
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

/// A GTID tag (MySQL 8.3+): 1 to [`MAX_TAG_LEN`] characters `[a-z_][a-z0-9_]*`.
///
/// Parsing accepts uppercase letters and lowercases them, as MySQL does (`SET gtid_next =
/// 'uuid:Domain_1:1'` logs `domain_1`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GtidTag(String);

impl GtidTag {
    /// Validates `tag` and lowercases it.
    ///
    /// # Errors
    /// [`GtidError::InvalidTag`] when `tag` is empty, longer than [`MAX_TAG_LEN`], does not start
    /// with a letter or `_`, or has characters other than letters, digits and `_`.
    pub fn new(tag: &str) -> Result<Self, GtidError> {
        let mut chars = tag.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok
            || tag.len() > MAX_TAG_LEN
            || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(GtidError::InvalidTag(tag.to_owned()));
        }
        Ok(Self(tag.to_ascii_lowercase()))
    }

    /// The tag, lowercase.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for GtidTag {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl FromStr for GtidTag {
    type Err = GtidError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for GtidTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One MySQL GTID: `UUID:NUMBER` or `UUID:TAG:NUMBER`, the identifier of one transaction.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gtid {
    uuid: ServerUuid,
    tag: Option<GtidTag>,
    gno: u64,
}

impl Gtid {
    /// The GTID of transaction `gno` of source `uuid`, tagged `tag`.
    ///
    /// # Errors
    /// [`GtidError::InvalidGno`] when `gno` is 0 or above [`MAX_GNO`].
    pub fn new(uuid: ServerUuid, tag: Option<GtidTag>, gno: u64) -> Result<Self, GtidError> {
        if !(1..=MAX_GNO).contains(&gno) {
            return Err(GtidError::InvalidGno(gno.to_string()));
        }
        Ok(Self { uuid, tag, gno })
    }

    /// The source's server UUID.
    pub fn uuid(&self) -> ServerUuid {
        self.uuid
    }

    /// The tag, for a tagged GTID.
    pub fn tag(&self) -> Option<&GtidTag> {
        self.tag.as_ref()
    }

    /// The transaction number, `1..=`[`MAX_GNO`].
    pub fn gno(&self) -> u64 {
        self.gno
    }
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tag {
            Some(tag) => write!(f, "{}:{tag}:{}", self.uuid, self.gno),
            None => write!(f, "{}:{}", self.uuid, self.gno),
        }
    }
}

impl FromStr for Gtid {
    type Err = GtidError;

    /// Parses `UUID:NUMBER` or `UUID:TAG:NUMBER` (whitespace around the parts is ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').map(trim_ws).collect();
        let (uuid, tag, gno) = match parts.as_slice() {
            [uuid, gno] => (uuid, None, gno),
            [uuid, tag, gno] => (uuid, Some(GtidTag::new(tag)?), gno),
            _ => return Err(GtidError::InvalidGtid(s.to_owned())),
        };
        Self::new(uuid.parse()?, tag, parse_gno(gno)?)
    }
}

/// The GTID of the transaction a binlog GTID event starts: a `GTID_LOG_EVENT` (type 33) or a
/// MySQL 8.3+ `GTID_TAGGED_LOG_EVENT` (type 42), both of which `mysql_common` parses into
/// [`GtidEvent`] (`EventData::GtidEvent`).
///
/// # Errors
/// [`GtidError::InvalidGno`] for a transaction number of 0 (an anonymous transaction, logged
/// with `gtid_mode` `OFF`/`OFF_PERMISSIVE`: it has no GTID) or above [`MAX_GNO`];
/// [`GtidError::InvalidTag`] for a tag MySQL would not write.
pub fn gtid_from_event(event: &GtidEvent) -> Result<Gtid, GtidError> {
    let tag = event.tag().map(|t| GtidTag::new(t.as_str())).transpose()?;
    Gtid::new(ServerUuid::from_bytes(event.sid()), tag, event.gno())
}

/// The interval `[start, end)` of transaction numbers (half-open, as MySQL stores it).
type Interval = (u64, u64);

/// Sorted, disjoint, non-adjacent, non-empty half-open intervals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct IntervalSet(Vec<Interval>);

impl IntervalSet {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `[start, end)` (`start < end`), merging it with every interval it overlaps or
    /// touches. Appending at or after the end of the last interval is O(1).
    fn insert(&mut self, start: u64, end: u64) {
        debug_assert!(start < end);
        let v = &mut self.0;
        match v.last_mut() {
            None => {
                v.push((start, end));
                return;
            }
            Some(last) if start > last.1 => {
                v.push((start, end));
                return;
            }
            Some(last) if start >= last.0 => {
                last.1 = last.1.max(end);
                return;
            }
            Some(_) => {}
        }
        // First interval that ends at or after `start` (touching counts), and one past the last
        // that starts at or before `end`: everything in between merges with [start, end).
        let first = v.partition_point(|iv| iv.1 < start);
        let past = v.partition_point(|iv| iv.0 <= end);
        if first == past {
            v.insert(first, (start, end));
        } else {
            let merged = (start.min(v[first].0), end.max(v[past - 1].1));
            v[first] = merged;
            v.drain(first + 1..past);
        }
    }

    fn contains(&self, gno: u64) -> bool {
        let i = self.0.partition_point(|iv| iv.1 <= gno);
        self.0.get(i).is_some_and(|iv| iv.0 <= gno)
    }

    fn merge(&mut self, other: &Self) {
        for &(start, end) in &other.0 {
            self.insert(start, end);
        }
    }

    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &(start, end) in &self.0 {
            if end - 1 == start {
                write!(f, ":{start}")?;
            } else {
                write!(f, ":{start}-{}", end - 1)?;
            }
        }
        Ok(())
    }

    fn to_gno_intervals(&self) -> Vec<GnoInterval> {
        self.0
            .iter()
            .map(|&(s, e)| GnoInterval::new(s, e))
            .collect()
    }
}

/// The GTIDs of one server UUID: untagged ones and, per tag, tagged ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct UuidSet {
    untagged: IntervalSet,
    /// Never holds an empty interval set.
    tagged: BTreeMap<GtidTag, IntervalSet>,
}

impl UuidSet {
    fn intervals_mut(&mut self, tag: Option<&GtidTag>) -> &mut IntervalSet {
        match tag {
            None => &mut self.untagged,
            Some(tag) => self.tagged.entry(tag.clone()).or_default(),
        }
    }

    fn intervals(&self, tag: Option<&str>) -> Option<&IntervalSet> {
        match tag {
            None => Some(&self.untagged),
            Some(tag) => self.tagged.get(tag),
        }
    }

    /// (tag, intervals) pairs, untagged first, each non-empty.
    fn entries(&self) -> impl Iterator<Item = (Option<&GtidTag>, &IntervalSet)> {
        std::iter::once((None, &self.untagged))
            .filter(|(_, ivs)| !ivs.is_empty())
            .chain(self.tagged.iter().map(|(tag, ivs)| (Some(tag), ivs)))
    }
}

/// A set of MySQL GTIDs, such as `@@gtid_executed`: per server UUID and tag, the transaction
/// numbers as sorted, merged intervals.
///
/// The representation is canonical, so `==` is set equality whatever order the GTIDs were
/// added or parsed in, and `Display` → `FromStr` round-trips exactly. See the
/// [module documentation](self) for the text form.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MysqlGtidSet {
    /// Never holds a `UuidSet` without any GTID.
    sources: BTreeMap<ServerUuid, UuidSet>,
}

impl MysqlGtidSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// `true` when the set holds no GTID.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// `true` when any GTID of the set is tagged.
    pub fn has_tags(&self) -> bool {
        self.sources.values().any(|s| !s.tagged.is_empty())
    }

    /// Adds one transaction's GTID. Returns `false` when the set already held it.
    ///
    /// Adding the next number of a source (`gno` = last + 1, the usual case while following a
    /// binlog) extends the last interval in constant time.
    pub fn add(&mut self, gtid: &Gtid) -> bool {
        let ivs = self
            .sources
            .entry(gtid.uuid)
            .or_default()
            .intervals_mut(gtid.tag.as_ref());
        if ivs.contains(gtid.gno) {
            return false;
        }
        ivs.insert(gtid.gno, gtid.gno + 1);
        true
    }

    /// Adds the transactions `first..=last` of source `uuid`, tagged `tag`.
    ///
    /// # Errors
    /// [`GtidError::InvalidGno`] when `first` or `last` is 0 or above [`MAX_GNO`];
    /// [`GtidError::ReversedInterval`] when `last < first`. The set is unchanged then.
    pub fn add_interval(
        &mut self,
        uuid: ServerUuid,
        tag: Option<&GtidTag>,
        first: u64,
        last: u64,
    ) -> Result<(), GtidError> {
        for gno in [first, last] {
            if !(1..=MAX_GNO).contains(&gno) {
                return Err(GtidError::InvalidGno(gno.to_string()));
            }
        }
        if last < first {
            return Err(GtidError::ReversedInterval(format!("{first}-{last}")));
        }
        self.sources
            .entry(uuid)
            .or_default()
            .intervals_mut(tag)
            .insert(first, last + 1);
        Ok(())
    }

    /// `true` when the set holds GTID `uuid[:tag]:gno`.
    pub fn contains(&self, uuid: &ServerUuid, tag: Option<&GtidTag>, gno: u64) -> bool {
        self.sources
            .get(uuid)
            .and_then(|s| s.intervals(tag.map(GtidTag::as_str)))
            .is_some_and(|ivs| ivs.contains(gno))
    }

    /// Adds every GTID of `other` to this set.
    pub fn merge(&mut self, other: &MysqlGtidSet) {
        for (uuid, theirs) in &other.sources {
            let ours = self.sources.entry(*uuid).or_default();
            for (tag, ivs) in theirs.entries() {
                ours.intervals_mut(tag).merge(ivs);
            }
        }
    }

    /// The set of GTIDs in this set or in `other`.
    pub fn union(&self, other: &MysqlGtidSet) -> MysqlGtidSet {
        let mut out = self.clone();
        out.merge(other);
        out
    }

    /// Every interval of the set, in text order: (UUID, tag, first..=last).
    pub fn intervals(
        &self,
    ) -> impl Iterator<Item = (ServerUuid, Option<&GtidTag>, RangeInclusive<u64>)> + '_ {
        self.sources.iter().flat_map(|(uuid, s)| {
            s.entries().flat_map(move |(tag, ivs)| {
                ivs.0
                    .iter()
                    .map(move |&(start, end)| (*uuid, tag, start..=end - 1))
            })
        })
    }

    /// The set as the `Sid`s of a `COM_BINLOG_DUMP_GTID` request, for
    /// `mysql_async::BinlogStreamRequest::with_gtid_set`: one `Sid` per (UUID, tag) with
    /// intervals, sorted as MySQL sorts them (by UUID, untagged before tagged, tags ascending).
    ///
    /// # Tagged GTIDs on the wire
    ///
    /// mysql_common 0.37 (which mysql_async 0.37 uses) encodes tagged sets: as soon as one `Sid`
    /// has a tag, `ComBinlogDumpGtid` writes the whole sid block in MySQL's tagged format
    /// (`Gtid_format::tagged`, MySQL 8.3+): the 8-byte count with format 1 in its top byte and
    /// the count in bits 8..56, and before each entry's intervals its tag length (MySQL's
    /// variable-length integer, 0 for untagged) and tag bytes. This is the layout MySQL's
    /// `Gtid_set::encode` writes (checked byte for byte in this module's tests against a
    /// PREVIOUS_GTIDS event written by MySQL 9.6), except that mysql_common leaves the count's
    /// low byte 0 where MySQL repeats the format there; MySQL's `decode_nsids_format` reads
    /// the format from the top byte only and masks the low byte off.
    ///
    /// Servers before 8.3 do not understand the tagged format and refuse it as a malformed GTID
    /// set, but such servers cannot have tagged GTIDs either; a set without tags is sent in the
    /// classic format every version accepts.
    ///
    /// # Errors
    /// Only if mysql_common refuses one of the (already validated) tags, which it does not for
    /// any tag [`GtidTag`] accepts: [`GtidError::InvalidTag`].
    pub fn to_sids(&self) -> Result<Vec<Sid<'static>>, GtidError> {
        let mut sids = Vec::new();
        for (uuid, s) in &self.sources {
            for (tag, ivs) in s.entries() {
                let mut sid = Sid::new(*uuid.as_bytes()).with_intervals(ivs.to_gno_intervals());
                if let Some(tag) = tag {
                    let tag = mysql_common::packets::Tag::new(tag.as_str().to_owned())
                        .map_err(|_| GtidError::InvalidTag(tag.as_str().to_owned()))?;
                    sid = sid.with_tag(tag);
                }
                sids.push(sid);
            }
        }
        Ok(sids)
    }

    /// The set a list of `Sid`s describes (as in a `COM_BINLOG_DUMP_GTID` request).
    ///
    /// # Errors
    /// [`GtidError::InvalidEncodedInterval`] for an interval that is empty or out of range;
    /// [`GtidError::InvalidTag`] for a tag MySQL would not write.
    pub fn from_sids<'a, 'b: 'a>(
        sids: impl IntoIterator<Item = &'a Sid<'b>>,
    ) -> Result<Self, GtidError> {
        let mut set = Self::new();
        for sid in sids {
            let tag = sid.tag().map(|t| t.as_str());
            set.add_encoded(sid.uuid(), tag, sid.intervals())?;
        }
        Ok(set)
    }

    /// The set of GTIDs a binlog file's PREVIOUS_GTIDS event says were logged before it:
    /// `@@gtid_executed` as it was when the server started writing the file (less purged GTIDs
    /// on some versions). Tagged entries (MySQL 8.3+) included.
    ///
    /// # Errors
    /// As [`MysqlGtidSet::from_sids`].
    pub fn from_previous_gtids(event: &PreviousGtidsEvent<'_>) -> Result<Self, GtidError> {
        let mut set = Self::new();
        for sid in event.sids() {
            let tag = sid.tag().map(|t| t.as_str());
            set.add_encoded(sid.uuid(), tag, sid.intervals())?;
        }
        Ok(set)
    }

    /// The set of a PREVIOUS_GTIDS `event` (see [`MysqlGtidSet::from_previous_gtids`]). Its
    /// counts of sources and intervals are checked against the event's bytes first:
    /// mysql_common reserves memory for as many as they say.
    ///
    /// # Errors
    /// [`GtidError::MalformedEvent`] for counts the bytes cannot hold or an event mysql_common
    /// cannot read; else as [`MysqlGtidSet::from_previous_gtids`].
    pub fn from_previous_gtids_event(event: &Event) -> Result<Self, GtidError> {
        check_previous_gtids(event.data()).map_err(GtidError::MalformedEvent)?;
        let parsed = event
            .read_event::<PreviousGtidsEvent<'_>>()
            .map_err(|e| GtidError::MalformedEvent(e.to_string()))?;
        Self::from_previous_gtids(&parsed)
    }

    /// Adds half-open protocol intervals of (`uuid`, `tag`), validating them first.
    fn add_encoded(
        &mut self,
        uuid: [u8; 16],
        tag: Option<&str>,
        intervals: &[GnoInterval],
    ) -> Result<(), GtidError> {
        let uuid = ServerUuid::from_bytes(uuid);
        let tag = tag.map(GtidTag::new).transpose()?;
        for iv in intervals {
            let (start, end) = (iv.start(), iv.end());
            if start == 0 || end <= start || end > MAX_GNO + 1 {
                return Err(GtidError::InvalidEncodedInterval {
                    source_id: match &tag {
                        Some(tag) => format!("{uuid}:{tag}"),
                        None => uuid.to_string(),
                    },
                    start,
                    end,
                });
            }
        }
        if intervals.is_empty() {
            return Ok(());
        }
        let ivs = self
            .sources
            .entry(uuid)
            .or_default()
            .intervals_mut(tag.as_ref());
        for iv in intervals {
            ivs.insert(iv.start(), iv.end());
        }
        Ok(())
    }
}

impl fmt::Display for MysqlGtidSet {
    /// The text form of the [module documentation](self); `{:#}` separates UUIDs with `,\n`
    /// like MySQL.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let separator = if f.alternate() { ",\n" } else { "," };
        for (i, (uuid, s)) in self.sources.iter().enumerate() {
            if i > 0 {
                f.write_str(separator)?;
            }
            write!(f, "{uuid}")?;
            for (tag, ivs) in s.entries() {
                if let Some(tag) = tag {
                    write!(f, ":{tag}")?;
                }
                ivs.write(f)?;
            }
        }
        Ok(())
    }
}

impl FromStr for MysqlGtidSet {
    type Err = GtidError;

    /// Parses a GTID set as MySQL prints or accepts it (see the
    /// [module documentation](self)): comma-separated entries
    /// `UUID[:INTERVAL...][:TAG:INTERVAL[:INTERVAL...]...]`, `INTERVAL` being `N` or `N-M`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut set = Self::new();
        for entry in s.split(',') {
            let entry = trim_ws(entry);
            if entry.is_empty() {
                continue; // MySQL allows empty entries ("a,,b", ",")
            }
            let mut parts = entry.split(':').map(trim_ws);
            let uuid: ServerUuid = parts.next().unwrap_or_default().parse()?;
            let mut tag: Option<GtidTag> = None;
            // A UUID may be followed by intervals, by a tag, or both; a tag must be followed by
            // at least one interval. `waiting`: the UUID or the last tag has no interval yet.
            let mut waiting = true;
            let mut tag_waiting = false;
            for part in parts {
                match part.chars().next() {
                    None => return Err(GtidError::EmptyElement(entry.to_owned())),
                    Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                        if tag_waiting {
                            return Err(GtidError::MissingInterval(entry.to_owned()));
                        }
                        tag = Some(GtidTag::new(part)?);
                        (waiting, tag_waiting) = (true, true);
                    }
                    Some(_) => {
                        let (first, last) = parse_interval(part)?;
                        set.sources
                            .entry(uuid)
                            .or_default()
                            .intervals_mut(tag.as_ref())
                            .insert(first, last + 1);
                        (waiting, tag_waiting) = (false, false);
                    }
                }
            }
            if waiting {
                return Err(GtidError::MissingInterval(entry.to_owned()));
            }
        }
        Ok(set)
    }
}

/// Checks that the source and interval counts of a PREVIOUS_GTIDS event body (`Gtid_set::encode`:
/// an 8-byte word with the format and the source count, then per source the UUID, in the tagged
/// format a tag as a mysql::serialization string, the interval count and 16 bytes per interval)
/// fit the bytes that follow them.
fn check_previous_gtids(body: &[u8]) -> Result<(), String> {
    let take = |rest: &mut &[u8], n: u64, what: &str| -> Result<(), String> {
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= rest.len())
            .ok_or_else(|| format!("{what} needs {n} bytes, {} are left", rest.len()))?;
        *rest = &rest[n..];
        Ok(())
    };
    let u64_at =
        |rest: &[u8]| -> Option<u64> { Some(u64::from_le_bytes(rest.get(..8)?.try_into().ok()?)) };
    let mut rest = body;
    let word = u64_at(rest).ok_or("the event is shorter than its 8-byte header")?;
    take(&mut rest, 8, "the header")?;
    let tagged = word >> 56 != 0;
    let sources = if tagged {
        (word >> 8) & ((1 << 48) - 1)
    } else {
        word & ((1 << 56) - 1)
    };
    // A source takes at least 24 bytes (UUID and interval count).
    if sources > rest.len() as u64 / 24 {
        return Err(format!(
            "it counts {sources} sources in {} bytes",
            rest.len()
        ));
    }
    for _ in 0..sources {
        take(&mut rest, 16, "a UUID")?;
        if tagged {
            // mysql::serialization varlen: the first byte's trailing ones + 1 bytes (9 for 0xff).
            let first = *rest.first().ok_or("a tag length is missing")?;
            let len = (first.trailing_ones() as usize + 1).min(9);
            let bytes = rest.get(..len).ok_or("a tag length is cut short")?;
            let mut le = [0u8; 8];
            let tag_len = if len == 9 {
                le.copy_from_slice(&bytes[1..]);
                u64::from_le_bytes(le)
            } else {
                le[..len].copy_from_slice(bytes);
                u64::from_le_bytes(le) >> len
            };
            take(&mut rest, len as u64, "a tag length")?;
            take(&mut rest, tag_len, "a tag")?;
        }
        let intervals = u64_at(rest).ok_or("an interval count is missing")?;
        take(&mut rest, 8, "an interval count")?;
        take(
            &mut rest,
            intervals.saturating_mul(16),
            &format!("{intervals} intervals"),
        )?;
    }
    Ok(())
}

/// `s` without leading and trailing ASCII whitespace (MySQL's `SKIP_WHITESPACE`).
fn trim_ws(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_ascii_whitespace())
}

/// A transaction number: decimal digits only, `1..=MAX_GNO`.
fn parse_gno(s: &str) -> Result<u64, GtidError> {
    let err = || GtidError::InvalidGno(s.to_owned());
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    match s.parse::<u64>() {
        Ok(n) if (1..=MAX_GNO).contains(&n) => Ok(n),
        _ => Err(err()),
    }
}

/// `N` or `N-M` (whitespace allowed around `-`), as inclusive bounds.
fn parse_interval(s: &str) -> Result<(u64, u64), GtidError> {
    let (first, last) = match s.split_once('-') {
        None => (s, None),
        Some((first, last)) => (trim_ws(first), Some(trim_ws(last))),
    };
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !digits(first) || !last.is_none_or(digits) {
        return Err(GtidError::InvalidInterval(s.to_owned()));
    }
    let first = parse_gno(first)?;
    let last = match last {
        Some(last) => parse_gno(last)?,
        None => first,
    };
    if last < first {
        return Err(GtidError::ReversedInterval(s.to_owned()));
    }
    Ok((first, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    const B: &str = "4e11fa47-71ca-11e1-9e33-c80aa9429562";
    const C: &str = "0e11fa47-71ca-11e1-9e33-c80aa9429562";

    /// A PREVIOUS_GTIDS event (no checksum) with `body`.
    fn previous_gtids_event(body: &[u8]) -> Event {
        crate::position::test_event(35, body)
    }

    /// Found by fuzzing (gtid_sets): mysql_common reserves memory for as many sources and
    /// intervals as a PREVIOUS_GTIDS event counts (an abort for a damaged count, not an error).
    #[test]
    fn previous_gtids_counts_are_checked_against_the_event() {
        let uuid: [u8; 16] = core::array::from_fn(|i| i as u8);
        let interval = [1u64.to_le_bytes(), 4u64.to_le_bytes()].concat();
        let entry = |count: u64| [&uuid[..], &count.to_le_bytes(), &interval].concat();
        let untagged = |sources: u64, intervals: u64| {
            [sources.to_le_bytes().to_vec(), entry(intervals)].concat()
        };
        let tagged = |tag_len: u8| {
            let word: u64 = 1 | 1 << 8 | 1 << 56;
            [
                &word.to_le_bytes()[..],
                &uuid,
                &[tag_len << 1],
                b"tag",
                &1u64.to_le_bytes(),
                &interval,
            ]
            .concat()
        };
        let good = MysqlGtidSet::from_previous_gtids_event(&previous_gtids_event(&untagged(1, 1)))
            .expect("one source, one interval");
        assert_eq!(good.to_string(), "00010203-0405-0607-0809-0a0b0c0d0e0f:1-3");
        let good = MysqlGtidSet::from_previous_gtids_event(&previous_gtids_event(&tagged(3)))
            .expect("tagged");
        assert_eq!(
            good.to_string(),
            "00010203-0405-0607-0809-0a0b0c0d0e0f:tag:1-3"
        );
        for (body, expected) in [
            (
                untagged(1 << 55, 1),
                "it counts 36028797018963968 sources in 40 bytes",
            ),
            (untagged(1, 1 << 60), "1152921504606846976 intervals needs"),
            (tagged(100), "a tag needs 100 bytes, 27 are left"),
            (vec![1, 2, 3], "shorter than its 8-byte header"),
        ] {
            match MysqlGtidSet::from_previous_gtids_event(&previous_gtids_event(&body)) {
                Err(GtidError::MalformedEvent(e)) => assert!(e.contains(expected), "{e}"),
                other => panic!("{expected}: {other:?}"),
            }
        }
    }

    fn set(s: &str) -> MysqlGtidSet {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn uuid(s: &str) -> ServerUuid {
        s.parse().expect("valid uuid")
    }

    fn tag(s: &str) -> GtidTag {
        GtidTag::new(s).expect("valid tag")
    }

    fn round_trip(input: &str, expected: &str) {
        let parsed = set(input);
        assert_eq!(parsed.to_string(), expected, "formatting {input:?}");
        assert_eq!(set(expected), parsed, "re-parsing {expected:?}");
    }

    #[test]
    fn empty_sets() {
        for input in ["", "   ", "\n", ",", " , ,\n,"] {
            let s = set(input);
            assert!(s.is_empty(), "{input:?}");
            assert_eq!(s.to_string(), "");
            assert_eq!(s, MysqlGtidSet::new());
        }
        assert!(MysqlGtidSet::new().to_sids().expect("sids").is_empty());
    }

    #[test]
    fn single_values_and_ranges() {
        round_trip(&format!("{A}:1"), &format!("{A}:1"));
        round_trip(&format!("{A}:1-1"), &format!("{A}:1"));
        round_trip(&format!("{A}:1-5"), &format!("{A}:1-5"));
        round_trip(&format!("{A}:7:1-5"), &format!("{A}:1-5:7"));
        round_trip(&format!("{A}:1-5:11:47-49"), &format!("{A}:1-5:11:47-49"));
        round_trip(
            &format!("{A}:{MAX_GNO}"),
            &format!("{A}:9223372036854775806"),
        );
    }

    #[test]
    fn unordered_uuids_are_sorted() {
        round_trip(
            &format!("{B}:1-3,{C}:5,{A}:2"),
            &format!("{C}:5,{A}:2,{B}:1-3"),
        );
    }

    #[test]
    fn intervals_are_sorted_and_merged() {
        // gaps stay
        round_trip(&format!("{A}:10-20:1-3"), &format!("{A}:1-3:10-20"));
        // adjacent merge
        round_trip(&format!("{A}:1-3:4-6"), &format!("{A}:1-6"));
        round_trip(&format!("{A}:4-6:1-3"), &format!("{A}:1-6"));
        round_trip(&format!("{A}:1:2:3:5"), &format!("{A}:1-3:5"));
        // overlapping merge
        round_trip(&format!("{A}:1-5:3-8"), &format!("{A}:1-8"));
        round_trip(&format!("{A}:3-8:1-5:2"), &format!("{A}:1-8"));
        round_trip(&format!("{A}:1-3:7-9:2-8"), &format!("{A}:1-9"));
        round_trip(&format!("{A}:1:3:5:7:2-6"), &format!("{A}:1-7"));
        // the same UUID in several entries
        round_trip(&format!("{A}:1-3,{B}:1,{A}:4-5"), &format!("{A}:1-5,{B}:1"));
    }

    #[test]
    fn whitespace_and_newlines_are_accepted() {
        // MySQL prints @@gtid_executed with ",\n" between UUIDs.
        round_trip(&format!("{A}:1-5,\n{B}:1-3"), &format!("{A}:1-5,{B}:1-3"));
        round_trip(
            &format!(" \t{A} : 1 - 5 :\n7 ,\r\n {B}:mytag : 3\n"),
            &format!("{A}:1-5:7,{B}:mytag:3"),
        );
        let s = set(&format!("{A}:1-5,{B}:1-3"));
        assert_eq!(format!("{s:#}"), format!("{A}:1-5,\n{B}:1-3"));
        assert_eq!(set(&format!("{s:#}")), s);
    }

    #[test]
    fn uppercase_is_normalised() {
        round_trip(
            "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5:Domain_1:1-3",
            &format!("{A}:1-5:domain_1:1-3"),
        );
        assert_eq!(uuid("3E11FA47-71CA-11E1-9E33-C80AA9429562").to_string(), A);
    }

    #[test]
    fn tagged_format_matches_mysql() {
        // MySQL 9.1 prints this for `SET GLOBAL gtid_purged =
        // '3E11FA47-71CA-11E1-9E33-C80AA9429562:Domain_1:1-3:15-21,
        //  3E11FA47-71CA-11E1-9E33-C80AA9429562:Domain_2:8-52'` (MySQL bug #116789):
        round_trip(
            "3E11FA47-71CA-11E1-9E33-C80AA9429562:Domain_1:1-3:15-21,\n \
             3E11FA47-71CA-11E1-9E33-C80AA9429562:Domain_2:8-52",
            "3e11fa47-71ca-11e1-9e33-c80aa9429562:domain_1:1-3:15-21:domain_2:8-52",
        );
        // Untagged intervals come first, then tags in ascending order; a tag applies to the
        // intervals after it until the next tag.
        round_trip(
            &format!("{A}:zz:1,{A}:_a:1-2,{A}:5:aa:3:1,{A}:1-2"),
            &format!("{A}:1-2:5:_a:1-2:aa:1:3:zz:1"),
        );
        // Tagged and untagged numbers are different GTIDs: no merging across tags.
        let s = set(&format!("{A}:1-3:t:4-6"));
        assert!(s.contains(&uuid(A), None, 3));
        assert!(!s.contains(&uuid(A), None, 4));
        assert!(s.contains(&uuid(A), Some(&tag("t")), 4));
        assert!(!s.contains(&uuid(A), Some(&tag("t")), 3));
        assert!(!s.contains(&uuid(A), Some(&tag("u")), 4));
        assert!(s.has_tags());
        assert!(!set(&format!("{A}:1-3")).has_tags());
        // Only tagged GTIDs for a UUID: nothing between the UUID and the first tag.
        round_trip(&format!("{A}:t:1"), &format!("{A}:t:1"));
        // Longest tag.
        let long = "a".repeat(MAX_TAG_LEN);
        round_trip(&format!("{A}:{long}:1"), &format!("{A}:{long}:1"));
    }

    #[test]
    fn invalid_input_names_the_bad_part() {
        let cases: Vec<(String, GtidError)> = vec![
            (
                "3e11fa47-71ca-11e1-9e33-c80aa942956:1".into(),
                GtidError::InvalidUuid("3e11fa47-71ca-11e1-9e33-c80aa942956".into()),
            ),
            (
                "3e11fa4771ca11e19e33c80aa9429562ab:1".into(),
                GtidError::InvalidUuid("3e11fa4771ca11e19e33c80aa9429562ab".into()),
            ),
            (
                "3e11fa47-71ca-11e1-9e33-c80aa942956g:1".into(),
                GtidError::InvalidUuid("3e11fa47-71ca-11e1-9e33-c80aa942956g".into()),
            ),
            (
                "3e11fa47_71ca-11e1-9e33-c80aa9429562:1".into(),
                GtidError::InvalidUuid("3e11fa47_71ca-11e1-9e33-c80aa9429562".into()),
            ),
            ("1-5".into(), GtidError::InvalidUuid("1-5".into())),
            (format!("{A}:0"), GtidError::InvalidGno("0".into())),
            (format!("{A}:0-5"), GtidError::InvalidGno("0".into())),
            (format!("{A}:1-0"), GtidError::InvalidGno("0".into())),
            (
                format!("{A}:9223372036854775807"),
                GtidError::InvalidGno("9223372036854775807".into()),
            ),
            (
                format!("{A}:99999999999999999999"),
                GtidError::InvalidGno("99999999999999999999".into()),
            ),
            (format!("{A}:+5"), GtidError::InvalidInterval("+5".into())),
            (format!("{A}:-5"), GtidError::InvalidInterval("-5".into())),
            (format!("{A}:5-"), GtidError::InvalidInterval("5-".into())),
            (format!("{A}:1-x"), GtidError::InvalidInterval("1-x".into())),
            (
                format!("{A}:1-3-5"),
                GtidError::InvalidInterval("1-3-5".into()),
            ),
            (
                format!("{A}:0x10"),
                GtidError::InvalidInterval("0x10".into()),
            ),
            (
                format!("{A}:5-3"),
                GtidError::ReversedInterval("5-3".into()),
            ),
            (
                format!("{A}:1-3:9 - 8"),
                GtidError::ReversedInterval("9 - 8".into()),
            ),
            (
                format!("{A}::1"),
                GtidError::EmptyElement(format!("{A}::1")),
            ),
            (
                format!("{A}:1:"),
                GtidError::EmptyElement(format!("{A}:1:")),
            ),
            (A.into(), GtidError::MissingInterval(A.into())),
            (
                format!("{A}:t"),
                GtidError::MissingInterval(format!("{A}:t")),
            ),
            (
                format!("{A}:t:u:1"),
                GtidError::MissingInterval(format!("{A}:t:u:1")),
            ),
            (format!("{A}:t-1:1"), GtidError::InvalidTag("t-1".into())),
            (format!("{A}:t.x:1"), GtidError::InvalidTag("t.x".into())),
            (
                format!("{A}:{}:1", "a".repeat(MAX_TAG_LEN + 1)),
                GtidError::InvalidTag("a".repeat(MAX_TAG_LEN + 1)),
            ),
            (format!("{A}:1 2"), GtidError::InvalidInterval("1 2".into())),
            (
                format!("{A}:1;{B}:2"),
                GtidError::InvalidInterval(format!("1;{B}")),
            ),
        ];
        for (input, expected) in cases {
            let got = input.parse::<MysqlGtidSet>();
            assert_eq!(got, Err(expected), "parsing {input:?}");
        }
        // Tags starting with a digit read as an interval; with another character, as a tag.
        assert_eq!(
            format!("{A}:1:9abc:1").parse::<MysqlGtidSet>(),
            Err(GtidError::InvalidInterval("9abc".into()))
        );
        assert_eq!(GtidTag::new(""), Err(GtidError::InvalidTag("".into())));
        assert_eq!(GtidTag::new("1a"), Err(GtidError::InvalidTag("1a".into())));
        assert_eq!(GtidTag::new("é"), Err(GtidError::InvalidTag("é".into())));
        // Messages name the bad part.
        let msg = format!("{A}:7-3")
            .parse::<MysqlGtidSet>()
            .err()
            .map(|e| e.to_string());
        assert!(
            msg.as_deref().is_some_and(|m| m.contains("\"7-3\"")),
            "{msg:?}"
        );
        let msg = "nope:1"
            .parse::<MysqlGtidSet>()
            .err()
            .map(|e| e.to_string());
        assert!(
            msg.as_deref().is_some_and(|m| m.contains("\"nope\"")),
            "{msg:?}"
        );
    }

    #[test]
    fn single_gtids() {
        let g: Gtid = format!("{A}:42").parse().expect("gtid");
        assert_eq!((g.uuid(), g.tag(), g.gno()), (uuid(A), None, 42));
        assert_eq!(g.to_string(), format!("{A}:42"));
        let g: Gtid = "3E11FA47-71CA-11E1-9E33-C80AA9429562:Tag_1:7"
            .parse()
            .expect("gtid");
        assert_eq!(g.tag(), Some(&tag("tag_1")));
        assert_eq!(g.to_string(), format!("{A}:tag_1:7"));
        for bad in [
            A.to_owned(),
            format!("{A}:1-2"),
            format!("{A}:t:u:1"),
            format!("{A}:0"),
        ] {
            assert!(bad.parse::<Gtid>().is_err(), "{bad:?}");
        }
        assert_eq!(
            Gtid::new(uuid(A), None, 0),
            Err(GtidError::InvalidGno("0".into()))
        );
        assert!(Gtid::new(uuid(A), None, MAX_GNO).is_ok());
        assert!(Gtid::new(uuid(A), None, MAX_GNO + 1).is_err());
    }

    #[test]
    fn add_contains_and_merge() {
        let mut s = MysqlGtidSet::new();
        let a = uuid(A);
        let t = tag("t");
        for gno in [1, 2, 3, 10, 5, 4, 11] {
            let g = Gtid::new(a, None, gno).expect("gtid");
            assert!(s.add(&g), "{gno} is new");
            assert!(!s.add(&g), "{gno} is not new twice");
        }
        assert!(s.add(&Gtid::new(a, Some(t.clone()), 1).expect("gtid")));
        assert_eq!(s.to_string(), format!("{A}:1-5:10-11:t:1"));
        assert!(s.contains(&a, None, 1) && s.contains(&a, None, 5) && s.contains(&a, None, 11));
        assert!(!s.contains(&a, None, 6) && !s.contains(&a, None, 9) && !s.contains(&a, None, 12));
        assert!(!s.contains(&a, None, 0));
        assert!(!s.contains(&uuid(B), None, 1));
        // Filling the gap joins the intervals.
        s.add_interval(a, None, 6, 9).expect("interval");
        assert_eq!(s.to_string(), format!("{A}:1-11:t:1"));
        assert_eq!(
            s.add_interval(a, None, 3, 2),
            Err(GtidError::ReversedInterval("3-2".into()))
        );
        assert_eq!(
            s.add_interval(a, None, 0, 2),
            Err(GtidError::InvalidGno("0".into()))
        );
        assert_eq!(s.to_string(), format!("{A}:1-11:t:1"));

        let other = set(&format!("{B}:1,{A}:12-20:t:2:u:1"));
        let u = s.union(&other);
        assert_eq!(u.to_string(), format!("{A}:1-20:t:1-2:u:1,{B}:1"));
        assert_eq!(other.union(&s), u);
        let mut m = s.clone();
        m.merge(&other);
        assert_eq!(m, u);
        let mut e = MysqlGtidSet::new();
        e.merge(&MysqlGtidSet::new());
        assert!(e.is_empty());
        assert_eq!(s.union(&MysqlGtidSet::new()), s);

        let listed: Vec<_> = u
            .intervals()
            .map(|(u, t, r)| (u.to_string(), t.map(|t| t.to_string()), r))
            .collect();
        assert_eq!(
            listed,
            vec![
                (A.to_owned(), None, 1..=20),
                (A.to_owned(), Some("t".to_owned()), 1..=2),
                (A.to_owned(), Some("u".to_owned()), 1..=1),
                (B.to_owned(), None, 1..=1),
            ]
        );
    }

    #[test]
    fn appending_keeps_one_interval() {
        let mut s = MysqlGtidSet::new();
        let a = uuid(A);
        for gno in 1..=10_000 {
            s.add(&Gtid::new(a, None, gno).expect("gtid"));
        }
        assert_eq!(s.to_string(), format!("{A}:1-10000"));
        assert_eq!(s.sources[&a].untagged.0.len(), 1);
    }

    #[test]
    fn sids_for_binlog_dump() {
        let s = set(&format!("{B}:1-3:7,{A}:1-5:b:2:a:4-6"));
        let sids = s.to_sids().expect("sids");
        let got: Vec<String> = sids.iter().map(ToString::to_string).collect();
        // Sid's Display writes `uuid[:tag]:intervals`, one (uuid, tag) per Sid.
        assert_eq!(
            got,
            vec![
                format!("{A}:1-5"),
                format!("{A}:a:4-6"),
                format!("{A}:b:2"),
                format!("{B}:1-3:7"),
            ]
        );
        // Half-open intervals on the wire.
        assert_eq!(sids[0].intervals(), &[GnoInterval::new(1, 6)]);
        assert_eq!(
            sids[3].intervals(),
            &[GnoInterval::new(1, 4), GnoInterval::new(7, 8)]
        );
        assert_eq!(sids[1].tag().map(|t| t.as_str()), Some("a"));
        assert!(sids[0].tag().is_none());
        assert_eq!(MysqlGtidSet::from_sids(&sids), Ok(s));

        let bad = [Sid::new(*uuid(A).as_bytes()).with_interval(GnoInterval::new(3, 3))];
        assert_eq!(
            MysqlGtidSet::from_sids(&bad),
            Err(GtidError::InvalidEncodedInterval {
                source_id: A.into(),
                start: 3,
                end: 3
            })
        );
        let bad = [Sid::new(*uuid(A).as_bytes()).with_interval(GnoInterval::new(0, 3))];
        assert!(MysqlGtidSet::from_sids(&bad).is_err());
    }

    #[test]
    fn anonymous_event_has_no_gtid() {
        let ev = GtidEvent::new([0; 16], 0);
        assert_eq!(gtid_from_event(&ev), Err(GtidError::InvalidGno("0".into())));
        let ev = GtidEvent::new(*uuid(A).as_bytes(), 9);
        assert_eq!(
            gtid_from_event(&ev).map(|g| g.to_string()),
            Ok(format!("{A}:9"))
        );
    }

    // ---- property tests ----

    /// A small pool of UUIDs and tags so that generated sets share sources.
    fn arb_uuid() -> impl Strategy<Value = ServerUuid> {
        prop_oneof![
            Just(A),
            Just(B),
            Just(C),
            Just("ffffffff-ffff-ffff-ffff-ffffffffffff"),
            Just("00000000-0000-0000-0000-000000000001"),
        ]
        .prop_map(uuid)
    }

    fn arb_tag() -> impl Strategy<Value = Option<GtidTag>> {
        prop_oneof![
            3 => Just(None),
            1 => "[a-z_][a-z0-9_]{0,5}".prop_map(|t| Some(tag(&t))),
            1 => "[A-Z_][A-Za-z0-9_]{0,31}".prop_map(|t| Some(tag(&t))),
        ]
    }

    /// (uuid, tag, first, last) with small numbers so intervals collide, plus some huge ones.
    fn arb_interval() -> impl Strategy<Value = (ServerUuid, Option<GtidTag>, u64, u64)> {
        let small = (1u64..60, 0u64..8).prop_map(|(a, len)| (a, a + len));
        let huge = (0u64..5, 0u64..3).prop_map(|(a, len)| (MAX_GNO - a - len, MAX_GNO - a));
        (arb_uuid(), arb_tag(), prop_oneof![4 => small, 1 => huge])
            .prop_map(|(u, t, (a, b))| (u, t, a, b))
    }

    fn arb_intervals() -> impl Strategy<Value = Vec<(ServerUuid, Option<GtidTag>, u64, u64)>> {
        prop::collection::vec(arb_interval(), 0..12)
    }

    /// Text of one interval list the way a user might write it: one entry per interval.
    fn entries_text(ivs: &[(ServerUuid, Option<GtidTag>, u64, u64)]) -> String {
        ivs.iter()
            .map(|(u, t, a, b)| {
                let range = if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                };
                match t {
                    Some(t) => format!("{u}:{t}:{range}"),
                    None => format!("{u}:{range}"),
                }
            })
            .collect::<Vec<_>>()
            .join(",\n ")
    }

    fn from_intervals(ivs: &[(ServerUuid, Option<GtidTag>, u64, u64)]) -> MysqlGtidSet {
        let mut s = MysqlGtidSet::new();
        for (u, t, a, b) in ivs {
            s.add_interval(*u, t.as_ref(), *a, *b)
                .expect("valid interval");
        }
        s
    }

    /// A reference model: the set of (uuid, tag, gno) triples.
    fn model(
        ivs: &[(ServerUuid, Option<GtidTag>, u64, u64)],
    ) -> std::collections::BTreeSet<(ServerUuid, Option<GtidTag>, u64)> {
        ivs.iter()
            .flat_map(|(u, t, a, b)| (*a..=*b).map(move |n| (*u, t.clone(), n)))
            .collect()
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(ivs in arb_intervals()) {
            let s = from_intervals(&ivs);
            let text = s.to_string();
            prop_assert_eq!(text.parse::<MysqlGtidSet>(), Ok(s.clone()));
            prop_assert_eq!(format!("{s:#}").parse::<MysqlGtidSet>(), Ok(s.clone()));
            // Canonical: formatting the re-parsed set gives the same text.
            prop_assert_eq!(text.parse::<MysqlGtidSet>().map(|p| p.to_string()), Ok(text));
        }

        #[test]
        fn parse_is_order_independent(ivs in arb_intervals(), seed in any::<u64>()) {
            let mut shuffled = ivs.clone();
            // Deterministic shuffle from the seed.
            let mut state = seed | 1;
            for i in (1..shuffled.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                shuffled.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let a: MysqlGtidSet = entries_text(&ivs).parse().expect("parses");
            let b: MysqlGtidSet = entries_text(&shuffled).parse().expect("parses");
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(a.to_string(), b.to_string());
            prop_assert_eq!(&a, &from_intervals(&ivs));
        }

        #[test]
        fn add_each_gno_equals_parse(ivs in arb_intervals()) {
            let mut added = MysqlGtidSet::new();
            for (u, t, a, b) in &ivs {
                for n in *a..=*b {
                    added.add(&Gtid::new(*u, t.clone(), n).expect("gtid"));
                }
            }
            let parsed: MysqlGtidSet = entries_text(&ivs).parse().expect("parses");
            prop_assert_eq!(&added, &parsed);
            // Membership agrees with a reference model, including just outside each interval.
            let m = model(&ivs);
            for (u, t, a, b) in &ivs {
                for n in [a.saturating_sub(1), *a, *b, b + 1] {
                    let want = m.contains(&(*u, t.clone(), n));
                    prop_assert_eq!(added.contains(u, t.as_ref(), n), want, "{}:{:?}:{}", u, t, n);
                }
            }
            // Every listed interval is maximal and within the model.
            let listed: Vec<_> = added.intervals().collect();
            let count: u64 = listed.iter().map(|(_, _, r)| r.end() - r.start() + 1).sum();
            prop_assert_eq!(count, m.len() as u64);
        }

        #[test]
        fn union_is_commutative_and_associative(
            a in arb_intervals(), b in arb_intervals(), c in arb_intervals()
        ) {
            let (sa, sb, sc) = (from_intervals(&a), from_intervals(&b), from_intervals(&c));
            prop_assert_eq!(sa.union(&sb), sb.union(&sa));
            prop_assert_eq!(sa.union(&sb).union(&sc), sa.union(&sb.union(&sc)));
            let all: Vec<_> = a.iter().chain(&b).cloned().collect();
            prop_assert_eq!(sa.union(&sb), from_intervals(&all));
            prop_assert_eq!(sa.union(&sa), sa.clone());
        }

        #[test]
        fn sids_round_trip(ivs in arb_intervals()) {
            let s = from_intervals(&ivs);
            let sids = s.to_sids().expect("sids");
            prop_assert_eq!(sids.iter().any(|sid| sid.tag().is_some()), s.has_tags());
            prop_assert_eq!(MysqlGtidSet::from_sids(&sids), Ok(s));
        }
    }
}
