//! `outbox-relay`: the command line. It only wires things together: parse arguments, set up
//! logging, load the config, run the relay until SIGTERM/SIGINT (`run`), replay binlog files
//! (`replay`), or an operator command (`check`, `status`, `reset`, `migrate`, `prune`,
//! `migrate-from debezium`, …: module `ops`, each documenting its exit codes; every command
//! that changes state, `replay` included, acts only with `--yes` and otherwise prints its plan
//! and exits 4: `commands::Confirm`).
//!
//! Exit codes: 0 stopped on request (final checkpoint written) or replay complete; 1 runtime
//! error (for `replay` also a truncated or damaged binlog file); 2 usage, configuration or
//! argument error (for `replay` also a `--binlog` file that does not exist or is not a binlog
//! file, and a start position inside a transaction); 3 a server prerequisite is not met; 130 a
//! second signal (or, for `replay`, a stop request before the end of the range).

mod commands;
mod ops;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use outbox_relay_core::config::process::ProcessConfig;
use outbox_relay_core::error::RelayError;
use outbox_relay_mysql::binlog::replay::{parse_datetime, ReplayRange};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc malloc, for librdkafka's allocations too (`override`): the relay
/// allocates many small, short-lived buffers per row, and librdkafka several per record (the
/// message and each header), which glibc's malloc served slowly (~10 % of the relay's CPU while
/// draining a backlog; `make bench`, docs/src/benchmark.md). mimalloc v2, not v3: v3 purges freed
/// memory after 1 s instead of 10 ms, which held ~20 MB more at the peak of a drain.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `outbox-relay --version`: the package version and the git commit it was built from
/// (`build.rs`: `git rev-parse`, or `OUTBOX_RELAY_GIT_COMMIT` where the source has no `.git`,
/// as in a Docker build; `unknown` when neither says).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("OUTBOX_RELAY_GIT_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "outbox-relay",
    version = VERSION,
    about = "Relays committed outbox INSERTs from the MySQL/MariaDB binlog to Kafka"
)]
struct Cli {
    /// Log format on stderr. Level via RUST_LOG (default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// With a configuration of many sources (`[[source]]` tables or `sources_dir`): the source
    /// an operator command acts on (`status`, `check`, `reset`, …). `run` runs them all.
    #[arg(long, global = true, env = "OUTBOX_RELAY_SOURCE", value_name = "NAME")]
    source: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Stream the binlog to Kafka until SIGTERM/SIGINT.
    Run {
        /// TOML config file; `OUTBOX_RELAY__SECTION__KEY` environment variables override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
    },
    /// Re-publish the outbox rows of binlog files (a backup or archive) to Kafka.
    ///
    /// Reads the files in the order given (like mysqlbinlog) and produces, for the selected
    /// whole transactions, exactly the records `run` would: same decoding, topics, keys,
    /// headers, timestamps and dead letters, per the config's [outbox], [kafka] and
    /// [dead_letter] sections.
    ///
    /// It does NOT connect to MySQL (mysql.url is only parsed, for the checkpoint table's
    /// name), takes no lease and writes NO checkpoint: the live connector's position does not
    /// move, and it can run while the live relay runs. Records are produced at least once: run
    /// it again after a failure. Without --yes it prints the plan (files, range, tables,
    /// topics, brokers) and sends nothing (exit 4); --dry-run does the same with exit code 0.
    ///
    /// Exit codes: 0 all selected transactions were produced and acknowledged (a summary line
    /// is logged), or --dry-run printed the plan; 1 runtime error, or a truncated or damaged
    /// file (named, with the position); 2 usage or configuration error, a --binlog file that
    /// does not exist or is not a binlog file, or an unusable start position; 4 not confirmed
    /// (no --yes): the plan was printed, nothing sent; 130 stopped by a signal before the end
    /// (the summary names the last position all of whose records were acknowledged).
    #[command(verbatim_doc_comment)]
    Replay {
        /// TOML config file (the same as for `run`); `OUTBOX_RELAY__SECTION__KEY` environment
        /// variables override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// Binlog files to read, in this order (`--binlog a b` or `--binlog a --binlog b`).
        #[arg(long = "binlog", value_name = "FILE", required = true, num_args = 1..)]
        binlogs: Vec<PathBuf>,
        /// Start at this byte position of the first file. It must be the start of an event
        /// outside any transaction (a position from SHOW MASTER STATUS, the End_log_pos of an
        /// Xid event, or 4); a position inside a transaction is refused.
        #[arg(long, value_name = "N")]
        start_position: Option<u64>,
        /// Stop in the last file after the last transaction that ends at or before this byte
        /// position.
        #[arg(long, value_name = "N")]
        stop_position: Option<u64>,
        /// Begin with the first transaction that committed at or after this time
        /// ("YYYY-MM-DD HH:MM:SS", UTC; a transaction's time is its commit event's timestamp).
        #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
        start_datetime: Option<i64>,
        /// End with the last transaction before the first one that committed after this
        /// time ("YYYY-MM-DD HH:MM:SS", UTC; inclusive: a transaction that committed within
        /// this second is replayed).
        #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
        stop_datetime: Option<i64>,
        /// Send (without it: print the plan, exit code 4).
        #[arg(long)]
        yes: bool,
        /// Print the plan and send nothing, with exit code 0 (for scripts).
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
    },
    /// Print a shell completion script to stdout.
    ///
    /// bash: `outbox-relay completions bash > /etc/bash_completion.d/outbox-relay`;
    /// zsh: `outbox-relay completions zsh > "${fpath[1]}/_outbox-relay"`;
    /// fish: `outbox-relay completions fish > ~/.config/fish/completions/outbox-relay.fish`.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout, or write every page to a folder.
    ///
    /// `outbox-relay man > outbox-relay.1 && man ./outbox-relay.1`; `outbox-relay man --dir
    /// /usr/local/share/man/man1` writes `outbox-relay.1` and one page per subcommand
    /// (`outbox-relay-replay.1`, `outbox-relay-dlq-replay.1`, …), which the main page names.
    Man {
        /// Write every page into this existing folder instead of printing the main one.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Print the configuration reference (Markdown), generated from the configuration types:
    /// what docs/src/reference/configuration.md holds (`make config-reference` writes it).
    #[command(hide = true)]
    ConfigReference,
    #[command(flatten)]
    Ops(commands::OpsCommand),
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal, so log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(1);
        }
    };
    commands::select_source(cli.source);
    let result = match cli.command {
        Command::Ops(command) => return commands::run(command, &runtime),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "outbox-relay", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::ConfigReference => {
            print!("{}", outbox_relay_core::config::reference::markdown());
            return ExitCode::SUCCESS;
        }
        Command::Man { dir } => {
            // No page for clap's `help` subcommand, so the main page names only pages that exist.
            let written = match &dir {
                None => clap_mangen::Man::new(Cli::command().disable_help_subcommand(true))
                    .render(&mut std::io::stdout()),
                Some(dir) => clap_mangen::generate_to(Cli::command(), dir),
            };
            return match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    let to = dir.map_or("stdout".to_owned(), |d| d.display().to_string());
                    tracing::error!(error = %e, "cannot write the manual pages to {to}");
                    ExitCode::from(1)
                }
            };
        }
        Command::Run { config } => runtime.block_on(run(config)),
        Command::Replay {
            config,
            binlogs,
            start_position,
            stop_position,
            start_datetime,
            stop_datetime,
            yes,
            dry_run,
        } => {
            let range = ReplayRange {
                start_position,
                stop_position,
                start_datetime,
                stop_datetime,
            };
            let confirm = commands::Confirm::new(yes, dry_run);
            if !confirm.acts() {
                return match replay_plan(&config, &binlogs, &range) {
                    Ok(plan) => {
                        print!("{plan}");
                        confirm.footer("replay them");
                        confirm.exit(ExitCode::SUCCESS)
                    }
                    Err(e) => {
                        tracing::error!("{e}");
                        ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
                    }
                };
            }
            match runtime.block_on(replay(config, binlogs, range)) {
                Ok(true) => Ok(()),
                Ok(false) => {
                    tracing::warn!(
                        "replay stopped before the end of the range: continue with \
                         --start-position at the summary's last position"
                    );
                    return ExitCode::from(130);
                }
                Err(e) => Err(e),
            }
        }
    };
    // Everything durable is done when `run`/`replay` return. A blocking broker request that a
    // stop abandoned (a metadata request to an unreachable Kafka, up to its own timeout) must
    // not hold up the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}

