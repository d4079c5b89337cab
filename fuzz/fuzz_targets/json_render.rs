//! MySQL binary JSON → text (`outbox_relay_mysql::decode::json`).
//!
//! The first byte picks what the rest is: a whole binary JSON document as a JSON column holds
//! it (walked in place as the row decoder does, in both styles; or parsed by mysql_common
//! first, as the conformance tool does), an OPAQUE value (type
//! byte, then its data: DECIMAL, temporal, base64 paths), or a double (8 bytes, `my_gcvt`
//! path). Any input may be refused with an error; none may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mysql_common::binlog::jsonb;
use mysql_common::binlog::value::BinlogValue;
use mysql_common::constants::ColumnType;
use mysql_common::io::ParseBuf;
use outbox_relay_mysql::decode::json::{
    render_binlog_json, render_json_binary_debezium, render_json_binary_to_vec,
    render_mysql_json_to_vec,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        // A document, as the column value's bytes (after the row's 4-byte length).
        0 => {
            let _ = render_json_binary_to_vec(rest);
            let _ = render_json_binary_debezium(rest);
        }
        1 => {
            if let Ok(v) = ParseBuf(rest).parse::<jsonb::Value<'_>>(()) {
                let _ = render_binlog_json(&BinlogValue::Jsonb(v));
            }
        }
        2 => {
            let Some((&ty, payload)) = rest.split_first() else {
                return;
            };
            let ty = ColumnType::try_from(ty).unwrap_or(ColumnType::MYSQL_TYPE_BLOB);
            let v = jsonb::Value::Opaque(jsonb::OpaqueValue::new(ty, payload.to_vec()));
            let _ = render_mysql_json_to_vec(&v);
        }
        _ => {
            let mut bytes = [0u8; 8];
            let n = rest.len().min(8);
            bytes[..n].copy_from_slice(&rest[..n]);
            let _ = render_mysql_json_to_vec(&jsonb::Value::F64(f64::from_le_bytes(bytes)));
        }
    }
});
