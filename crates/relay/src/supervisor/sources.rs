//! Many sources in one process ([`run_sources`]): each source is one [`super::supervise`] on a
//! task of its own (its own MySQL connections, lease, producer, checkpoint, retries), so one
//! source's fault — a wrong password, a purged binlog, a refused topic, a server down — is
//! that source's state and never stops, restarts or waits for another. The process serves
//! every source's metrics and readiness ([`Hub`]) and stays up until asked to stop.
//!
//! The configuration is read again on SIGHUP (`reload`) and every `sources_poll_ms`: a new
//! source starts, a removed one stops as on SIGTERM (its acknowledged records checkpointed,
//! its lease released), a changed one (its fingerprint differs) stops and starts again with
//! the new settings, the others are not touched. A source that failed for good starts again
//! on the next SIGHUP (or when its settings change). An invalid new configuration changes
//! nothing (logged, `outbox_relay_config_reloads_total{result="failed"}`).
//!
//! # A fleet (`[fleet]`)
//! With `[fleet]` the process joins the fleet's consumer group (relay-kafka's
//! [`Membership`]) and runs only the sources whose control-topic partition it is assigned (its
//! share): an assignment starts them; a revocation stops them and waits until they have
//! stopped (checkpoint written, lease released) before the revocation completes, so the
//! partition's next owner finds the lease free. Sources that keep their owner are not touched
//! (cooperative rebalancing). Reloads apply to the assigned share. Leases get the fleet's time
//! to live (`fleet.lease_ttl_ms`, relay-mysql's `state::lease`).
//!
//! Joining retries while Kafka cannot be reached by the process's top-level (shared) `[retry]`
//! (backoff, `max_attempts`; a source's own `[retry]` is that source's), and `/readyz` says
//! whether the process has joined ([`FleetState`]): it is not ready before.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use outbox_relay_core::config::process::{ProcessConfig, SourceConfig};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::http;
use outbox_relay_core::observe::hub::{FleetState, Hub};
use outbox_relay_core::observe::metrics::{Metrics, State};
use outbox_relay_core::observe::spans::RowSpans;
use outbox_relay_kafka::fleet::{source_partition, FleetEvent, Membership};

use super::retry::{wait_or_stop, Retry};
use super::{ready_limits, supervise, SPANS_FLUSH_TIMEOUT};

/// Reads the configuration again (the file and its sources folder).
pub trait Reload: Send {
    /// The configuration as it is now.
    ///
    /// # Errors
    /// As [`ProcessConfig::load`].
    fn load(&mut self) -> Result<ProcessConfig, RelayError>;
}

impl<F: FnMut() -> Result<ProcessConfig, RelayError> + Send> Reload for F {
    fn load(&mut self) -> Result<ProcessConfig, RelayError> {
        self()
    }
}

/// A running source.
struct Running {
    fingerprint: String,
    /// Turns `true` to stop it.
    stop: watch::Sender<bool>,
    /// Ends when the source has stopped (after its predecessor of the same name, see
    /// [`Sources::replace`]).
    task: JoinHandle<()>,
    /// Its metrics, to tell whether it failed (kept by a changed source's next run, so its
    /// counters go on).
    metrics: Arc<Metrics>,
    /// Set when the source is removed (not replaced): its metrics then leave the hub.
    removed: Arc<AtomicBool>,
}

/// The sources of the process, by name.
struct Sources {
    hub: Arc<Hub>,
    spans: Arc<Option<RowSpans>>,
    running: BTreeMap<String, Running>,
    /// The leases' time to live (a fleet's), or `None`.
    lease_ttl: Option<Duration>,
}

