//! The operator subcommands (`check`, `status`, `reset`, `migrate`, `prune`, `republish`,
//! `dlq replay`, `trace`, `migrate-from debezium`, `fleet status`): argument parsing and printing; the work is in `crate::ops`.
//! Reports go to stdout, logs to stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::ops::republish::{RepublishOptions, Selection};
use crate::ops::{self, dlq::ReplayOptions, prune::PruneOptions, reset::Target};
use clap::Subcommand;
use outbox_relay_core::config::process::ProcessConfig;
use outbox_relay_core::config::RelayConfig;
use outbox_relay_core::error::RelayError;
use outbox_relay_mysql::binlog::replay::parse_datetime;

#[derive(Subcommand)]
pub enum OpsCommand {
    /// Check every prerequisite of `run`: one line per check (OK, WARN or FAIL), with the fix
    /// for each failure.
    ///
    /// Checks the binlog settings, server_id, GTID settings (mysql.resume = "gtid"), binlog
    /// retention against the checkpoint, privileges, the outbox tables (mapped columns and
    /// their types), the checkpoint table, Kafka, whether the brokers auto-create topics and
    /// which of the configured topics exist, the topics' size limits, and each table's payloads
    /// (the column's bound and the newest rows) against the largest record the producer and
    /// the topic allow. Changes nothing.
    /// With --inbox-url URL (repeatable): also a consumer's inbox tables (present, keys
    /// compared byte for byte; migrations/0005_inbox_keys.sql).
    ///
    /// Exit codes: 0 no check failed (warnings allowed); 2 configuration error; 3 a check
    /// failed.
    #[command(verbatim_doc_comment)]
    Check {
        /// TOML config file; `OUTBOX_RELAY__SECTION__KEY` environment variables override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// A consumer's database whose inbox tables are checked too, e.g.
        /// mysql://user:pass@host:3306/billing (repeatable).
        #[arg(long = "inbox-url", value_name = "URL")]
        inbox_urls: Vec<String>,
    },
    /// Show the checkpoint, the server's current position, the lag and the lease.
    ///
    /// Lag in bytes: binlog from the checkpoint to the server's end (SHOW BINARY LOGS sizes).
    /// Lag in seconds: 0 when caught up, else the time since the checkpoint was written.
    ///
    /// Exit codes: 0 printed; 1 runtime error; 2 configuration error; 3 the checkpoint table
    /// is missing.
    #[command(verbatim_doc_comment)]
    Status {
        /// TOML config file; `OUTBOX_RELAY__SECTION__KEY` environment variables override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// Print one JSON object (keys in docs/src/operations/status.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Move the connector's checkpoint (rows_acked = 0, gtid_set of the new position).
    ///
    /// Refuses positions the server no longer has, positions inside a transaction, and runs
    /// while an instance of the connector holds its lease. With --yes it takes the lease
    /// (a relay started meanwhile waits), writes the row under a new lease token and releases
    /// the lease. Without --yes it prints what it would do and changes nothing (exit 4);
    /// --dry-run does the same with exit code 0.
    ///
    /// Exit codes: 0 written (or --dry-run printed the plan); 1 runtime error; 2 configuration
    /// error or an unusable target; 3 the lease is held (a relay runs) or the checkpoint table
    /// is missing; 4 not confirmed (no --yes): the plan was printed, nothing changed.
    #[command(verbatim_doc_comment)]
    Reset {
        /// TOML config file; `OUTBOX_RELAY__SECTION__KEY` environment variables override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// earliest | latest | FILE:POS | GTID-SET | "YYYY-MM-DD HH:MM:SS" (UTC: the boundary
        /// before the first transaction committed at or after it).
        #[arg(long, value_name = "TARGET", value_parser = parse_target)]
        to: Target,
        /// Write the new checkpoint (without it: the plan is printed, exit code 4).
        #[arg(long)]
        yes: bool,
        /// Print the plan and write nothing, with exit code 0 (for scripts).
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
    },
    /// Create or upgrade the checkpoint table (and with --outbox the outbox tables) from the
    /// SQL in migrations/ (embedded). Idempotent.
    ///
    /// Acts without --yes (the one exception to the confirmation rule): it only creates what
    /// is missing, adds missing columns and widens one, never drops or rewrites a row, and a
    /// second run changes nothing. An up-to-date table runs no statement at all, so the
    /// relay's own user may run it; a missing privilege is named with its GRANT.
    ///
    /// With --inbox --database-url URL: create the consumer side's tables (outbox_inbox,
    /// outbox_inbox_version; migrations/0004_inbox.sql) in a consumer's database instead, and
    /// make existing ones compare keys byte for byte (migrations/0005_inbox_keys.sql); no
    /// config file needed.
    ///
    /// Exit codes: 0 done (or nothing to do); 1 runtime error; 2 configuration error (also an
    /// outbox table to create whose mapping is not the common shape); 3 a missing privilege
    /// (the message names the statement, the privilege and the GRANT).
    #[command(verbatim_doc_comment)]
    Migrate {
        /// TOML config file; `OUTBOX_RELAY__SECTION__KEY` environment variables override it.
        #[arg(
            long,
            short,
            env = "OUTBOX_RELAY_CONFIG",
            required_unless_present = "inbox"
        )]
        config: Option<PathBuf>,
        /// Also create the configured outbox tables that do not exist, in the common shape
        /// (migrations/0001_outbox.sql). Existing tables are not changed.
        #[arg(long, conflicts_with = "inbox")]
        outbox: bool,
        /// Create the inbox tables in the consumer's database --database-url.
        #[arg(long, requires = "database_url")]
        inbox: bool,
        /// The consumer's database: mysql://user:pass@host:3306/db.
        #[arg(long, env = "OUTBOX_INBOX_DATABASE_URL")]
        database_url: Option<String>,
    },
    /// Delete outbox rows that are older than --older-than AND already relayed.
    ///
    /// Selects old rows by the mapped created_at column, then waits until the checkpoint covers
    /// the binlog up to a position read after that selection, then deletes exactly those rows
    /// in batches. It can never delete a row the relay has not acknowledged
    /// (docs/src/operations/prune.md). Without --yes it counts the rows it would delete and
    /// deletes nothing (exit 4); --dry-run does the same with exit code 0.
    ///
    /// Exit codes: 0 done (the counts are printed), or --dry-run printed them; 1 runtime error
    /// (also: the checkpoint did not cover the rows within --max-wait-ms; nothing more was
    /// deleted); 2 configuration or argument error (also: a table mapped without created_at);
    /// 3 no checkpoint of this server, or a missing privilege (DELETE: the message names the
    /// GRANT); 4 not confirmed (no --yes): the counts were printed, nothing deleted.
    ///
    /// With --inbox: delete a consumer's inbox rows instead (--database-url, --consumer,
    /// --bootstrap-servers; no config file): only rows processed longer ago than --older-than
    /// whose records the consumer group (--group, default the consumer name) has committed past,
    /// so a redelivery is still recognised (docs/src/consumers/inbox.md).
    #[command(verbatim_doc_comment)]
    Prune {
        /// TOML config file; `OUTBOX_RELAY__SECTION__KEY` environment variables override it.
        #[arg(
            long,
            short,
            env = "OUTBOX_RELAY_CONFIG",
            required_unless_present = "inbox"
        )]
        config: Option<PathBuf>,
        /// Prune a consumer's inbox table (outbox_inbox) instead of the outbox.
        #[arg(long, requires_all = ["database_url", "consumer", "bootstrap_servers"])]
        inbox: bool,
        /// With --inbox: the consumer's database, mysql://user:pass@host:3306/db.
        #[arg(long, env = "OUTBOX_INBOX_DATABASE_URL")]
        database_url: Option<String>,
        /// With --inbox: the consumer name (the inbox key).
        #[arg(long)]
        consumer: Option<String>,
        /// With --inbox: the consumer group whose committed offsets bound the delete (default:
        /// the consumer name).
        #[arg(long)]
        group: Option<String>,
        /// With --inbox: Kafka bootstrap servers of the consumer group.
        #[arg(long)]
        bootstrap_servers: Option<String>,
        /// Retention: rows with created_at older than this (7d, 12h, 30m, 90s, 2w). With
        /// --inbox: rows processed longer ago, for every topic without --topic-retention.
        #[arg(long, value_name = "AGE", value_parser = ops::prune::parse_retention)]
        older_than: Duration,
        /// With --inbox: a topic's own retention, TOPIC=AGE (repeatable), for topics whose
        /// window differs from --older-than (the consumer's per-topic `inbox_retention`). A
        /// row's topic is its record's original topic (a retry copy's inbox row names it).
        #[arg(long = "topic-retention", value_name = "TOPIC=AGE",
              value_parser = ops::prune::parse_topic_retention, requires = "inbox")]
        topic_retention: Vec<(String, Duration)>,
        /// Rows per DELETE statement.
        #[arg(long, default_value_t = 1000)]
        batch_size: usize,
        /// Pause between DELETE statements, in ms.
        #[arg(long, default_value_t = 100)]
        pause_ms: u64,
        /// Delete (without it: count the rows that would be deleted, exit code 4).
        #[arg(long)]
        yes: bool,
        /// Count the rows that would be deleted and delete nothing, with exit code 0 (for
        /// scripts).
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
        /// Longest wait for the relay's checkpoint to cover the selected rows, in ms.
        #[arg(long, default_value_t = 30_000)]
        max_wait_ms: u64,
    },
    /// Send rows still in the outbox table to Kafka again (incident recovery).
    ///
    /// Select rows by --event-key (repeatable), by --since/--until (created_at, UTC; DATETIME
    /// read in outbox.datetime_time_zone), or by --where (an SQL condition on the outbox
    /// table). Each row becomes the record `run` would send (same topic, key, headers,
    /// envelope) plus the header republished_at (RFC 3339, UTC), produced in id order with the
    /// relay's producer settings (each key on its partition, in order), at most --rate rows
    /// per second. The record timestamp is the republish time (or created_at with
    /// outbox.timestamp = "column"). Consumers with an inbox see the same event_key again:
    /// they skip it unless their inbox row is gone.
    ///
    /// Without --yes it prints how many rows each table would send and the first ones, and
    /// sends nothing (exit 4); --dry-run does the same with exit code 0.
    ///
    /// Exit codes: 0 every selected row sent and acknowledged (or --dry-run printed the plan);
    /// 1 runtime error (the rows before the failing one were sent: the message says how
    /// many); 2 configuration or argument error; 3 sent, but some rows cannot become records
    /// (listed, as the relay would dead-letter them); 4 not confirmed (no --yes): the plan was
    /// printed.
    #[command(verbatim_doc_comment)]
    Republish {
        /// TOML config file (the relay's); `OUTBOX_RELAY__SECTION__KEY` environment variables
        /// override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// Rows with this event_key (repeat for more).
        #[arg(long = "event-key", value_name = "KEY")]
        event_keys: Vec<String>,
        /// Rows created at or after this time ("YYYY-MM-DD HH:MM:SS", UTC).
        #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
        since: Option<i64>,
        /// Rows created before this time ("YYYY-MM-DD HH:MM:SS", UTC).
        #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
        until: Option<i64>,
        /// Rows matching this SQL condition on the outbox table, e.g. "aggregate_id = 'o-1'".
        #[arg(long = "where", value_name = "SQL")]
        where_sql: Option<String>,
        /// Only this outbox table (database.table); default: every configured one.
        #[arg(long)]
        table: Option<String>,
        /// Most rows sent per second.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        rate: u32,
        /// Send (without it: print the plan, exit 4).
        #[arg(long)]
        yes: bool,
        /// Print the plan and send nothing, with exit code 0 (for scripts).
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
    },
    /// Follow one event from its outbox row to its consumers.
    ///
    /// Shows the outbox row (table, id, created_at) or that there is none (pruned or never
    /// written); the binlog transaction that inserted it (positions, GTID, commit time) and
    /// whether the connector's checkpoint is past it (if not: NOT YET RELAYED, and how many
    /// binlog bytes behind); its record on Kafka (topic, partition, offset, timestamp; the
    /// partition from the key as Kafka's partitioner computes it, the offset from the time:
    /// never a full topic scan) or its dead letter with the reason; the consumer groups whose
    /// committed offset is past it; and the inbox rows for it in each --inbox-url database.
    /// Reads only: it changes nothing and can run beside the relay (its binlog dump uses
    /// another server_id).
    ///
    /// Exit codes: 0 the record is on its topic; 1 runtime error; 2 configuration or argument
    /// error; 3 dead-lettered (and not on its topic); 5 a row exists but no record was found
    /// (not yet relayed, or outside --window); 6 no outbox row has that event_key.
    #[command(verbatim_doc_comment)]
    Trace {
        /// TOML config file (the relay's); `OUTBOX_RELAY__SECTION__KEY` environment variables
        /// override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// The event_key to follow (the event_key column's value).
        event_key: String,
        /// Only this outbox table (database.table); default: every configured one.
        #[arg(long)]
        table: Option<String>,
        /// A consumer's database whose outbox_inbox table is read, e.g.
        /// mysql://user:pass@host:3306/fulfilment (repeat for more).
        #[arg(long = "inbox-url", value_name = "URL")]
        inbox_urls: Vec<String>,
        /// How long after created_at the transaction may have committed and the record been
        /// stamped, in seconds.
        #[arg(long, default_value_t = 600)]
        window: u64,
        /// Most records read per partition.
        #[arg(long, default_value_t = 100_000)]
        max_scan: u64,
        /// The replica server_id of the binlog dump (default: 4000000000 + a hash of the
        /// connector name and the process id; never mysql.server_id, which the running relay
        /// uses).
        #[arg(long)]
        server_id: Option<u32>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Dead-letter tools (`dlq replay`).
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Start the relay where another CDC tool stopped (`migrate-from debezium`).
    MigrateFrom {
        #[command(subcommand)]
        from: MigrateFromCommand,
    },
    /// A fleet of processes sharing the sources of a `[fleet]` configuration (`fleet status`).
    Fleet {
        #[command(subcommand)]
        command: FleetCommand,
    },
}

