//! What a user sees for the configuration mistakes of issue 31, from the binary itself: the
//! message on stderr and exit code 2, before any connection (no servers needed).

use std::path::PathBuf;
use std::process::Command;

const BASE: &str = "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\n\
                    [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";

fn dir() -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("outbox-relay-config-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

/// `outbox-relay check --config <file with text>`: (exit code, stderr).
fn check(name: &str, text: &str) -> (Option<i32>, String) {
    let file = dir().join(name);
    if !text.is_empty() {
        std::fs::write(&file, text).expect("write");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["check", "--config"])
        .arg(&file)
        .env_remove("OUTBOX_RELAY_CONFIG")
        .output()
        .expect("run outbox-relay");
    let stderr = String::from_utf8_lossy(&out.stderr).replace(&format!("{}/", dir().display()), "");
    (out.status.code(), stderr)
}

#[test]
fn the_first_hour_mistakes_get_the_key_the_line_and_the_fix() {
    let (code, err) = check(
        "typo.toml",
        &format!("{BASE}[outbox]\ntabels = [\"shop.outbox\"]\n"),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with(
            "error: configuration error: unknown key \"tabels\" in [outbox] (typo.toml line 6): \
             did you mean \"tables\"? The valid keys are: binary_format, compat,"
        ),
        "{err}"
    );

    let (code, err) = check(
        "dotted.toml",
        &format!(
            "{BASE}[outbox]\ntables = [\"shop.outbox\"]\n[kafka.properties]\nlinger.ms = \"5\"\n"
        ),
    );
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "error: configuration error: kafka.properties: linger.ms (dotted.toml line 8) was read \
         as the table \"linger\" because the name has dots and no quotes, but kafka.properties \
         keys are names with string values: quote the name: \"linger.ms\" = \"5\""
    );

    let (code, err) = check(
        "table.toml",
        &format!("{BASE}[outbox]\ntable = [\"shop.outbox\"]\n"),
    );
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "error: configuration error: outbox.table (table.toml line 6): expected a list of tables \
         ([[outbox.table]]), found a list of strings: did you mean tables = [\"shop.outbox\"]?"
    );

    let (code, err) = check("missing/relay.toml", "");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("missing/relay.toml does not exist")
            && err.contains("pass its path with --config PATH"),
        "{err}"
    );
}

#[test]
fn config_reference_prints_the_generated_reference() {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("config-reference")
        .output()
        .expect("run outbox-relay");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("# Configuration reference"), "{text}");
    assert!(text.contains("#### `mysql.url`"), "{text}");
}