impl Sources {
    /// Starts `source`; when a source of its name still runs (a change), that one is stopped
    /// first and the new one starts once it has written its checkpoint and released its lease.
    fn start(&mut self, source: SourceConfig) {
        let name = source.name.clone();
        let previous = self.running.remove(&name).map(|old| {
            let _ = old.stop.send(true);
            old.task
        });
        let (stop, stop_rx) = watch::channel(false);
        let hub = Arc::clone(&self.hub);
        let spans = Arc::clone(&self.spans);
        // Registered now, so /readyz lists the source at once (starting); a changed source
        // keeps its series (counters stay monotonic across the change).
        let metrics = match hub.get(&name) {
            Some(m) if previous.is_some() => m,
            _ => hub.add(&name, ready_limits(&source.config)),
        };
        let removed = Arc::new(AtomicBool::new(false));
        let fingerprint = source.fingerprint.clone();
        let span = tracing::info_span!("source", source = %name);
        let (task_metrics, task_removed) = (Arc::clone(&metrics), Arc::clone(&removed));
        let task_name = name.clone();
        let lease_ttl = self.lease_ttl;
        let task = tokio::spawn(
            async move {
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
                run_source(
                    source,
                    stop_rx,
                    &spans,
                    Arc::clone(&task_metrics),
                    lease_ttl,
                )
                .await;
                if task_removed.load(Ordering::SeqCst) {
                    hub.remove(&task_name, &task_metrics);
                }
            }
            .instrument(span),
        );
        self.running.insert(
            name,
            Running {
                fingerprint,
                stop,
                task,
                metrics,
                removed,
            },
        );
    }

    /// Stops source `name` (in the background) and forgets it; `why` is logged.
    fn remove(&mut self, name: &str, why: &str) -> Option<JoinHandle<()>> {
        let old = self.running.remove(name)?;
        old.removed.store(true, Ordering::SeqCst);
        let _ = old.stop.send(true);
        if old.task.is_finished() {
            // Failed before: no task is left to take its metrics out of the hub. (A task that
            // ends from now on sees `removed` set and does it.)
            self.hub.remove(name, &old.metrics);
        }
        tracing::info!(source = %name, "source {why}: stopping it");
        Some(old.task)
    }

    /// Applies `config`: starts new sources, stops removed ones, restarts changed ones and,
    /// with `restart_failed`, failed ones.
    fn apply(&mut self, config: ProcessConfig, restart_failed: bool) {
        let wanted: BTreeMap<String, SourceConfig> = config
            .sources
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(task) = self.remove(&name, "removed from the configuration") {
                // The hub entry goes when the task ends (see run_source); nothing waits here.
                drop(task);
            }
        }
        for (name, source) in wanted {
            let action = match self.running.get(&name) {
                None => Some("added"),
                Some(r) if r.fingerprint != source.fingerprint => Some("changed"),
                Some(r) if restart_failed && (r.task.is_finished() || is_failed(&r.metrics)) => {
                    Some("failed before")
                }
                Some(_) => None,
            };
            if let Some(why) = action {
                tracing::info!(source = %name, why, "starting source");
                self.start(source);
            }
        }
    }

    /// Stops every source and waits until all have stopped.
    async fn stop_all(&mut self) {
        let running = std::mem::take(&mut self.running);
        for r in running.values() {
            r.removed.store(true, Ordering::SeqCst);
            let _ = r.stop.send(true);
        }
        for (_, r) in running {
            let _ = r.task.await;
        }
    }
}

fn is_failed(metrics: &Metrics) -> bool {
    matches!(metrics.state(), State::Failed { .. })
}

/// One source until it stops: on an error retrying cannot fix it stays listed as failed (not
/// ready, `outbox_relay_source_failed` 1) until a reload starts it again or removes it.
async fn run_source(
    source: SourceConfig,
    stop: watch::Receiver<bool>,
    spans: &Option<RowSpans>,
    metrics: Arc<Metrics>,
    lease_ttl: Option<Duration>,
) {
    let name = source.name.clone();
    tracing::info!(
        mysql = %outbox_relay_core::error::redact_url(&source.config.mysql.url),
        tables = ?source.config.outbox_tables().iter().map(ToString::to_string).collect::<Vec<_>>(),
        server_id = source.config.mysql.server_id,
        "source starting"
    );
    // A panic would be a bug; it must still not take the other sources down.
    let (spans, run_metrics) = (spans.clone(), Arc::clone(&metrics));
    let run = tokio::spawn(
        async move { supervise(source.config, stop, &spans, run_metrics, lease_ttl).await }
            .in_current_span(),
    );
    let result = match run.await {
        Ok(r) => r,
        Err(e) => Err(RelayError::Config(format!(
            "internal error: source {name:?} ended abnormally ({e}); please report it"
        ))),
    };
    match result {
        Ok(()) => {
            metrics.set_state(State::Stopping);
            tracing::info!("source stopped");
        }
        Err(e) => {
            tracing::error!(error = %e, "source failed: the other sources go on; fix the \
                cause, then reload the configuration (SIGHUP) to start it again");
            metrics.set_state(State::Failed {
                error: e.to_string(),
            });
        }
    }
}