#[derive(Subcommand)]
pub enum FleetCommand {
    /// List every source of the configuration: its control-topic partition, the process that
    /// owns it (the consumer group's member assigned that partition), the lease holder and
    /// token, the last checkpoint and its age, the lag, and its state (running, waiting for
    /// lease, unowned, unknown), plus the spread of sources over the members. Needs no running
    /// process of its own; changes nothing.
    ///
    /// Exit codes: 0 printed; 1 Kafka cannot be reached; 2 configuration error (or no
    /// [fleet] section).
    #[command(verbatim_doc_comment)]
    Status {
        /// TOML config file (with [fleet]); `OUTBOX_RELAY__SECTION__KEY` environment variables
        /// override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// Print one JSON object (keys in docs/src/fleet.md) instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum MigrateFromCommand {
    /// Write the relay's checkpoint from the committed source offset of a stopped Debezium
    /// MySQL or MariaDB connector (outbox EventRouter), so the relay starts exactly where it
    /// stopped: no gap, no duplicate.
    ///
    /// Reads the offset from Kafka Connect's offsets topic (--offsets-topic, bootstrap from
    /// kafka.bootstrap_servers; the last record of the key ["CONNECTOR",{"server":"PREFIX"}]
    /// wins) or from a Debezium Server / embedded engine offset file (--offset-file, Kafka
    /// Connect's FileOffsetBackingStore). Its file/pos is the start of the transaction
    /// Debezium was in; its event/row say how much of it Debezium delivered. The command reads
    /// the binlog from there with the relay's decoder and counts the outbox rows already
    /// delivered (rows_acked). Refuses offsets taken during a snapshot, binlog files the server
    /// no longer has, GTIDs the server does not have, and runs while an instance of the
    /// connector holds its lease. With --yes it writes as `reset` does (lease, state table,
    /// exactly-once progress topic).
    ///
    /// Exit codes: 0 written (or --dry-run printed); 1 runtime error; 2 configuration error or
    /// an unusable offset; 3 the lease is held (a relay runs) or the checkpoint table is
    /// missing; 4 not confirmed (no --yes): the plan was printed, nothing changed.
    #[command(verbatim_doc_comment)]
    #[command(group(clap::ArgGroup::new("offset_source").required(true).args(["offsets_topic", "offset_file"])))]
    Debezium {
        /// TOML config file; `OUTBOX_RELAY__SECTION__KEY` environment variables override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// Kafka Connect's offsets topic (the worker's offset.storage.topic, e.g.
        /// connect-offsets).
        #[arg(long, value_name = "TOPIC", requires = "connector")]
        offsets_topic: Option<String>,
        /// The Debezium connector's name (with --offset-file: only its entries).
        #[arg(long, value_name = "NAME")]
        connector: Option<String>,
        /// The connector's topic.prefix; needed when it has offsets of several.
        #[arg(long, value_name = "PREFIX")]
        topic_prefix: Option<String>,
        /// A Debezium Server / embedded engine offset file (offset.storage.file.filename).
        #[arg(long, value_name = "PATH", conflicts_with = "offsets_topic")]
        offset_file: Option<PathBuf>,
        /// Print what would be written and write nothing, with exit code 0 (for scripts).
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
        /// Write the checkpoint (without it: the plan is printed, exit code 4).
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Re-produce dead letters to the topics they were meant for, after the fix.
    ///
    /// Reads dead_letter.topic (read_committed) from the replay's consumer group's committed
    /// offsets to the end it has when the run starts. Each selected dead letter goes to its
    /// dlq_topic with its key, value and headers, the dlq_* headers removed and
    /// dlq_replayed_from = <topic>/<partition>/<offset> added, in dead-letter order (per key:
    /// the rows' order). Records and the group's offsets are committed together in Kafka
    /// transactions: a run stopped anywhere goes on where it stopped, and nothing is replayed
    /// twice for read_committed consumers. Filters combine with AND; the default group is
    /// derived from them, so the same selection resumes and another one starts afresh.
    /// Dead letters whose value was dropped (too large) or that have no topic are listed
    /// (SKIP) and left: republish their rows from the outbox. Without --yes it lists what it
    /// would replay, sends nothing and commits no offset (exit 4); --dry-run does the same
    /// with the exit code of the run (0, or 3 when some cannot be replayed).
    ///
    /// Exit codes: 0 done (every selected dead letter replayed); 1 runtime error (what was
    /// committed stays; run again); 2 configuration or argument error (also: the dead-letter
    /// topic does not exist); 3 done, but some selected dead letters cannot be replayed
    /// (listed); 4 not confirmed (no --yes): the list was printed, nothing sent.
    #[command(verbatim_doc_comment)]
    Replay {
        /// TOML config file (the relay's: [kafka] and [dead_letter]);
        /// `OUTBOX_RELAY__SECTION__KEY` environment variables override it.
        #[arg(long, short, env = "OUTBOX_RELAY_CONFIG")]
        config: PathBuf,
        /// Only dead letters written at or after this time ("YYYY-MM-DD HH:MM:SS", UTC).
        #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
        since: Option<i64>,
        /// Only dead letters written before this time ("YYYY-MM-DD HH:MM:SS", UTC).
        #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
        until: Option<i64>,
        /// Only dead letters of this outbox table (database.table, as in dlq_table).
        #[arg(long)]
        table: Option<String>,
        /// Only dead letters whose dlq_reason contains this text.
        #[arg(long)]
        reason: Option<String>,
        /// Only dead letters meant for this topic (dlq_topic).
        #[arg(long)]
        topic: Option<String>,
        /// Only dead letters with this event_key (repeat for more).
        #[arg(long = "event-key", value_name = "KEY")]
        event_keys: Vec<String>,
        /// The replay's consumer group and transactional.id (default:
        /// outbox-relay.dlq-replay.<connector_name>.<hash of the filters>).
        #[arg(long)]
        group: Option<String>,
        /// Replay (without it: list what would be replayed, exit code 4).
        #[arg(long)]
        yes: bool,
        /// List what would be replayed, send nothing and commit no offset, with the exit code
        /// of the run (0, or 3 when some cannot be replayed; for scripts).
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
        /// Stop after this many replayed records (the next run goes on).
        #[arg(long, value_name = "N")]
        max_records: Option<u64>,
        /// Records per Kafka transaction.
        #[arg(long, default_value_t = 500)]
        batch: usize,
    },
}

fn parse_target(s: &str) -> Result<Target, String> {
    s.parse::<Target>().map_err(|e| match e {
        RelayError::Argument(m) => m,
        other => other.to_string(),
    })
}

/// The source selected by `--source` (`OUTBOX_RELAY_SOURCE`) for the operator commands, set
/// once by `main` before a command runs.
static SOURCE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Selects the source of a many-source configuration the operator commands act on.
pub fn select_source(name: Option<String>) {
    let _ = SOURCE.set(name);
}

/// The configuration of the source an operator command acts on: a single-source file's one
/// source, or the one `--source` names in a file with `[[source]]` tables or `sources_dir`.
///
/// # Errors
/// As [`ProcessConfig::load`]; [`RelayError::Argument`] when a many-source file is given
/// without `--source`, or `--source` names no source of it (the message lists them).
pub(crate) fn load(config: &std::path::Path) -> Result<RelayConfig, RelayError> {
    let process = ProcessConfig::load(config)?;
    let wanted = SOURCE.get().cloned().flatten();
    let names = || {
        process
            .sources
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match wanted {
        None if process.multi => Err(RelayError::Argument(format!(
            "{} configures many sources ({}): name the one to act on with --source NAME (or \
             OUTBOX_RELAY_SOURCE)",
            config.display(),
            names()
        ))),
        None => process
            .sources
            .into_iter()
            .next()
            .map(|s| s.config)
            .ok_or_else(|| RelayError::Config("the configuration has no source".into())),
        Some(name) => {
            let list = names();
            process
                .sources
                .into_iter()
                .find(|s| s.name == name)
                .map(|s| s.config)
                .ok_or_else(|| {
                    RelayError::Argument(format!(
                        "--source {name:?}: {} has no such source (it has: {list})",
                        config.display()
                    ))
                })
        }
    }
}

/// How a command that changes state was asked to run. The one rule of every such command
/// (`reset`, `republish`, `prune`, `prune --inbox`, `dlq replay`, `migrate-from debezium`,
/// `replay`): with `--yes` it acts; without it, it prints the plan, changes nothing and exits
/// [`ops::EXIT_NOT_CONFIRMED`]; `--dry-run` prints the plan too, with the exit code of a run
/// that acted (for scripts that check a plan). `migrate` is the documented exception.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Confirm {
    /// `--yes`: act.
    Act,
    /// Neither flag: the plan, exit 4.
    Plan,
    /// `--dry-run`: the plan, the exit code of a run.
    DryRun,
}

impl Confirm {
    /// From the two flags (clap makes them exclusive).
    pub(crate) fn new(yes: bool, dry_run: bool) -> Self {
        match (yes, dry_run) {
            (_, true) => Self::DryRun,
            (true, false) => Self::Act,
            (false, false) => Self::Plan,
        }
    }

    /// Whether the command may change anything.
    pub(crate) fn acts(self) -> bool {
        self == Self::Act
    }

    /// Prints the line after a plan whose report does not say it itself: nothing changed, and
    /// (without --dry-run) how to `act` ("delete them").
    pub(crate) fn footer(self, act: &str) {
        match self {
            Self::Act => {}
            Self::DryRun => println!("dry run: nothing changed"),
            Self::Plan => {
                println!("not confirmed: nothing changed; run again with --yes to {act}")
            }
        }
    }

    /// The exit code: `done` (the code of a run that acted) with --yes or --dry-run, else 4.
    pub(crate) fn exit(self, done: ExitCode) -> ExitCode {
        match self {
            Self::Plan => ExitCode::from(ops::EXIT_NOT_CONFIRMED),
            Self::Act | Self::DryRun => done,
        }
    }
}

fn fail(e: &RelayError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
}

/// Runs one operator command on `runtime`.
pub fn run(command: OpsCommand, runtime: &tokio::runtime::Runtime) -> ExitCode {
    match command {
        OpsCommand::Check { config, inbox_urls } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let mut report = runtime.block_on(ops::check::check(&config));
            for url in &inbox_urls {
                report
                    .checks
                    .extend(runtime.block_on(ops::inbox::inbox_checks(url)));
            }
            println!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            }
        }
        OpsCommand::Fleet {
            command: FleetCommand::Status { config, json },
        } => {
            let result = ProcessConfig::load(&config)
                .and_then(|p| runtime.block_on(ops::fleet::fleet_status(&p)));
            match result {
                Ok(s) if json => {
                    println!("{}", s.to_json());
                    ExitCode::SUCCESS
                }
                Ok(s) => {
                    print!("{s}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::Status { config, json } => {
            let result = load(&config).and_then(|c| runtime.block_on(ops::status::status(&c)));
            match result {
                Ok(s) if json => {
                    println!("{}", s.to_json());
                    ExitCode::SUCCESS
                }
                Ok(s) => {
                    println!("{s}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::Reset {
            config,
            to,
            yes,
            dry_run,
        } => {
            let confirm = Confirm::new(yes, dry_run);
            let result = load(&config)
                .and_then(|c| runtime.block_on(ops::reset::reset(&c, &to, confirm.acts())));
            match result {
                Ok(r) => {
                    println!("{r}");
                    confirm.exit(ExitCode::SUCCESS)
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::MigrateFrom {
            from:
                MigrateFromCommand::Debezium {
                    config,
                    offsets_topic,
                    connector,
                    topic_prefix,
                    offset_file,
                    dry_run,
                    yes,
                },
        } => {
            let source = match (offsets_topic, offset_file, connector) {
                (Some(topic), None, Some(connector)) => ops::debezium::OffsetSource::Topic {
                    topic,
                    connector,
                    topic_prefix,
                },
                (None, Some(path), connector) => ops::debezium::OffsetSource::File {
                    path,
                    connector,
                    topic_prefix,
                },
                _ => {
                    return fail(&RelayError::Argument(
                        "give --offsets-topic TOPIC --connector NAME, or --offset-file PATH".into(),
                    ))
                }
            };
            let result = load(&config).and_then(|c| {
                runtime.block_on(ops::debezium::migrate_from(&c, &source, dry_run, yes))
            });
            match result {
                Ok(r) => {
                    println!("{r}");
                    Confirm::new(yes, dry_run).exit(ExitCode::SUCCESS)
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::Republish {
            config,
            event_keys,
            since,
            until,
            where_sql,
            table,
            rate,
            yes,
            dry_run,
        } => {
            let confirm = Confirm::new(yes, dry_run);
            let selection = match (
                event_keys.is_empty(),
                since.is_some() || until.is_some(),
                where_sql,
            ) {
                (false, false, None) => Selection::EventKeys(event_keys),
                (true, true, None) => Selection::Created {
                    since_ms: since.map(|s| s * 1000),
                    until_ms: until.map(|s| s * 1000),
                },
                (true, false, Some(sql)) => Selection::Where(sql),
                _ => {
                    return fail(&RelayError::Argument(
                        "select the rows with one of --event-key, --since/--until or --where"
                            .into(),
                    ))
                }
            };
            let config = match load(&config) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let opts = RepublishOptions {
                selection,
                table,
                rate,
                yes: confirm.acts(),
            };
            match runtime.block_on(ops::republish::republish(&config, &opts)) {
                Ok(report) => {
                    print!("{report}");
                    if confirm.acts() && report.refused() > 0 {
                        ExitCode::from(3)
                    } else {
                        confirm.exit(ExitCode::SUCCESS)
                    }
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::Dlq {
            command:
                DlqCommand::Replay {
                    config,
                    since,
                    until,
                    table,
                    reason,
                    topic,
                    event_keys,
                    group,
                    yes,
                    dry_run,
                    max_records,
                    batch,
                },
        } => {
            let confirm = Confirm::new(yes, dry_run);
            let config = match load(&config) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let opts = ReplayOptions {
                since_ms: since.map(|s| s * 1000),
                until_ms: until.map(|s| s * 1000),
                table,
                reason,
                topic,
                event_keys,
                group,
                dry_run: !confirm.acts(),
                max_records,
                batch,
            };
            let result = runtime.block_on(async move {
                tokio::task::spawn_blocking(move || ops::dlq::replay(&config, &opts))
                    .await
                    .map_err(|e| RelayError::kafka(format!("the replay task failed: {e}")))?
            });
            match result {
                Ok(report) => {
                    println!("{report}");
                    let done = if report.not_replayable > 0 {
                        ExitCode::from(3)
                    } else {
                        ExitCode::SUCCESS
                    };
                    confirm.footer("replay them");
                    confirm.exit(done)
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::Trace {
            config,
            event_key,
            table,
            inbox_urls,
            window,
            max_scan,
            server_id,
            json,
        } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let opts = ops::trace::TraceOptions {
                event_key,
                table,
                inbox_urls,
                window_secs: window,
                max_scan,
                server_id,
            };
            match runtime.block_on(ops::trace::trace(&config, &opts)) {
                Ok(report) => {
                    if json {
                        match serde_json::to_string_pretty(&report) {
                            Ok(text) => println!("{text}"),
                            Err(e) => {
                                return fail(&RelayError::Argument(format!(
                                    "the report cannot be written as JSON: {e}"
                                )))
                            }
                        }
                    } else {
                        print!("{report}");
                    }
                    ExitCode::from(report.verdict().exit_code())
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::Migrate {
            inbox: true,
            database_url: Some(url),
            ..
        } => match runtime.block_on(ops::inbox::migrate_inbox(&url)) {
            Ok(r) => {
                print!("{r}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        OpsCommand::Migrate { config, outbox, .. } => {
            let Some(config) = config else {
                return fail(&RelayError::Argument(
                    "migrate needs --config (or --inbox --database-url URL)".into(),
                ));
            };
            let result =
                load(&config).and_then(|c| runtime.block_on(ops::migrate::migrate(&c, outbox)));
            match result {
                Ok(r) => {
                    println!("{r}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::Prune {
            inbox: true,
            database_url: Some(database_url),
            consumer: Some(consumer),
            group,
            bootstrap_servers: Some(bootstrap_servers),
            older_than,
            topic_retention,
            batch_size,
            pause_ms,
            yes,
            dry_run,
            ..
        } => {
            let confirm = Confirm::new(yes, dry_run);
            let opts = ops::inbox::InboxPruneOptions {
                topic_retention: topic_retention.into_iter().collect(),
                database_url,
                bootstrap_servers,
                group: group.unwrap_or_else(|| consumer.clone()),
                consumer,
                older_than,
                batch_size,
                pause: Duration::from_millis(pause_ms),
                dry_run: !confirm.acts(),
            };
            match runtime.block_on(ops::inbox::prune_inbox(&opts)) {
                Ok(r) => {
                    println!("{r}");
                    confirm.footer("delete them");
                    confirm.exit(ExitCode::SUCCESS)
                }
                Err(e) => fail(&e),
            }
        }
        OpsCommand::Prune {
            config,
            older_than,
            batch_size,
            pause_ms,
            yes,
            dry_run,
            max_wait_ms,
            ..
        } => {
            let confirm = Confirm::new(yes, dry_run);
            let Some(config) = config else {
                return fail(&RelayError::Argument(
                    "prune needs --config (or --inbox with --database-url, --consumer and \
                     --bootstrap-servers)"
                        .into(),
                ));
            };
            let opts = PruneOptions {
                older_than,
                batch_size,
                pause: Duration::from_millis(pause_ms),
                dry_run: !confirm.acts(),
                max_wait: Duration::from_millis(max_wait_ms),
            };
            let result = load(&config).and_then(|c| runtime.block_on(ops::prune::prune(&c, &opts)));
            match result {
                Ok(r) => {
                    println!("{r}");
                    confirm.footer("delete them");
                    confirm.exit(ExitCode::SUCCESS)
                }
                Err(e) => fail(&e),
            }
        }
    }
}
