//! `faults`: the fault matrix of outbox-relay (see `outbox_relay_testkit::faults`).
//!
//! ```text
//! cargo run -p outbox-relay-testkit --bin faults -- --profile short|medium|full
//!     [--seed N] [--relay-bin PATH] [--kills N] [--broker-restarts N] [--server-restarts N]
//!     [--cuts N] [--freezes N] [--writers N] [--no-services] [--exactly-once]
//! ```
//!
//! Restarts the database server (OUTBOX_TEST_SERVER) and Kafka through `tests/services/*.sh` with this process's environment
//! (`MARIADB_PORT`, `KAFKA_PORT`, `KAFKA_CONTROLLER_PORT`, `OUTBOX_SERVICES_DIR`): never point
//! it at servers that other tests use at the same time. The relay binary is `--relay-bin`, else
//! `$OUTBOX_RELAY_BIN`, else `target/debug/outbox-relay` (build it first).
//!
//! `--exactly-once` runs the relay with `kafka.delivery = "exactly_once"`, reads the topics
//! `read_committed` and fails on any duplicate.
//!
//! Prints progress, then a table whose last line is `missing: N duplicates: M`. Exit code 0 when
//! the run passed, 1 when anything is missing, out of order or otherwise wrong, 2 for usage
//! errors, 3 when the harness itself could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use outbox_relay_testkit::faults::{run, Options, Profile};

const USAGE: &str = "usage: faults [--profile short|medium|full] [--seed N] [--relay-bin PATH] \
[--kills N] [--broker-restarts N] [--server-restarts N] [--cuts N] [--freezes N] [--writers N] \
[--no-services] [--exactly-once]";

fn parse(args: &[String]) -> Result<Options, String> {
    let mut profile = Profile::short();
    let mut seed = None;
    let mut relay_bin = None;
    let mut start_services = true;
    let mut exactly_once = false;
    let mut overrides: Vec<(String, usize)> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v.to_owned())),
            None => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "--profile" => {
                let v = value()?;
                profile = Profile::named(&v).ok_or_else(|| format!("unknown profile {v:?}"))?;
            }
            "--seed" => {
                let v = value()?;
                seed = Some(
                    v.parse()
                        .map_err(|_| format!("--seed {v:?}: not a number"))?,
                );
            }
            "--relay-bin" => relay_bin = Some(PathBuf::from(value()?)),
            "--kills" | "--broker-restarts" | "--server-restarts" | "--cuts" | "--freezes"
            | "--writers" => {
                let v = value()?;
                let n = v
                    .parse()
                    .map_err(|_| format!("{flag} {v:?}: not a number"))?;
                overrides.push((flag.to_owned(), n));
            }
            "--no-services" => start_services = false,
            "--exactly-once" => exactly_once = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    for (flag, n) in overrides {
        match flag.as_str() {
            "--kills" => profile.kills = n,
            "--broker-restarts" => profile.broker_restarts = n,
            "--server-restarts" => profile.server_restarts = n,
            "--cuts" => profile.cuts = n,
            "--freezes" => profile.freezes = n,
            _ => profile.writers = n.max(1),
        }
        profile.name = format!("{} (custom)", profile.name.trim_end_matches(" (custom)"));
    }
    let mut opts = Options::new(profile);
    if let Some(seed) = seed {
        opts.seed = seed;
    }
    if let Some(bin) = relay_bin {
        opts.relay_bin = bin;
    }
    opts.start_services = start_services;
    opts.exactly_once = exactly_once;
    Ok(opts)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("faults: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if msg.is_empty() { 0 } else { 2 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("faults: cannot start the tokio runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(run(&opts)) {
        Ok(report) => {
            println!("{}", report.render());
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("faults: the harness failed: {e:#}");
            ExitCode::from(3)
        }
    }
}