/// Runs the sources of `config` until `shutdown` turns `true`, then stops them all (each
/// writing its final checkpoint) and returns. A message on `reload` (SIGHUP) reads the
/// configuration again through `loader` and also restarts failed sources; with
/// `sources_poll_ms` the configuration is also read again on that interval.
///
/// # Errors
/// Only what stops the whole process at start-up: [`RelayError::Config`] for `[http]`
/// (`http.listen` cannot be bound) or `[tracing]`; with `[fleet]`, [`RelayError::Kafka`] when
/// joining the group failed `retry.max_attempts` times in a row (the top-level `[retry]`;
/// exit code 1, as a single source whose retries are exhausted), or the error that made
/// joining impossible (a consumer that cannot be made from `[kafka.properties]`). Sources' own
/// errors are theirs (see the module documentation).
pub async fn run_sources(
    config: ProcessConfig,
    mut loader: impl Reload,
    mut reload: mpsc::UnboundedReceiver<()>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    let hub = Hub::new(true);
    let spans = Arc::new(RowSpans::start(&config.tracing)?);
    let server = http::start(&config.http, Arc::clone(&hub)).await?;
    tracing::info!(
        sources = config.sources.len(),
        folder = ?config.sources_dir,
        "starting the sources"
    );
    let (http_config, tracing_config) = (config.http.clone(), config.tracing.clone());
    let fleet_config = config.fleet.clone();
    let poll = (config.poll_ms > 0).then(|| Duration::from_millis(config.poll_ms));
    let mut sources = Sources {
        hub: Arc::clone(&hub),
        spans: Arc::clone(&spans),
        running: BTreeMap::new(),
        lease_ttl: fleet_config.as_ref().map(|f| f.lease_ttl()),
    };
    let (mut fleet, mut events) = match &fleet_config {
        None => (None, None),
        Some(f) => match join_fleet(f, &config, &hub, &mut shutdown).await? {
            None => {
                if let Some(server) = server {
                    server.stop().await;
                }
                return Ok(());
            }
            Some((membership, events)) => (
                Some(Share {
                    membership,
                    group: f.group_id.clone(),
                    generation: None,
                    assigned: BTreeSet::new(),
                    hub: Arc::clone(&hub),
                }),
                Some(events),
            ),
        },
    };
    let mut current = config.clone();
    sources.apply(share_of(config, fleet.as_ref()), false);
    let mut last_error: Option<String> = None;
    let mut tick = tokio::time::interval(poll.unwrap_or(Duration::from_secs(3600)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let signalled = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            r = reload.recv() => {
                if r.is_none() {
                    // No signal handler any more: only polling (if any) and the stop remain.
                    reload = mpsc::unbounded_channel().1;
                    continue;
                }
                true
            }
            _ = tick.tick(), if poll.is_some() => false,
            event = next_event(&mut events) => {
                let (Some(event), Some(share)) = (event, fleet.as_mut()) else {
                    events = None;
                    continue;
                };
                on_fleet_event(event, share, &mut sources, &current).await;
                continue;
            }
        };
        match loader.load() {
            Ok(new) => {
                last_error = None;
                if new.http.listen != http_config.listen
                    || new.http.enabled != http_config.enabled
                    || format!("{:?}", new.tracing) != format!("{tracing_config:?}")
                {
                    tracing::warn!(
                        "[http] or [tracing] changed: they apply after a restart of \
                        the process; the sources' changes apply now"
                    );
                }
                if !new.multi {
                    tracing::warn!(
                        "the configuration no longer has [[source]] tables or \
                        sources_dir: its single source is run as a source of this process until \
                        the process restarts"
                    );
                }
                if signalled {
                    tracing::info!("SIGHUP: configuration read again");
                }
                if format!("{:?}", new.fleet) != format!("{fleet_config:?}") {
                    tracing::warn!(
                        "[fleet] changed: it applies after a restart of the process; the \
                        sources' changes apply now (to this process's share)"
                    );
                }
                current = new.clone();
                sources.apply(share_of(new, fleet.as_ref()), signalled);
                hub.process_metrics().config_reloaded(true);
            }
            Err(e) => {
                let text = e.to_string();
                // Polling would repeat the same error every interval: log it once.
                if signalled || last_error.as_deref() != Some(&text) {
                    tracing::error!(error = %text, "the new configuration is invalid: the \
                        sources go on with their current settings");
                    hub.process_metrics().config_reloaded(false);
                }
                last_error = Some(text);
            }
        }
    }
    tracing::info!(
        "stopping every source (each waits for Kafka's acknowledgements and writes \
        its checkpoint)"
    );
    sources.stop_all().await;
    if let Some(share) = fleet {
        // Only now: the next owners find every lease free.
        share.membership.leave().await;
    }
    if let Some(server) = server {
        server.stop().await;
    }
    if let Some(spans) = spans.as_ref().clone() {
        spans.shutdown(SPANS_FLUSH_TIMEOUT).await;
    }
    Ok(())
}

