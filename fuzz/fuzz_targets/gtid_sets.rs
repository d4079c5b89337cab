//! GTID sets and positions as the relay reads them from its checkpoint row, the server and its
//! configuration: MySQL GTID sets (`MysqlGtidSet`, text, and binary in PREVIOUS_GTIDS / GTID
//! events), MariaDB GTID positions (`MariadbGtidPos`) and binlog positions (`FILE:POS`).
//!
//! Whatever parses must print as text that parses back to the same value (the checkpoint stores
//! that text and resumes from it). Errors are fine; panics are not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mysql_common::binlog::events::EventData;
use outbox_relay_core::position::gtid::{gtid_from_event, GtidTag, MysqlGtidSet, ServerUuid};
use outbox_relay_core::position::{BinlogPosition, MariadbGtidPos};
use outbox_relay_fuzz::binlog_event;

fn round_trip<T>(text: &str)
where
    T: std::str::FromStr + std::fmt::Display + PartialEq + std::fmt::Debug,
    T::Err: std::fmt::Display,
{
    let Ok(value) = text.parse::<T>() else {
        return;
    };
    let printed = value.to_string();
    match printed.parse::<T>() {
        Ok(again) => assert_eq!(again, value, "{text:?} printed as {printed:?}"),
        Err(e) => panic!("{text:?} parsed, but its text {printed:?} does not: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => {
            let text = String::from_utf8_lossy(rest);
            round_trip::<MysqlGtidSet>(&text);
            if let Ok(set) = text.parse::<MysqlGtidSet>() {
                // The set as the binary COM_BINLOG_DUMP_GTID / PREVIOUS_GTIDS form and back.
                match set
                    .to_sids()
                    .map(|sids| MysqlGtidSet::from_sids(sids.iter()))
                {
                    Ok(Ok(again)) => assert_eq!(again, set, "{text:?} through Sids"),
                    Ok(Err(e)) | Err(e) => panic!("{text:?} parsed but not through Sids: {e}"),
                }
                let _ = set.union(&set).to_string();
                let _ = format!("{set:#}");
            }
            let _ = text.parse::<ServerUuid>();
            let _ = GtidTag::new(&text);
        }
        1 => {
            let text = String::from_utf8_lossy(rest);
            round_trip::<MariadbGtidPos>(&text);
            round_trip::<BinlogPosition>(&text);
        }
        // Binary: a PREVIOUS_GTIDS event body (untagged or tagged format), then a GTID event
        // body (type 33, or 42: MySQL 8.3+ tagged).
        2 => {
            if let Some(ev) = binlog_event(35, rest, 0) {
                if let Ok(set) = MysqlGtidSet::from_previous_gtids_event(&ev) {
                    round_trip::<MysqlGtidSet>(&set.to_string());
                }
            }
        }
        _ => {
            let type_code = if mode & 4 == 0 { 33 } else { 42 };
            if let Some(ev) = binlog_event(type_code, rest, 0) {
                if let Ok(Some(EventData::GtidEvent(g))) = ev.read_data() {
                    if let Ok(gtid) = gtid_from_event(&g) {
                        let mut set = MysqlGtidSet::new();
                        set.add(&gtid);
                        round_trip::<MysqlGtidSet>(&set.to_string());
                    }
                }
            }
        }
    }
});
