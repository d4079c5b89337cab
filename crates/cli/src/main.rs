//! `outbox-relay`: the command line. It only wires things together: parse arguments, set up
//! logging, load the config, run the relay until SIGTERM/SIGINT.
//!
//! Exit codes: 0 stopped on request (final checkpoint written); 1 runtime error; 2 usage or
//! configuration error; 3 a server prerequisite is not met.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use outbox_relay_core::config::RelayConfig;
use outbox_relay_core::error::RelayError;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Relays committed outbox INSERTs from the MySQL/MariaDB binlog to Kafka"
)]
struct Cli {
    /// Log format on stderr. Level via RUST_LOG (default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
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
    let result = match cli.command {
        Command::Run { config } => runtime.block_on(run(config)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}

async fn run(config_path: PathBuf) -> Result<(), RelayError> {
    let config = RelayConfig::load(&config_path)?;
    tracing::info!(
        connector = %config.connector_name,
        mysql = %outbox_relay_core::redact_url(&config.mysql.url),
        kafka = %config.kafka.bootstrap_servers,
        tables = ?config.outbox_tables().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "starting outbox-relay {}", env!("CARGO_PKG_VERSION")
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(
            "signal received: stopping (waiting for Kafka to acknowledge what was sent, then \
             writing the checkpoint)"
        );
        let _ = stop_tx.send(true);
        let first = std::time::Instant::now();
        // A second signal while draining means "now" — unless it is the same stop delivered
        // twice (timeout(1) and some supervisors signal both the process and its group).
        loop {
            wait_for_signal().await;
            if first.elapsed() >= std::time::Duration::from_secs(1) {
                break;
            }
        }
        tracing::warn!("second signal: exiting without waiting for Kafka");
        std::process::exit(130);
    });
    outbox_relay_core::run(config, stop_rx).await?;
    tracing::info!("stopped cleanly");
    Ok(())
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
