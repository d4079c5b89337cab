//! The process's view of its sources for `/metrics` and `/readyz`: one [`Metrics`] per running
//! source (each series labelled `source="<connector name>"`), added when a source starts and
//! dropped when it is removed, plus `outbox_relay_build_info` once per process.
//!
//! # Readiness of the process
//! `/readyz` answers 200 when every source of the process is ready ([`Metrics::readiness`]:
//! streaming, recently active, Kafka reachable), and also when the process runs no source
//! at all; 503 otherwise. The body has one line per source (`<name>: ready: streaming` or
//! `<name>: not ready: <reason>`), so one bad source is named. `/readyz?source=<name>` answers
//! for that source alone (404 for a name the process does not run). A source that failed for
//! good (`State::Failed`) keeps the process not ready until it is fixed or removed: a bad
//! source in a new configuration then stops a rolling update instead of hiding behind the
//! healthy ones.
//!
//! # A fleet's process
//! With `[fleet]` ([`Hub::set_fleet`]) the body starts with the membership's line, `fleet:
//! joined group <g> (generation <n>, <k> of <p> partitions)` or `fleet: not joined
//! (<reason>)`. The process is not ready until it has joined; once joined it is ready when
//! every source it was assigned is ready (none assigned: ready).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus::proto::MetricFamily;
use prometheus::{Registry, TextEncoder};

use super::metrics::{Metrics, ProcessMetrics};

/// The readiness thresholds of one source (its `http.ready_stall_ms` and `http.ready_kafka_ms`).
#[derive(Debug, Clone, Copy)]
pub struct ReadyLimits {
    /// No binlog event or heartbeat read for this long: not ready.
    pub stall: Duration,
    /// No Kafka broker answered for this long: not ready.
    pub kafka: Duration,
}

/// Where a fleet's process stands in its group (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetState {
    /// Not a member (yet, or any more): joining, retrying while Kafka cannot be reached,
    /// waiting for the group's first assignment, or rejoining after the membership was lost.
    NotJoined {
        /// Why, in an operator's words.
        reason: String,
    },
    /// A member: the group assigned this process its share.
    Joined {
        /// The consumer group (`fleet.group_id`).
        group: String,
        /// The group's generation of the last assignment (Kafka's `generationId`; -1 unknown).
        generation: i32,
        /// Control-topic partitions assigned to this process.
        assigned: usize,
        /// The control topic's partition count.
        partitions: i32,
    },
}

impl FleetState {
    /// `/readyz`'s line: `fleet: joined group <g> (generation <n>, <k> of <p> partitions)` or
    /// `fleet: not joined (<reason>)`.
    pub fn line(&self) -> String {
        match self {
            Self::NotJoined { reason } => format!("fleet: not joined ({reason})"),
            Self::Joined {
                group,
                generation,
                assigned,
                partitions,
            } => format!(
                "fleet: joined group {group} (generation {generation}, {assigned} of \
                 {partitions} partitions)"
            ),
        }
    }

    /// Whether the process is a member of its group.
    pub fn is_joined(&self) -> bool {
        matches!(self, Self::Joined { .. })
    }
}

/// One source's entry.
struct Entry {
    metrics: Arc<Metrics>,
    limits: ReadyLimits,
}

/// The sources a process runs, for the HTTP endpoints. See the module documentation.
pub struct Hub {
    process: Registry,
    process_metrics: ProcessMetrics,
    /// A process of `[[source]]` sections (or a sources folder): `/readyz` names each source.
    multi: bool,
    sources: RwLock<BTreeMap<String, Entry>>,
    /// A fleet's membership; `None` without `[fleet]`.
    fleet: RwLock<Option<FleetState>>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("sources", &self.names())
            .finish_non_exhaustive()
    }
}

/// One source's readiness: `Ok(what)` or `Err(why)`.
pub type Readiness = Result<String, String>;

impl Hub {
    /// A hub with no source yet and the process's `outbox_relay_build_info`. `multi`: the
    /// configuration has `[[source]]` sections or a sources folder, so `/readyz` names each
    /// source in its body (a single-source configuration answers as it always did).
    pub fn new(multi: bool) -> Arc<Self> {
        let process = Registry::new();
        let process_metrics = ProcessMetrics::register(&process);
        Arc::new(Self {
            process,
            process_metrics,
            multi,
            sources: RwLock::new(BTreeMap::new()),
            fleet: RwLock::new(None),
        })
    }

    /// Records where this fleet's process stands in its group (from then on `/readyz` shows
    /// it and requires it joined) and sets `outbox_relay_fleet_joined`.
    pub fn set_fleet(&self, state: FleetState) {
        self.process_metrics.fleet_joined(state.is_joined());
        *self.fleet.write().unwrap_or_else(|e| e.into_inner()) = Some(state);
    }