/// This process's part of a fleet.
struct Share {
    membership: Membership,
    /// `fleet.group_id`.
    group: String,
    /// The group's generation of the last assignment; `None` before the first one or after
    /// the membership was lost.
    generation: Option<i32>,
    /// The control-topic partitions assigned to this process.
    assigned: BTreeSet<i32>,
    /// Where `/readyz` learns whether the process has joined.
    hub: Arc<Hub>,
}

impl Share {
    /// Shows the membership on `/readyz`: joined (with the current share) once a rebalance of
    /// some generation completed.
    fn report(&self) {
        if let Some(generation) = self.generation {
            self.hub.set_fleet(FleetState::Joined {
                group: self.group.clone(),
                generation,
                assigned: self.assigned.len(),
                partitions: self.membership.partitions(),
            });
        }
    }

    fn owns(&self, source: &str) -> bool {
        self.assigned
            .contains(&source_partition(source, self.membership.partitions()))
    }
}

/// The sources of `config` this process runs: all of them, or a fleet's share.
fn share_of(mut config: ProcessConfig, share: Option<&Share>) -> ProcessConfig {
    if let Some(share) = share {
        config.sources.retain(|s| share.owns(&s.name));
    }
    config
}

/// The next assignment change, or never without a fleet.
async fn next_event(
    events: &mut Option<mpsc::UnboundedReceiver<FleetEvent>>,
) -> Option<FleetEvent> {
    match events {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Applies an assignment change: assigned partitions' sources start; revoked ones' stop, and
/// the revocation is answered once they have stopped.
async fn on_fleet_event(
    event: FleetEvent,
    share: &mut Share,
    sources: &mut Sources,
    current: &ProcessConfig,
) {
    match event {
        FleetEvent::Assigned {
            partitions,
            generation,
        } => {
            share.assigned.extend(partitions);
            sources.apply(share_of(current.clone(), Some(share)), false);
            share.generation = Some(generation);
            share.report();
        }
        FleetEvent::Revoked {
            partitions,
            lost,
            done,
        } => {
            for p in &partitions {
                share.assigned.remove(p);
            }
            if lost {
                share.generation = None;
                share.hub.set_fleet(FleetState::NotJoined {
                    reason: format!(
                        "the membership in group {} was lost (its session expired); rejoining",
                        share.group
                    ),
                });
            }
            let moving: Vec<String> = sources
                .running
                .keys()
                .filter(|name| !share.owns(name))
                .cloned()
                .collect();
            let why = if lost {
                "lost with this process's fleet membership (its session expired)"
            } else {
                "moved to another process of the fleet"
            };
            let tasks: Vec<JoinHandle<()>> = moving
                .iter()
                .filter_map(|name| sources.remove(name, why))
                .collect();
            for task in tasks {
                let _ = task.await;
            }
            tracing::info!(?partitions, sources = ?moving, "fleet: revoked sources stopped");
            // Joined still (a cooperative revocation), with a smaller share.
            share.report();
            let _ = done.send(());
        }
    }
    let running: Vec<&String> = sources.running.keys().collect();
    tracing::info!(assigned = ?share.assigned, sources = ?running, "fleet: this process's share");
}

/// Joins the fleet's group; `None` when asked to stop first. While Kafka cannot be reached
/// it retries by the top-level (shared) `[retry]` in `fleet.retry`: capped exponential backoff
/// from `initial_backoff_ms` to `max_backoff_ms`, and after `max_attempts` consecutive failed
/// attempts (0: never) it gives up. Each attempt waits up to 10 s for a broker. `hub` shows
/// the state on `/readyz` (`fleet: not joined (…)`) until the first assignment.
///
/// # Errors
/// [`RelayError::Kafka`] naming the bootstrap servers, the group and the fix once
/// `retry.max_attempts` attempts failed; a non-retriable error (a consumer that cannot be made
/// from `[kafka.properties]`) at once.
async fn join_fleet(
    fleet: &outbox_relay_core::config::process::FleetConfig,
    config: &ProcessConfig,
    hub: &Hub,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<(Membership, mpsc::UnboundedReceiver<FleetEvent>)>, RelayError> {
    // A revocation waits for its sources' graceful stop (Kafka's acknowledgements, the final
    // checkpoint, the lease's release).
    let revoke_wait = config
        .sources
        .iter()
        .map(|s| {
            Duration::from_millis(
                s.config.retry.stop_timeout_ms + 2 * s.config.mysql.read_timeout_ms,
            )
        })
        .max()
        .unwrap_or_default()
        + Duration::from_secs(5);
    let group = &fleet.group_id;
    hub.set_fleet(FleetState::NotJoined {
        reason: format!("joining group {group}"),
    });
    let mut retry = Retry::new(&fleet.retry);
    loop {
        let e = tokio::select! {
            joined = Membership::join(&fleet.kafka, fleet, revoke_wait) => match joined {
                Ok(m) => {
                    hub.set_fleet(FleetState::NotJoined {
                        reason: format!("waiting for group {group}'s first assignment"),
                    });
                    return Ok(Some(m));
                }
                Err(e) if e.is_retriable() => e,
                Err(e) => return Err(e),
            },
            _ = shutdown.wait_for(|stop| *stop) => return Ok(None),
        };
        let Some(delay) = retry.failed() else {
            return Err(join_gave_up(fleet, retry.attempts(), e));
        };
        let delay_ms = delay.as_millis() as u64;
        tracing::warn!(error = %e, group = %group, retry_in_ms = delay_ms,
            attempt = retry.attempts(), "fleet: cannot join the group yet; retrying");
        hub.set_fleet(FleetState::NotJoined {
            reason: format!(
                "cannot join group {group}: attempt {} failed, retrying in {delay_ms} ms: {e}",
                retry.attempts()
            ),
        });
        if wait_or_stop(delay, shutdown).await {
            return Ok(None);
        }
    }
}

/// The error that ends a fleet's process after `attempts` failed attempts to join: what
/// failed (Kafka's bootstrap servers, the group), and how to fix it.
fn join_gave_up(
    fleet: &outbox_relay_core::config::process::FleetConfig,
    attempts: usize,
    last: RelayError,
) -> RelayError {
    let text = last.to_string();
    let detail = text.strip_prefix("Kafka: ").unwrap_or(&text).to_owned();
    RelayError::kafka(format!(
        "fleet: cannot join group {:?} (control topic {}) through kafka.bootstrap_servers = \
         {:?}: {detail}; gave up after {attempts} attempts (retry.max_attempts = {}, the \
         top-level [retry]). Fix: make a broker of {} reachable from this host (address, port, \
         the listeners it advertises, TLS/SASL in [kafka.properties]), then start the process \
         again; retry.max_attempts = 0 retries forever",
        fleet.group_id,
        fleet.control_topic,
        fleet.kafka.bootstrap_servers,
        fleet.retry.max_attempts,
        fleet.kafka.bootstrap_servers,
    ))
    .with_source(last)
}
