//! `fleet_faults`: the fleet's fault profile of outbox-relay (see
//! `outbox_relay_testkit::faults::fleet`).
//!
//! ```text
//! cargo run -p outbox-relay-testkit --bin fleet_faults -- [--seed N] [--exactly-once]
//!     [--relay-bin PATH] [--no-services] [--processes N] [--sources-per-server N]
//!     [--kills N] [--freezes N] [--broker-restarts N] [--server-restarts N]
//! ```
//!
//! Restarts the three database servers (`MARIADB_PORT`, `MARIADB11_PORT`, `MYSQL8_PORT`) and
//! Kafka (`KAFKA_PORT`, `KAFKA_CONTROLLER_PORT`) through `tests/services/*.sh` with this
//! process's environment (`OUTBOX_SERVICES_DIR` too): never point it at servers other tests use
//! at the same time (`make faults-fleet` chooses private ports). The relay binary is
//! `--relay-bin`, else `$OUTBOX_RELAY_BIN`, else `target/debug/outbox-relay` (build it first).
//!
//! Prints progress, then a table whose last line is `missing: N duplicates: M`. Exit code 0 when
//! the run passed, 1 when anything is missing (or duplicated with `--exactly-once`), out of
//! order or otherwise wrong, 2 for usage errors, 3 when the harness itself could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use outbox_relay_testkit::faults::fleet::{run, FleetOptions, FleetProfile};

const USAGE: &str = "usage: fleet_faults [--seed N] [--exactly-once] [--relay-bin PATH] \
[--no-services] [--processes N] [--sources-per-server N] [--kills N] [--freezes N] \
[--broker-restarts N] [--server-restarts N]";

fn parse(args: &[String]) -> Result<FleetOptions, String> {
    let mut opts = FleetOptions::new(FleetProfile::standard());
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
        let mut number = || -> Result<u64, String> {
            let v = value()?;
            v.parse().map_err(|_| format!("{flag} {v:?}: not a number"))
        };
        let p = &mut opts.profile;
        match flag {
            "--seed" => opts.seed = number()?,
            "--relay-bin" => opts.relay_bin = PathBuf::from(value()?),
            "--no-services" => opts.start_services = false,
            "--exactly-once" => opts.exactly_once = true,
            "--processes" => p.processes = (number()? as usize).max(2),
            "--sources-per-server" => p.sources_per_server = (number()? as usize).max(1),
            "--kills" => p.kills = number()? as usize,
            "--freezes" => p.freezes = number()? as usize,
            "--broker-restarts" => p.broker_restarts = number()? as usize,
            "--server-restarts" => p.server_restarts = number()? as usize,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(opts)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("fleet_faults: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if msg.is_empty() { 0 } else { 2 });
        }
    };
    // The databases' watchdog (15 min by default, for tests) must not end a run that is longer
    // by design. Set before any thread starts.
    if std::env::var_os("OUTBOX_TEST_WATCHDOG_SECS").is_none() {
        std::env::set_var("OUTBOX_TEST_WATCHDOG_SECS", "14400");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleet_faults: cannot start the tokio runtime: {e}");
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
            eprintln!("fleet_faults: the harness failed: {e:#}");
            ExitCode::from(3)
        }
    }
}
