//! The binlog file reader of `outbox-relay replay`: `replay::plan` (frames, checksums,
//! transactions) on the input as a binlog file, then `ReplaySource` reading the planned
//! transactions through `BinlogFileSource` and the decoder turning them into outbox rows (the
//! tables of the fixture files are mapped as outboxes). The first byte's low bit also reads the
//! file with `BinlogFileSource` alone, without the plan's checks, as for a file that changed
//! after it was planned; its second bit rewrites every frame's CRC32 and end position so
//! mutations get past the checksums. Errors are fine; panics are not.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use outbox_relay_mysql::binlog::replay::{plan, ReplayRange, ReplaySource};
use outbox_relay_mysql::binlog::source::BinlogFileSource;
use outbox_relay_mysql::binlog::EventSource;
use outbox_relay_core::config::TableName;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_mysql::decode::Decoder;

/// The outbox tables of `tests/fixtures/binlogs/*.sql`, mapped to their columns.
const OUTBOX: &str = r#"
[[outbox.table]]
name = "toddy_test.outbox"
columns = { aggregate_type = "topic", aggregate_id = "id", event_key = "id", payload = "event", created_at = "created" }
[[outbox.table]]
name = "test.t1"
columns = { id = "f1", event_key = "f2", event_type = "f3", aggregate_type = "f4", payload = "f5", aggregate_id = "f6", created_at = "" }
[[outbox.table]]
name = "noria.t1"
columns = { id = "c1", aggregate_type = "c3", aggregate_id = "c5", event_type = "c1", event_key = "c1", payload = "c3", created_at = "" }
[[outbox.table]]
name = "test.tb1"
columns = { id = "id", aggregate_type = "id", aggregate_id = "id", event_type = "id", event_key = "id", payload = "id", created_at = "" }
[[outbox.table]]
name = "test.g"
columns = { id = "id", aggregate_type = "id", aggregate_id = "id", event_type = "id", event_key = "id", payload = "id", created_at = "" }
[[outbox.table]]
name = "foo.test"
columns = { id = "a", aggregate_type = "a", aggregate_id = "a", event_type = "a", event_key = "a", payload = "a", created_at = "" }
"#;

struct Setup {
    path: PathBuf,
    mappings: Vec<TableMapping>,
    checkpoint: TableName,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let config = outbox_relay_fuzz::config(OUTBOX);
        // One file per fuzzing process, in memory where there is a tmpfs.
        let base = ["/dev/shm", "/tmp"]
            .map(PathBuf::from)
            .into_iter()
            .find(|d| d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("outbox-relay-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Setup {
            path: dir.join("mysql-bin.000001"),
            mappings: config.table_mappings().expect("valid mapping"),
            checkpoint: config.checkpoint_table().expect("checkpoint table"),
        }
    })
}

/// Rewrites each complete frame's end position and CRC32 (of the header and body; a format
/// description event's with the in-use flag clear, as the server computes it).
fn fix_frames(file: &mut [u8]) {
    let mut at = 4;
    while let Some(header) = file.get(at..at + 19) {
        let size = u32::from_le_bytes([header[9], header[10], header[11], header[12]]) as usize;
        let Some(end) = at
            .checked_add(size)
            .filter(|&e| size >= 23 && e <= file.len())
        else {
            return;
        };
        file[at + 13..at + 17].copy_from_slice(&(end as u32).to_le_bytes());
        let mut hasher = crc32fast::Hasher::new();
        if file[at + 4] == 15 {
            let mut head = [0u8; 19];
            head.copy_from_slice(&file[at..at + 19]);
            head[17] &= !1;
            hasher.update(&head);
            hasher.update(&file[at + 19..end - 4]);
        } else {
            hasher.update(&file[at..end - 4]);
        }
        let sum = hasher.finalize();
        file[end - 4..end].copy_from_slice(&sum.to_le_bytes());
        at = end;
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let setup = setup();
    let mut file = rest.to_vec();
    if mode & 2 != 0 {
        fix_frames(&mut file);
    }
    std::fs::write(&setup.path, &file).expect("scratch file");
    let mut decoder = Decoder::new(setup.mappings.clone(), setup.checkpoint.clone(), None);

    if mode & 1 != 0 {
        // The reader alone, as on a file that changed after it was planned.
        if let Ok(mut source) = BinlogFileSource::open(&setup.path) {
            while let Some(Ok(ev)) = source.next_event() {
                let _ = decoder.decode(&ev, |id| source.table_map(id));
            }
        }
        return;
    }
    let Ok(plan) = plan(std::slice::from_ref(&setup.path), &ReplayRange::default()) else {
        return;
    };
    let mut source = ReplaySource::new(&plan);
    while let Ok(Some(ev)) = source.read_next() {
        let _ = decoder.decode(&ev, |id| source.table_map(id));
    }
});
