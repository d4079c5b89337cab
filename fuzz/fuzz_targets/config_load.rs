//! Configuration loading: `RelayConfig::from_toml_str` (TOML, validation, `${env:…}` and
//! `${file:…}` references, the outbox mappings, TLS options, the MySQL URL), then what the
//! relay derives from a loaded configuration before it connects. Errors are fine; panics are
//! not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_relay_core::config::RelayConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(toml) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = RelayConfig::from_toml_str(toml) else {
        return;
    };
    let _ = config.table_mappings();
    let _ = config.outbox_tables();
    let _ = config.checkpoint_table();
    let _ = config.url_database();
    let _ = config.kafka.redacted_properties();
    let _ = format!("{config:?}");
});