async fn run(config_path: PathBuf) -> Result<(), RelayError> {
    let process = ProcessConfig::load(&config_path)?;
    if process.multi {
        return run_sources(process, config_path).await;
    }
    let Some(config) = process.sources.into_iter().next().map(|s| s.config) else {
        return Err(RelayError::Config("the configuration has no source".into()));
    };
    tracing::info!(
        connector = %config.connector_name,
        mysql = %outbox_relay_core::error::redact_url(&config.mysql.url),
        kafka = %config.kafka.bootstrap_servers,
        tables = ?config.outbox_tables().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "starting outbox-relay {}", env!("CARGO_PKG_VERSION")
    );
    let stop_rx = stop_on_signal(
        "signal received: stopping (waiting for Kafka to acknowledge what was sent, then \
         writing the checkpoint)",
    );
    outbox_relay_engine::run(config, stop_rx).await?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// `run` with `[[source]]` tables or `sources_dir`: every source in this process, the
/// configuration read again on SIGHUP (and every `sources_poll_ms`).
async fn run_sources(process: ProcessConfig, config_path: PathBuf) -> Result<(), RelayError> {
    tracing::info!(
        sources = ?process.sources.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        "starting outbox-relay {} with {} sources", env!("CARGO_PKG_VERSION"), process.sources.len()
    );
    let stop_rx = stop_on_signal(
        "signal received: stopping every source (waiting for Kafka to acknowledge what was \
         sent, then writing the checkpoints)",
    );
    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!(
                "cannot listen for SIGHUP: the configuration is read again only \
                every sources_poll_ms"
            );
            return;
        };
        while hup.recv().await.is_some() {
            if reload_tx.send(()).is_err() {
                return;
            }
        }
    });
    let loader = move || ProcessConfig::load(&config_path);
    outbox_relay_engine::run_sources(process, loader, reload_rx, stop_rx).await?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// `replay` without `--yes`: what it would read and where the records would go, from the
