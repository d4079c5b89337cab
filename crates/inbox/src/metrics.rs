//! The inbox's Prometheus series (`inbox/CONTRACT.md`, "Metrics"), opt-in through
//! [`crate::InboxConfig::metrics_registry`].

use std::sync::Mutex;
use std::time::Duration;

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::outcome::Outcome;

/// The series of one registry (clones share the values).
#[derive(Clone)]
pub(crate) struct Metrics {
    records: IntCounterVec,
    parked: IntGaugeVec,
    parked_oldest: GaugeVec,
    lag: IntGaugeVec,
}

/// The series registered by this process, with their registry: a second inbox on the same
/// registry reuses them (the registry answers `AlreadyReg` and keeps no handle to give back).
static REGISTERED: Mutex<Vec<(Registry, Metrics)>> = Mutex::new(Vec::new());

/// Whether `a` and `b` are one registry (clones share their state): a probe series of a
/// unique name registered in `a` is already in `b`.
fn same_registry(a: &Registry, b: &Registry) -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "outbox_inbox_registry_probe_{}_{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    let Ok(probe) = prometheus::IntGauge::new(name, "probe") else {
        return false;
    };
    if a.register(Box::new(probe.clone())).is_err() {
        return false;
    }
    let same = matches!(
        b.register(Box::new(probe.clone())),
        Err(prometheus::Error::AlreadyReg)
    );
    if !same {
        let _ = b.unregister(Box::new(probe.clone()));
    }
    let _ = a.unregister(Box::new(probe));
    same
}

impl Metrics {
    /// The series in `registry`: registered now, or those an earlier inbox of this process
    /// registered there.
    ///
    /// # Errors
    /// A series of the same name that is not the inbox's is in the registry (the message
    /// names it).
    pub(crate) fn register(registry: &Registry) -> Result<Self, String> {
        let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, m)) = registered.iter().find(|(r, _)| same_registry(r, registry)) {
            return Ok(m.clone());
        }
        let bad = |e: prometheus::Error| e.to_string();
        let m = Metrics {
            records: IntCounterVec::new(
                Opts::new(
                    "outbox_inbox_records_total",
                    "Records settled by the inbox, by consumer, original topic and outcome.",
                ),
                &["consumer", "topic", "outcome"],
            )
            .map_err(bad)?,
            parked: IntGaugeVec::new(
                Opts::new(
                    "outbox_inbox_parked_records",
                    "Parked rows of the consumer at the last sweep.",
                ),
                &["consumer"],
            )
            .map_err(bad)?,
            parked_oldest: GaugeVec::new(
                Opts::new(
                    "outbox_inbox_parked_oldest_seconds",
                    "Age of the consumer's oldest parked row at the last sweep (0: none).",
                ),
                &["consumer"],
            )
            .map_err(bad)?,
            lag: IntGaugeVec::new(
                Opts::new(
                    "outbox_inbox_consumer_lag",
                    "The partition's high watermark minus the consumer's position, after each \
                     poll.",
                ),
                &["consumer", "topic", "partition"],
            )
            .map_err(bad)?,
        };
        let series: [(&str, Box<dyn prometheus::core::Collector>); 4] = [
            ("outbox_inbox_records_total", Box::new(m.records.clone())),
            ("outbox_inbox_parked_records", Box::new(m.parked.clone())),
            (
                "outbox_inbox_parked_oldest_seconds",
                Box::new(m.parked_oldest.clone()),
            ),
            ("outbox_inbox_consumer_lag", Box::new(m.lag.clone())),
        ];
        for (name, c) in series {
            registry.register(c).map_err(|e| {
                format!(
                    "inbox metrics_registry: cannot register {name}: {e} (a series of that \
                     name that is not an inbox's is in the registry)"
                )
            })?;
        }
        registered.push((registry.clone(), m.clone()));
        Ok(m)
    }

    /// Counts a settled record (`topic`: its original topic).
    pub(crate) fn settled(&self, consumer: &str, topic: &str, outcome: Outcome) {
        self.records
            .with_label_values(&[consumer, topic, outcome.as_str()])
            .inc();
    }

    /// The parked gauges after a sweep.
    pub(crate) fn swept(&self, consumer: &str, parked: u64, oldest: Option<Duration>) {
        self.parked
            .with_label_values(&[consumer])
            .set(i64::try_from(parked).unwrap_or(i64::MAX));
        self.parked_oldest
            .with_label_values(&[consumer])
            .set(oldest.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// Removes a revoked partition's lag series.
    pub(crate) fn forget_lag(&self, consumer: &str, topic: &str, partition: i32) {
        let _ = self
            .lag
            .remove_label_values(&[consumer, topic, &partition.to_string()]);
    }

    /// A partition's lag after a poll.
    pub(crate) fn lag(&self, consumer: &str, topic: &str, partition: i32, lag: i64) {
        self.lag
            .with_label_values(&[consumer, topic, &partition.to_string()])
            .set(lag.max(0));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn value(registry: &Registry, name: &str) -> Vec<f64> {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter())
            // A counter's gauge part is 0, and the other way round.
            .map(|m| m.get_counter().get_value() + m.get_gauge().get_value())
            .collect()
    }

    #[test]
    fn two_inboxes_on_one_registry_share_the_series() {
        let registry = Registry::new();
        let a = Metrics::register(&registry).unwrap();
        let b = Metrics::register(&registry.clone()).unwrap();
        a.settled("c1", "orders", Outcome::Processed);
        b.settled("c1", "orders", Outcome::Processed);
        assert_eq!(value(&registry, "outbox_inbox_records_total"), vec![2.0]);
        // Another registry has series of its own.
        let other = Registry::new();
        let c = Metrics::register(&other).unwrap();
        c.swept("c2", 3, Some(Duration::from_millis(1500)));
        assert_eq!(value(&other, "outbox_inbox_parked_records"), vec![3.0]);
        assert_eq!(
            value(&other, "outbox_inbox_parked_oldest_seconds"),
            vec![1.5]
        );
        assert!(value(&registry, "outbox_inbox_parked_records").is_empty());
        c.lag("c2", "orders", 0, -4);
        assert_eq!(value(&other, "outbox_inbox_consumer_lag"), vec![0.0]);
    }

    #[test]
    fn a_foreign_series_of_the_same_name_is_refused() {
        let registry = Registry::new();
        let foreign = prometheus::IntCounter::new("outbox_inbox_records_total", "x").unwrap();
        registry.register(Box::new(foreign)).unwrap();
        let e = Metrics::register(&registry).err().unwrap();
        assert!(e.contains("outbox_inbox_records_total"), "{e}");
    }
}
