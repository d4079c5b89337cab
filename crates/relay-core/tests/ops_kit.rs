//! The operations kit (`deploy/grafana/outbox-relay.json`, `deploy/prometheus/relay-alerts.yaml`)
//! names only metrics the relay serves, and every metric the relay serves is on the dashboard or
//! in an alert, or listed here as deliberately left off: a renamed or new metric fails this test
//! until the kit follows. (`make lint` checks the rules' syntax and behaviour with promtool.)

use std::collections::BTreeSet;
use std::path::PathBuf;

use outbox_relay_core::observe::names;

fn deploy(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The `outbox_relay_…` metric names a text mentions, histogram series (`_bucket`, `_sum`,
/// `_count`) reduced to their metric.
fn metrics_named(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"outbox_relay_[a-z0-9_]+").expect("valid pattern");
    re.find_iter(text)
        .map(|m| {
            let name = m.as_str();
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|base| names::ALL.contains(base))
                })
                .unwrap_or(name)
                .to_owned()
        })
        .collect()
}

/// Served, but on neither the dashboard nor an alert: positions and rare counters an operator
/// reads with `outbox-relay status` or in Prometheus when investigating.
const LEFT_OFF: &[&str] = &[
    names::CHECKPOINT_BINLOG_FILE_SEQUENCE,
    names::CHECKPOINT_BINLOG_POSITION,
    names::TIMESTAMP_FALLBACKS,
    names::HOLDS_STARTED,
    names::CUTOVER_SKIPPED,
    names::CUTOVER_CHECKS,
    names::TRANSACTION_DURATION,
    names::TRANSACTION_RECORDS,
    names::LAST_STABLE_OFFSET_LAG,
];

#[test]
fn the_dashboard_and_alerts_name_only_served_metrics_and_cover_the_rest() {
    let dashboard = deploy("grafana/outbox-relay.json");
    let alerts = deploy("prometheus/relay-alerts.yaml");
    let served: BTreeSet<String> = names::ALL.iter().map(|n| (*n).to_owned()).collect();
    for (what, text) in [("dashboard", &dashboard), ("alert rules", &alerts)] {
        let unknown: Vec<_> = metrics_named(text).difference(&served).cloned().collect();
        assert!(
            unknown.is_empty(),
            "the {what} name metrics the relay does not serve: {unknown:?}"
        );
    }
    let covered: BTreeSet<String> = metrics_named(&dashboard)
        .union(&metrics_named(&alerts))
        .cloned()
        .collect();
    let missing: Vec<_> = served
        .iter()
        .filter(|n| !covered.contains(*n) && !LEFT_OFF.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "served metrics on neither the dashboard nor an alert (add them, or to LEFT_OFF): {missing:?}"
    );
}

#[test]
fn every_dashboard_panel_queries_the_chosen_data_source() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy("grafana/outbox-relay.json")).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut queried = 0;
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let title = p["title"].as_str().unwrap_or_default();
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(expr.contains("outbox_relay_"), "{title}: {expr}");
            // Per-source series follow the dashboard's source selector.
            let process_metric = [
                "outbox_relay_fleet_joined",
                "outbox_relay_config_reloads_total",
                "outbox_relay_build_info",
            ]
            .iter()
            .any(|m| expr.contains(m));
            assert!(
                process_metric || expr.contains("source=~\"$source\""),
                "{title}: {expr}"
            );
        }
        queried += 1;
    }
    assert!(queried >= 20, "{queried} panels");
    let vars: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "source"]);
}