/// configuration and the files' sizes (the files are not decoded: the plan is immediate).
///
/// # Errors
/// As [`commands::load`]; [`RelayError::Argument`] for a `--binlog` file that cannot be read.
fn replay_plan(
    config_path: &std::path::Path,
    binlogs: &[PathBuf],
    range: &ReplayRange,
) -> Result<String, RelayError> {
    use std::fmt::Write as _;
    let config = commands::load(config_path)?;
    let mut plan = String::new();
    for file in binlogs {
        let size = std::fs::metadata(file)
            .map_err(|e| {
                RelayError::Argument(format!("--binlog {}: cannot be read: {e}", file.display()))
            })?
            .len();
        let _ = writeln!(plan, "file        {} ({size} bytes)", file.display());
    }
    let bound = |p: Option<u64>, t: Option<i64>, none: &str| match (p, t) {
        (Some(p), _) => format!("position {p}"),
        (None, Some(t)) => ops::format_utc(t),
        (None, None) => none.to_owned(),
    };
    let _ = writeln!(
        plan,
        "range       from {} to {}",
        bound(
            range.start_position,
            range.start_datetime,
            "the start of the first file"
        ),
        bound(
            range.stop_position,
            range.stop_datetime,
            "the end of the last file"
        )
    );
    let tables: Vec<String> = config
        .outbox_tables()
        .iter()
        .map(ToString::to_string)
        .collect();
    let _ = writeln!(plan, "tables      {}", tables.join(", "));
    let _ = writeln!(
        plan,
        "records     to {} on {} (at least once; no MySQL connection, no checkpoint)",
        config.outbox.topic, config.kafka.bootstrap_servers
    );
    Ok(plan)
}

/// `replay`: `Ok(true)` when the whole range was replayed, `Ok(false)` when a signal stopped it.
async fn replay(
    config_path: PathBuf,
    binlogs: Vec<PathBuf>,
    range: ReplayRange,
) -> Result<bool, RelayError> {
    let config = commands::load(&config_path)?;
    tracing::info!(
        kafka = %config.kafka.bootstrap_servers,
        tables = ?config.outbox.tables,
        topic = %config.outbox.topic,
        files = ?binlogs,
        ?range,
        "replaying binlog files with outbox-relay {} (no MySQL connection, no checkpoint)",
        env!("CARGO_PKG_VERSION")
    );
    let stop_rx = stop_on_signal(
        "signal received: stopping the replay (waiting for Kafka to acknowledge what was sent)",
    );
    let summary = outbox_relay_engine::replay(config, binlogs, range, stop_rx).await?;
    Ok(summary.complete)
}

/// A stop flag that turns `true` at the first SIGTERM/SIGINT; a second signal (a second or more
/// later) exits at once with code 130.
fn stop_on_signal(message: &'static str) -> watch::Receiver<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("{message}");
        let _ = stop_tx.send(true);
        let first = std::time::Instant::now();
        // A second signal while draining means "now" — unless it is the same stop delivered
        // twice (timeout(1) and some supervisors signal both the process and its group).
        loop {
            wait_for_signal().await;
            if first.elapsed() >= Duration::from_secs(1) {
                break;
            }
        }
        tracing::warn!("second signal: exiting without waiting for Kafka");
        std::process::exit(130);
    });
    stop_rx
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod allocator_tests {
    use std::ffi::c_void;

    #[allow(unsafe_code)]
    extern "C" {
        fn malloc(size: usize) -> *mut c_void;
        fn free(p: *mut c_void);
        fn mi_is_in_heap_region(p: *const c_void) -> bool;
    }

    /// librdkafka frees a record's value with free(3) (relay-kafka's `sink/served.rs`,
    /// `RD_KAFKA_MSG_F_FREE`), a buffer Rust's global allocator allocated: free(3) must be
    /// mimalloc's. It is when mimalloc's `override` replaced malloc(3) and free(3) in this
    /// binary; without it, glibc would free mimalloc's memory.
    #[test]
    #[allow(unsafe_code)]
    fn librdkafka_frees_what_the_global_allocator_allocated() {
        let rust = Vec::<u8>::with_capacity(64);
        // SAFETY: plain C allocation calls; the block is freed once.
        unsafe {
            assert!(mi_is_in_heap_region(rust.as_ptr().cast()));
            let c = malloc(64);
            assert!(!c.is_null());
            assert!(
                mi_is_in_heap_region(c),
                "malloc(3) is not mimalloc's: librdkafka's free(3) would not be either"
            );
            free(c);
        }
    }
}
