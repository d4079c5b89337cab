//! `faults`: the fault matrix of outbox-relay (see `outbox_relay_testkit::faults`).
//!
//! ```text
//! cargo run -p outbox-relay-testkit --bin faults -- --profile short|medium|full|soak
//!     [--seed N] [--relay-bin PATH] [--kills N] [--broker-restarts N] [--server-restarts N]
//!     [--cuts N] [--freezes N] [--writers N] [--no-services] [--exactly-once]
//!     [--kafka-proxy-port N] [--endtxn-losses N]
//! ```
//!
//! Restarts the database server (OUTBOX_TEST_SERVER) and Kafka through `tests/services/*.sh` with this process's environment
//! (`MARIADB_PORT`, `KAFKA_PORT`, `KAFKA_CONTROLLER_PORT`, `OUTBOX_SERVICES_DIR`): never point
//! it at servers that other tests use at the same time. The relay binary is `--relay-bin`, else
//! `$OUTBOX_RELAY_BIN`, else `target/debug/outbox-relay` (build it first).
//!
//! `--verify-run UID DATABASE FRESH_TOPICS [--exactly-once]` repeats the end-of-run checks of
//! a finished run (its database, topics and acknowledgement audit still there), for a run whose
//! harness gave up on a read.
//!
//! `--profile soak` repeats rounds of faults (CPU starvations and proxy freezes included) for
//! `SOAK_MINUTES` (default 60) under continuous writes: `make soak`.
//!
//! `--exactly-once` runs the relay with `kafka.delivery = "exactly_once"`, reads the topics
//! `read_committed` and fails on any duplicate. With `--kafka-proxy-port N` (default: the
//! `KAFKA_ADVERTISED_PORT` variable, when set) it also starts a Kafka-aware proxy on
//! 127.0.0.1:N in front of the broker, which must advertise that port (`KAFKA_ADVERTISED_PORT=N
//! tests/services/kafka.sh up`), and drops or delays the answers to `--endtxn-losses` (3) of
//! the relay's EndTxn requests.
//!
//! Prints progress, then a table whose last line is `missing: N duplicates: M`. Exit code 0 when
//! the run passed, 1 when anything is missing, out of order or otherwise wrong, 2 for usage
//! errors, 3 when the harness itself could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use outbox_relay_testkit::faults::{run, verify_run, Options, Profile};

const USAGE: &str =
    "usage: faults [--profile short|medium|full|soak] [--seed N] [--relay-bin PATH] \
[--kills N] [--broker-restarts N] [--server-restarts N] [--cuts N] [--freezes N] [--writers N] \
[--no-services] [--exactly-once] [--kafka-proxy-port N] [--endtxn-losses N]";

fn parse(args: &[String]) -> Result<Options, String> {
    let mut profile = Profile::short();
    let mut seed = None;
    let mut relay_bin = None;
    let mut start_services = true;
    let mut exactly_once = false;
    // A broker advertising another port than its own: a proxy belongs there.
    let mut kafka_proxy_port = std::env::var("KAFKA_ADVERTISED_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p != outbox_relay_testkit::env::kafka_port());
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
            "--kafka-proxy-port" => {
                let v = value()?;
                kafka_proxy_port = Some(
                    v.parse()
                        .map_err(|_| format!("--kafka-proxy-port {v:?}: not a port"))?,
                );
            }
            "--kills" | "--endtxn-losses" | "--broker-restarts" | "--server-restarts"
            | "--cuts" | "--freezes" | "--writers" => {
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
            "--endtxn-losses" => profile.endtxn_losses = n,
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
    opts.kafka_proxy_port = kafka_proxy_port;
    Ok(opts)
}

/// `faults --verify-run UID DATABASE FRESH [--exactly-once]`: the end-of-run checks of a
/// finished run again (see `outbox_relay_testkit::faults::verify_run`).
fn verify_again(args: &[String], runtime: &tokio::runtime::Runtime) -> ExitCode {
    let (Some(uid), Some(database), Some(fresh)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("usage: faults --verify-run UID DATABASE FRESH_TOPICS [--exactly-once]");
        return ExitCode::from(2);
    };
    let Ok(fresh) = fresh.parse::<u64>() else {
        eprintln!("faults --verify-run: FRESH_TOPICS {fresh:?} is not a number");
        return ExitCode::from(2);
    };
    let exactly_once = args.iter().any(|a| a == "--exactly-once");
    match runtime.block_on(verify_run(uid, database, fresh, exactly_once)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("faults --verify-run: {e:#}");
            ExitCode::from(3)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--verify-run") {
        return match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => verify_again(&args[1..], &runtime),
            Err(e) => {
                eprintln!("faults: cannot start the tokio runtime: {e}");
                ExitCode::from(3)
            }
        };
    }
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