    /// The fleet's membership as last recorded; `None` for a process without `[fleet]`.
    pub fn fleet(&self) -> Option<FleetState> {
        self.fleet.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Fresh metrics for source `name` (replacing those of an earlier source of that name, so
    /// a changed source starts its counters over), served until [`Hub::remove`].
    pub fn add(&self, name: &str, limits: ReadyLimits) -> Arc<Metrics> {
        let metrics = Arc::new(Metrics::for_source(name));
        self.write().insert(
            name.to_owned(),
            Entry {
                metrics: metrics.clone(),
                limits,
            },
        );
        metrics
    }

    /// Stops serving source `name`'s metrics, if these are still the ones served under it
    /// (a source re-added under the same name in the meantime keeps its new ones).
    pub fn remove(&self, name: &str, metrics: &Arc<Metrics>) {
        let mut sources = self.write();
        if sources
            .get(name)
            .is_some_and(|e| Arc::ptr_eq(&e.metrics, metrics))
        {
            sources.remove(name);
        }
    }

    /// The process's own metrics (configuration reloads).
    pub fn process_metrics(&self) -> &ProcessMetrics {
        &self.process_metrics
    }

    /// Whether the configuration has many sources (see [`Hub::new`]).
    pub fn is_multi(&self) -> bool {
        self.multi
    }

    /// The names of the sources served, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// The metrics of source `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Metrics>> {
        self.read().get(name).map(|e| e.metrics.clone())
    }

    /// The Prometheus text exposition (format 0.0.4) of the process and every source: the
    /// families of the same name merged into one, so each metric has one `# HELP`/`# TYPE`.
    pub fn render(&self) -> String {
        let mut families: BTreeMap<String, MetricFamily> = BTreeMap::new();
        let mut add = |gathered: Vec<MetricFamily>| {
            for mut family in gathered {
                match families.get_mut(family.name()) {
                    Some(f) => f.mut_metric().extend(family.take_metric()),
                    None => {
                        families.insert(family.name().to_owned(), family);
                    }
                }
            }
        };
        add(self.process.gather());
        for entry in self.read().values() {
            add(entry.metrics.gather());
        }
        let families: Vec<MetricFamily> = families.into_values().collect();
        TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_else(|e| format!("# encoding the metrics failed: {e}\n"))
    }

    /// Every source's readiness, by name.
    pub fn readiness(&self) -> Vec<(String, Readiness)> {
        self.read()
            .iter()
            .map(|(name, e)| {
                (
                    name.clone(),
                    e.metrics.readiness(e.limits.stall, e.limits.kafka),
                )
            })
            .collect()
    }

    /// Source `name`'s readiness; `None` when the process runs no such source.
    pub fn source_readiness(&self, name: &str) -> Option<Readiness> {
        let sources = self.read();
        let e = sources.get(name)?;
        Some(e.metrics.readiness(e.limits.stall, e.limits.kafka))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.sources.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.sources.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::metrics::State;

    const LIMITS: ReadyLimits = ReadyLimits {
        stall: Duration::from_secs(30),
        kafka: Duration::from_secs(30),
    };

    #[test]
    fn merges_sources_under_one_family_each_with_its_source_label() {
        let hub = Hub::new(true);
        let a = hub.add("orders", LIMITS);
        let b = hub.add("payments", LIMITS);
        a.row_read("shop.outbox");
        b.row_read("pay.outbox");
        b.row_read("pay.outbox");
        let text = hub.render();
        assert!(
            text.contains(
                "outbox_relay_outbox_rows_read_total{table=\"shop.outbox\",source=\"orders\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "outbox_relay_outbox_rows_read_total{table=\"pay.outbox\",source=\"payments\"} 2\n"
            ),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE outbox_relay_outbox_rows_read_total counter")
                .count(),
            1,
            "{text}"
        );
        assert_eq!(text.matches("# TYPE outbox_relay_build_info").count(), 1);
        assert!(
            text.contains("outbox_relay_binlog_events_read_total{source=\"orders\"} 0\n"),
            "{text}"
        );

        hub.remove("orders", &a);
        let text = hub.render();
        assert!(!text.contains("source=\"orders\""), "{text}");
        assert!(text.contains("source=\"payments\""), "{text}");
    }

    #[test]
    fn removing_stale_metrics_keeps_a_re_added_source() {
        let hub = Hub::new(true);
        let old = hub.add("orders", LIMITS);
        let new = hub.add("orders", LIMITS);
        hub.remove("orders", &old);
        assert!(hub.get("orders").is_some_and(|m| Arc::ptr_eq(&m, &new)));
        hub.remove("orders", &new);
        assert!(hub.names().is_empty());
    }

    #[test]
    fn a_fleet_state_sets_the_gauge_and_reads_as_a_line() {
        let hub = Hub::new(true);
        assert!(hub.fleet().is_none());
        assert!(!hub.render().contains("outbox_relay_fleet_joined"));
        hub.set_fleet(FleetState::NotJoined {
            reason: "joining group g".into(),
        });
        assert!(hub.render().contains("outbox_relay_fleet_joined 0\n"));
        assert_eq!(
            hub.fleet().map(|f| f.line()).as_deref(),
            Some("fleet: not joined (joining group g)")
        );
        hub.set_fleet(FleetState::Joined {
            group: "g".into(),
            generation: 7,
            assigned: 2,
            partitions: 6,
        });
        assert!(hub.render().contains("outbox_relay_fleet_joined 1\n"));
        assert_eq!(
            hub.fleet().map(|f| f.line()).as_deref(),
            Some("fleet: joined group g (generation 7, 2 of 6 partitions)")
        );
    }

    #[test]
    fn readiness_per_source() {
        let hub = Hub::new(true);
        let a = hub.add("a", LIMITS);
        let b = hub.add("b", LIMITS);
        a.set_state(State::Streaming);
        b.set_state(State::Failed {
            error: "configuration error: x".into(),
        });
        let all = hub.readiness();
        assert_eq!(all[0], ("a".to_owned(), Ok("streaming".to_owned())));
        let why = all[1].1.clone().expect_err("b failed");
        assert!(why.starts_with("failed: configuration error: x."), "{why}");
        assert!(hub.source_readiness("a").is_some_and(|r| r.is_ok()));
        assert!(hub.source_readiness("nope").is_none());
    }
}
