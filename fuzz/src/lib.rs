//! Helpers shared by the fuzz targets of `fuzz_targets/`.

use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::events::{Event, FormatDescriptionEvent};
use outbox_relay_core::config::RelayConfig;

/// A binlog v4 event (no checksum) of `type_code` with `body`, ending at `end`, parsed by
/// mysql_common as the relay's sources do; `None` when mysql_common refuses it.
pub fn binlog_event(type_code: u8, body: &[u8], end: u32) -> Option<Event> {
    let size = u32::try_from(19 + body.len()).ok()?;
    let mut bytes = Vec::with_capacity(19 + body.len());
    bytes.extend_from_slice(&1_700_000_000u32.to_le_bytes());
    bytes.push(type_code);
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&size.to_le_bytes());
    bytes.extend_from_slice(&end.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(body);
    let fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
    Event::read(&fde, &bytes[..]).ok()
}

/// A valid configuration whose `[outbox]` section is `outbox` (a target's own mapping).
pub fn config(outbox: &str) -> RelayConfig {
    RelayConfig::from_toml_str(&format!(
        "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\nserver_id = 9\n\
         [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[outbox]\n{outbox}"
    ))
    .unwrap_or_else(|e| panic!("the fuzz target's own configuration is invalid: {e}"))
}
