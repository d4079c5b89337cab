//! The benchmark's outputs: targets, Markdown tables, the JSON file, the latency plots and the
//! benchmark page's section (docs/src/benchmark.md) between `<!-- bench:begin -->` and `<!-- bench:end -->`. One server's figures
//! are one JSON object (what `outbox-relay-bench measure` writes); the outputs combine the
//! servers' objects as `{"servers": {"<server>": {...}}, ...}` ([`combine`]).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::{json, Value};

const SYSTEMS: [&str; 5] = ["relay", "relay_eos", "relay_ref", "polling", "debezium"];

fn num(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

/// A share (0–1) as a whole percentage, `–` when absent.
fn pct(v: &Value) -> String {
    num(v).map_or_else(|| "–".to_owned(), |x| format!("{:.0}%", x * 100.0))
}

/// How many of [`targets`]' first entries are the latency budget's (the relay's own share,
/// exactly-once visibility, each also paired; the exactly-once relay's own share against a bare
/// transactional producer, also paired, and that producer's cost): `make bench-budget` reports
/// those.
const BUDGET_TARGETS: usize = 7;

/// The issue's targets for one server's figures, with the measured value and whether it is met
/// (`null`: not measured). Every figure is that server's: its drain against its own limit (the
/// same binlog range read from that server) and its own Debezium run, its steady state.
pub fn targets(all: &Value) -> Value {
    let steady = all["steady"].as_array().cloned().unwrap_or_default();
    let relay_20k: Vec<&Value> = steady
        .iter()
        .filter(|v| v["system"] == "relay" && v["rate"] == 20_000)
        .collect();
    let kept_up_20k =
        (!relay_20k.is_empty()).then(|| relay_20k.iter().all(|v| v["kept_up"] == true));
    let steady_rss = steady
        .iter()
        .find(|v| v["system"] == "relay" && v.get("steady_peak_rss_mb").is_some())
        .and_then(|v| num(&v["steady_peak_rss_mb"]));
    let t = |name: &str, value: Option<f64>, goal: &str, met: Option<bool>| json!({"target": name, "value": value, "goal": goal, "met": met});
    // What the bare binlog read plus the bare producer cost per record in CPU: no relay built on
    // them can do better, whatever it does between.
    let limit = &all["drain"]["limit"];
    // Producing alone, with the relay's settings: a relay also reads and decodes the binlog.
    let bare_cpu = num(&limit["produce"]["cpu_s_per_million"]).map(|p| 1e6 / p);
    let ge = |v: Option<f64>, g: f64| v.map(|v| v >= g);
    let le = |v: Option<f64>, g: f64| v.map(|v| v <= g);
    let frac = num(&all["drain_fraction_of_limit"]);
    let dbz = num(&all["drain_ratio_to_debezium"]);
    let p99 = num(&all["p99_ms_at_5k"]);
    let drain_rss = num(&all["drain"]["relay"]["peak_rss_mb"]);
    let per_cpu = num(&all["drain"]["relay"]["records_per_cpu_s"]);
    let eos_drain = num(&all["eos_drain_ratio"]);
    let eos_p99 = num(&all["eos_visible_p99_ms_at_5k"]);
    let share = median(
        steady_runs(&steady, "relay", 5000, 1)
            .filter_map(|v| num(&v["budget"]["relay_share_p99_ms"])),
    );
    // Exactly-once visibility against the at-least-once acknowledgement, same run and rate.
    let alo_ack = median(steady_runs(&steady, "relay", 5000, 1).filter_map(|v| {
        num(&v["budget"]["stages"]["commit_to_ack"]["p99_ms"]).or_else(|| num(&v["p99_ms"]))
    }));
    let eos_vis = median(
        steady_runs(&steady, "relay_eos", 5000, 1).filter_map(|v| num(&v["visible_p99_ms"])),
    );
    let eos_over = eos_vis.zip(alo_ack).map(|(e, a)| e - a);
    // The same two figures paired within their runs: per row, the relay's time beyond the
    // bare path; per run, the p99 less that run's bare producer p99 (the broker's tail moves by
    // tens of ms from one 15 s run to the next on a busy 2-core machine).
    let excess = median(
        steady_runs(&steady, "relay", 5000, 1)
            .filter_map(|v| num(&v["budget"]["relay_excess_p99_ms"])),
    );
    let over_bare = |system: &str, figure: fn(&Value) -> Option<f64>| {
        median(steady_runs(&steady, system, 5000, 1).filter_map(|v| {
            Some(figure(v)? - num(&v["budget"]["stages"]["bare_produce"]["p99_ms"])?)
        }))
    };
    let eos_over_paired = over_bare("relay_eos", |v| num(&v["visible_p99_ms"]))
        .zip(over_bare("relay", |v| {
            num(&v["budget"]["stages"]["commit_to_ack"]["p99_ms"])
        }))
        .map(|(e, a)| e - a);
    // Exactly-once against its own limit: a bare transactional producer committing as the
    // relay does, on the same rows in the same run (stages.rs, `bare_visible`).
    let eos_share = median(
        steady_runs(&steady, "relay_eos", 5000, 1)
            .filter_map(|v| num(&v["budget"]["relay_eos_share_p99_ms"])),
    );
    let eos_excess = median(
        steady_runs(&steady, "relay_eos", 5000, 1)
            .filter_map(|v| num(&v["budget"]["relay_eos_excess_p99_ms"])),
    );
    // What transactions cost on this broker whatever produces: the bare transactional
    // producer's arrival → visible p99 less the bare at-least-once producer's send → ack p99.
    let txn_cost = median(
        steady_runs(&steady, "relay_eos", 5000, 1)
            .filter_map(|v| num(&v["budget"]["stages"]["bare_visible"]["p99_ms"])),
    )
    .zip(median(steady_runs(&steady, "relay", 5000, 1).filter_map(
        |v| num(&v["budget"]["stages"]["bare_produce"]["p99_ms"]),
    )))
    .map(|(t, a)| t - a);
    json!([
        t(
            "the relay's own share of the p99 at 5k rows/s, 1-row transactions (ms)",
            share,
            "<= 5",
            le(share, 5.0)
        ),
        t(
            "the same, paired row by row: the relay's own time per row beyond the bare path, p99 (ms)",
            excess,
            "<= 5",
            le(excess, 5.0)
        ),
        t(
            "exactly-once visible p99 - at-least-once ack p99 at 5k rows/s (ms)",
            eos_over,
            "<= 50",
            le(eos_over, 50.0)
        ),
        t(
            "the same, each p99 less its own run's bare producer send -> ack p99 (transactional in the exactly-once run; ms)",
            eos_over_paired,
            "<= 50",
            le(eos_over_paired, 50.0)
        ),
        t(
            "exactly-once: the relay's own share of the visible p99 at 5k rows/s (its commit -> visible p99 less the bare arrival's and a bare transactional producer's arrival -> visible p99, same run; ms)",
            eos_share,
            "<= 50",
            le(eos_share, 50.0)
        ),
        t(
            "the same, paired row by row: the relay's visible time less the bare transactional producer's, p99 (ms)",
            eos_excess,
            "<= 50",
            le(eos_excess, 50.0)
        ),
        t(
            "  bound: a bare transactional producer's visible p99 - a bare producer's ack p99 (ms)",
            txn_cost,
            "(what one transactional producer's commits cost on this broker; no relay goes below)",
            None
        ),
        t(
            "exactly-once drain / at-least-once drain",
            eos_drain,
            ">= 0.85",
            ge(eos_drain, 0.85)
        ),
        t(
            "exactly-once p99 commit -> visible (read_committed) at 5k rows/s (ms)",
            eos_p99,
            "<= 50",
            le(eos_p99, 50.0)
        ),
        t("drain rate / limit", frac, ">= 0.9", ge(frac, 0.9)),
        t("drain rate / Debezium's", dbz, ">= 5", ge(dbz, 5.0)),
        t(
            "p99 commit -> ack at 5k rows/s (ms)",
            p99,
            "<= 10",
            le(p99, 10.0)
        ),
        t(
            "keeps up at 20k rows/s",
            kept_up_20k.map(|k| if k { 1.0 } else { 0.0 }),
            "yes",
            kept_up_20k
        ),
        t(
            "peak RSS steady (MB)",
            steady_rss,
            "<= 32",
            le(steady_rss, 32.0)
        ),
        t(
            "peak RSS draining (MB)",
            drain_rss,
            "<= 64",
            le(drain_rss, 64.0)
        ),
        t(
            "records per relay CPU-second (drain)",
            per_cpu,
            ">= 500000",
            ge(per_cpu, 500_000.0)
        ),
        t(
            "  bound: bare producer alone, records per CPU-second",
            bare_cpu,
            "(producing only; a relay also reads the binlog)",
            None
        ),
    ])
}

/// The steady runs (every repetition) of `sys` at `rate` rows/s in `txn`-row transactions.
fn steady_runs<'a>(
    steady: &'a [Value],
    sys: &'a str,
    rate: u64,
    txn: u64,
) -> impl Iterator<Item = &'a Value> + 'a {
    steady
        .iter()
        .filter(move |v| v["system"] == sys && v["rate"] == rate && v["txn"] == txn)
        .filter(|v| v.get("error").is_none())
}

/// The run of `runs` (repetitions of one system, rate and transaction size) with the median
/// p99 (visible for exactly-once, else commit → ack, else commit → append): the one the budget
/// table shows.
fn median_run<'a>(runs: &[&'a Value]) -> Option<&'a Value> {
    let p99 = |v: &Value| {
        num(&v["visible_p99_ms"])
            .filter(|_| v["system"] == "relay_eos")
            .or_else(|| num(&v["budget"]["stages"]["commit_to_ack"]["p99_ms"]))
            .or_else(|| num(&v["p99_ms"]))
            .unwrap_or(f64::INFINITY)
    };
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| p99(a).total_cmp(&p99(b)));
    sorted.get(sorted.len().saturating_sub(1) / 2).copied()
}

/// The steady runs with a latency budget, of repeated ones the one with the median p99 of each
/// system, rate and transaction size ([`median_run`]; the repeated runs' table gives min /
/// median / max), in the order they ran.
fn median_budget_runs(all: &Value) -> Vec<&Value> {
    let all_runs: Vec<&Value> = all["steady"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("budget").is_some())
        .collect();
    let key = |v: &Value| (v["system"].clone(), v["rate"].clone(), v["txn"].clone());
    let mut runs = Vec::new();
    let mut seen = Vec::new();
    for v in &all_runs {
        if seen.contains(&key(v)) {
            continue;
        }
        let group: Vec<&Value> = all_runs
            .iter()
            .copied()
            .filter(|w| key(w) == key(v))
            .collect();
        seen.push(key(v));
        runs.extend(median_run(&group));
    }
    runs
}

/// The median of `xs` (the lower one of an even count), `None` when empty.
fn median(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = xs.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2).copied()
}

/// One sentence on where the relay's tail comes from at 5,000 rows/s in one-row transactions
/// (the first such run): the stage of the commit → ack timeline with the largest p99, against
/// the whole, and the relay's own share. `None` without a budget for that run.
pub fn tail_sentence(all: &Value) -> Option<String> {
    let steady = all["steady"].as_array()?;
    let runs: Vec<&Value> = steady_runs(steady, "relay", 5000, 1)
        .filter(|v| v.get("budget").is_some())
        .collect();
    let run = median_run(&runs)?;
    let st = &run["budget"]["stages"];
    let (stage, p99) = [
        "db_commit",
        "binlog_arrival",
        "relay_read",
        "relay_handoff",
        "broker_append",
        "ack",
    ]
    .iter()
    .filter_map(|name| Some((*name, num(&st[*name]["p99_ms"])?)))
    .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let what = crate::stages::STAGES
        .iter()
        .find(|(n, _)| *n == stage)
        .map_or("", |(_, w)| *w);
    Some(format!(
        "At 5,000 rows/s in one-row transactions the largest stage of the tail is `{stage}` \
         ({what}): p99 {} ms of the {} ms commit → ack p99; the bare producer's own send → ack \
         p99 on the same rows is {} ms, and the relay's own share of the p99 is {} ms ({} ms \
         paired row by row).",
        f(&json!(p99), 1),
        f(&st["commit_to_ack"]["p99_ms"], 1),
        f(&st["bare_produce"]["p99_ms"], 1),
        f(&run["budget"]["relay_share_p99_ms"], 1),
        f(&run["budget"]["relay_excess_p99_ms"], 1),
    ))
}

fn f(v: &Value, digits: usize) -> String {
    match num(v) {
        Some(x) => format!("{x:.digits$}"),
        None => "–".into(),
    }
}

/// What the report calls a server (`tests/services/server.sh` names).
pub fn server_title(name: &str) -> &str {
    match name {
        "mariadb10" => "MariaDB 10.11",
        "mariadb11" => "MariaDB 11.4",
        "mysql8" => "MySQL 8.0",
        other => other,
    }
}

/// One server's figures in the combined form ([`combine`]), in the servers' order.
fn servers(all: &Value) -> impl Iterator<Item = (&String, &Value)> {
    all["servers"].as_object().into_iter().flatten()
}

/// Combines per-server figures (objects `outbox-relay-bench measure` wrote, or combined files
/// from earlier reports) into `{"servers": {"<server>": {...}}, "duration_s": <sum>}`; a
/// later object for the same server replaces an earlier one. The targets are computed again
/// from each server's own figures.
///
/// # Errors
/// An object names no server (its `"server"`; a file from before per-server results: the
/// MariaDB 10.11 figures with `machine.mariadb`).
pub fn combine(runs: Vec<Value>) -> Result<Value> {
    let mut by_server = serde_json::Map::new();
    for run in runs {
        if let Some(servers) = run["servers"].as_object() {
            by_server.extend(servers.clone());
            continue;
        }
        let mut run = run;
        if run.get("server").is_none() {
            // A latest.json from before per-server results: MariaDB 10.11 was the only server.
            let old = run["machine"]
                .as_object_mut()
                .and_then(|m| m.remove("mariadb"))
                .context("figures that name no server (no \"server\")")?;
            run["machine"]["server"] = json!("mariadb10");
            run["machine"]["db"] = old;
            run["server"] = json!("mariadb10");
        }
        let name = run["server"]
            .as_str()
            .context("\"server\" is not a string")?
            .to_owned();
        by_server.insert(name, run);
    }
    let mut duration = 0.0;
    for run in by_server.values_mut() {
        if run.get("drain").is_some() {
            run["targets"] = targets(run);
        }
        duration += num(&run["duration_s"]).unwrap_or(0.0);
    }
    Ok(json!({"servers": by_server, "duration_s": duration}))
}

/// The latency-by-stage plot's file name for `server`.
pub fn stage_plot_name(server: &str) -> String {
    format!("stages-{server}.png")
}

/// Whether one server's figures have a steady run with a latency budget.
fn has_budget(v: &Value) -> bool {
    v["steady"]
        .as_array()
        .is_some_and(|s| s.iter().any(|x| x.get("budget").is_some()))
}

/// The latency plot's file name for `server`.
pub fn plot_name(server: &str) -> String {
    format!("latency-{server}.png")
}

/// The Markdown report of every server in `all` ([`combine`]): a summary table, then one
/// section per server ([`markdown`]) with its latency plot from `image_dir` (`""`: next to the
/// Markdown file).
pub fn markdown_all(all: &Value, image_dir: &str) -> String {
    let mut m = String::new();
    let mut rates: Vec<u64> = servers(all)
        .flat_map(|(_, v)| {
            v["settings"]["rates"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|r| r.as_u64())
        .collect();
    rates.sort_unstable();
    rates.dedup();
    m.push_str("**Per server** (drain: rows/s from each system's start; × limit from the relay's first record on; steady: the relay's p99 commit -> ack in ms, the larger of the transaction sizes):\n\n");
    m.push_str("| server | relay | × limit | relay exactly-once | EO / ALO | polling | debezium | relay / debezium |");
    for r in &rates {
        let _ = write!(m, " p99 at {r}/s |");
    }
    m.push_str(" targets met |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    m.push_str(&" ---: |".repeat(rates.len()));
    m.push_str(" ---: |\n");
    for (name, v) in servers(all) {
        let d = &v["drain"];
        let _ = write!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            server_title(name),
            f(&d["relay"]["rows_per_s"], 0),
            f(&d["relay"]["fraction_of_limit"], 2),
            f(&d["relay_eos"]["rows_per_s"], 0),
            f(&v["eos_drain_ratio"], 2),
            f(&d["polling"]["rows_per_s"], 0),
            f(&d["debezium"]["rows_per_s"], 0),
            f(&v["drain_ratio_to_debezium"], 1),
        );
        let steady = v["steady"].as_array().cloned().unwrap_or_default();
        for &r in &rates {
            let p99 = steady
                .iter()
                .filter(|s| s["system"] == "relay" && s["rate"] == r)
                .filter_map(|s| num(&s["p99_ms"]))
                .reduce(f64::max);
            let _ = write!(m, " {} |", f(&json!(p99), 1));
        }
        let ts = v["targets"].as_array().cloned().unwrap_or_default();
        let judged = ts.iter().filter(|t| t["met"].is_boolean()).count();
        let met = ts.iter().filter(|t| t["met"] == true).count();
        let _ = writeln!(m, " {met} of {judged} |");
    }
    for (name, v) in servers(all) {
        let _ = writeln!(m, "\n### {} (`{name}`)\n", server_title(name));
        if v.get("drain").is_none() {
            let e = v["error"].as_str().unwrap_or("no figures");
            let _ = writeln!(m, "Not measured: {}", e.lines().next().unwrap_or(""));
            continue;
        }
        // The plot exists when there are steady-state latencies to plot.
        let plotted = v["steady"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| num(&x["p50_ms"]).is_some()));
        let image = plotted.then(|| format!("{image_dir}{}", plot_name(name)));
        m.push_str(&markdown(v, image.as_deref()));
        if has_budget(v) {
            let _ = writeln!(
                m,
                "\n![latency by stage on {}]({image_dir}{})",
                server_title(name),
                stage_plot_name(name)
            );
        }
    }
    m
}

/// Where the CPU went in the reported (median) relay drain, per million rows: the relay's
/// threads, the broker and the database, against the bare producer's own CPU; `None` without
/// the per-thread figures (a run before they were measured).
fn drain_cpu_line(relay: &Value, limit: &Value) -> Option<String> {
    let produce = &limit["produce"];
    let threads = relay["cpu_s_by_thread"].as_object()?;
    let rows = relay["records"].as_f64().filter(|n| *n > 0.0)? / 1e6;
    let per_m = |v: &Value| v.as_f64().map(|s| format!("{:.2}", s / rows));
    let part = |name: &str| per_m(&threads.get(name).cloned().unwrap_or(Value::Null));
    let mut parts = Vec::new();
    for (key, label) in [
        ("binlog_reader", "binlog reader thread (read + decode)"),
        (
            "pipeline",
            "pipeline (route, produce, acknowledge, checkpoint)",
        ),
        ("librdkafka", "librdkafka's threads"),
        ("other", "other threads"),
    ] {
        if let Some(v) = part(key) {
            parts.push(format!("{label} {v}"));
        }
    }
    let mut line = format!(
        "CPU of the reported relay drain, s per million rows: {}",
        parts.join(", ")
    );
    if let Some(v) = per_m(&relay["broker_cpu_s"]) {
        let _ = write!(line, "; the broker {v}");
    }
    if let Some(v) = per_m(&relay["db_cpu_s"]) {
        let _ = write!(line, "; the database {v}");
    }
    if let Some(v) = produce["cpu_s_per_million"].as_f64() {
        let _ = write!(line, " (the bare producer: {v:.2} of its own)");
    }
    let _ = write!(line, "; machine busy {}.", pct(&relay["machine_busy"]));
    // Run-queue waits say whether a thread could have run more: on a machine with a core to
    // spare they stay small beside its CPU.
    if let Some(waits) = relay["runq_wait_s_by_thread"].as_object() {
        let wait = |name: &str| waits.get(name).and_then(Value::as_f64);
        let cpu = |name: &str| threads.get(name).and_then(Value::as_f64);
        let parts: Vec<String> = [("binlog_reader", "reader"), ("pipeline", "pipeline")]
            .iter()
            .filter_map(|(key, label)| {
                let (w, c) = (wait(key)?, cpu(key)?);
                Some(format!(
                    "{label} {:.2} s ({:.2} of its CPU)",
                    w / rows,
                    w / c.max(1e-9)
                ))
            })
            .collect();
        if !parts.is_empty() {
            let _ = write!(
                line,
                " Runnable but waiting for a core, s per million rows: {}.",
                parts.join(", ")
            );
        }
    }
    // What the relay spends beyond the two jobs it cannot skip (reading the binlog, producing
    // the records), each measured bare on the same rows: its own work (decoding, routing,
    // checkpoints). On a machine whose cores are all busy, the drain's rate falls with the sum.
    let bare = produce["cpu_s_per_million"]
        .as_f64()
        .zip(limit["binlog_read"]["cpu_s_per_million"].as_f64());
    if let (Some(total), Some((p, r))) = (relay["cpu_s_per_million"].as_f64(), bare) {
        let _ = write!(
            line,
            " The relay's own CPU beyond the bare binlog read ({r:.2}) and the bare producer \
             ({p:.2}): {:.2} s per million rows ({:+.0} %).",
            total - r - p,
            (total / (r + p) - 1.0) * 100.0
        );
    }
    Some(line)
}

/// The whole machine's CPU per row in the reported drain and in its two limits, and what that
/// allows on these cores: machine CPU per row = share of all cores busy × cores × seconds ÷ rows
/// (every process: the relay or bare tool, the broker, the database server). Had the machine
/// spent only the bare binlog read's (`r`) and the bare producer's (`p`) CPU per row, at the
/// bare producer's own busy share, a drain would reach `p / (r + p)` of the bare producer: the
/// ratio a relay with no CPU of its own could reach on a machine the bare producer already keeps
/// busy. `None` without the machine figures.
fn drain_machine_line(relay: &Value, limit: &Value, cores: f64) -> Option<String> {
    let per_row_us = |v: &Value| -> Option<f64> {
        let busy = v["machine_busy"].as_f64()?;
        let rate = v["rows_per_s"].as_f64().filter(|r| *r > 0.0)?;
        Some(busy * cores / rate * 1e6)
    };
    let r = per_row_us(&limit["binlog_read"])?;
    let p = per_row_us(&limit["produce"])?;
    let x = per_row_us(relay)?;
    let (busy_p, busy_x) = (
        limit["produce"]["machine_busy"].as_f64()?,
        relay["machine_busy"].as_f64()?,
    );
    Some(format!(
        "The whole machine's CPU per row (all {cores:.0} cores' busy time ÷ rows: relay or bare \
         tool, broker, database): bare binlog read {r:.2} µs, bare producer {p:.2} µs, relay \
         {x:.2} µs ({:+.2} µs beyond the two). A relay that spent no CPU of its own would, at the \
         bare producer's busy share ({:.0} %), reach {:.2}× the bare producer on this machine \
         (p / (r + p): reading the binlog costs CPU the bare producer does not spend); the relay \
         reached {:.2}× = {:.2} (that ceiling) × {:.2} (CPU per row of the two ÷ its own) × {:.2} \
         (its busy share ÷ the producer's).",
        x - r - p,
        busy_p * 100.0,
        p / (r + p),
        (p / x) * (busy_x / busy_p),
        p / (r + p),
        (r + p) / x,
        busy_x / busy_p,
    ))
    .map(|mut line| {
        let both = limit["both_at_once"]["rows_per_s"].as_f64();
        let bare = limit["produce"]["rows_per_s"].as_f64().filter(|r| *r > 0.0);
        if let (Some(both), Some(bare)) = (both, bare) {
            let _ = write!(
                line,
                " Measured rather than computed: the bare read and the bare producer at once \
                 reached {:.2}× the bare producer alone.",
                both / bare
            );
        }
        line
    })
}

/// What the sampler saw during the reported drain (see `sampler.rs`): the records in flight
/// against `kafka.max_in_flight` and how often the pipeline's thread was runnable; `None`
/// without samples.
fn drain_sampled_line(s: &Value) -> Option<String> {
    let n = s["samples"].as_u64().filter(|n| *n > 0)?;
    // Older results have no count of startup ticks: their samples began at the relay's start.
    let from = match s["skipped_before_first_record"].as_u64() {
        Some(k) => format!(
            "from its first record in flight on ({n} samples; {k} of its startup not counted)"
        ),
        None => format!("({n} samples)"),
    };
    let mut line = format!(
        "Sampled every 50 ms during the reported drain {from}: records in flight median {}, \
         p90 {} of at most {}",
        f(&s["in_flight_p50"], 0),
        f(&s["in_flight_p90"], 0),
        f(&s["max_in_flight"], 0),
    );
    if let Some(b) = s["share_below_quarter"].as_f64() {
        let _ = write!(
            line,
            " (below a quarter of it in {:.0} % of samples)",
            b * 100.0
        );
    }
    push_share(
        &mut line,
        &s["pipeline_runnable_share"],
        "; the pipeline's thread runnable (running or waiting for a core) in",
    );
    if let (Some(full), Some(open)) = (
        s["pipeline_asleep_window_full_share"].as_f64(),
        s["pipeline_asleep_window_open_share"].as_f64(),
    ) {
        let _ = write!(
            line,
            ", asleep with the window at three quarters or more (waiting for acknowledgements) \
             in {:.0} % and below it (waiting for the reader) in {:.0} %",
            full * 100.0,
            open * 100.0
        );
    }
    push_share(
        &mut line,
        &s["reader_runnable_share"],
        "; the binlog-reader thread runnable in",
    );
    if push_share(
        &mut line,
        &s["server_dump_runnable_share"],
        "; the database's busiest thread (its binlog dump) runnable in",
    ) {
        if let Some(wchan) = s["server_dump_asleep_in"].as_str() {
            push_share(
                &mut line,
                &s["server_dump_asleep_in_share"],
                &format!(", asleep in `{wchan}` in"),
            );
        }
    }
    line.push('.');
    Some(line)
}

/// Appends `text` and `share` (a fraction) as a whole percentage, `"{text} {:.0} %"`, when
/// `share` is a number; says whether it was.
fn push_share(line: &mut String, share: &Value, text: &str) -> bool {
    let Some(share) = share.as_f64() else {
        return false;
    };
    let _ = write!(line, "{text} {:.0} %", share * 100.0);
    true
}

/// The Markdown report of one server's figures: drain, limit, steady state, targets, and the
/// latency plot at `image` when given.
pub fn markdown(all: &Value, image: Option<&str>) -> String {
    let mut m = String::new();
    let d = &all["drain"];
    let mc = &all["machine"];
    let st = &all["settings"];
    let _ = writeln!(
        m,
        "Machine: {} CPUs ({}), {} GB RAM, Linux {}, server {}, Kafka {}; load at start {}; relay {}.\n",
        mc["cpus"], mc["cpu_model"].as_str().unwrap_or("?"), f(&mc["mem_gb"], 1),
        mc["kernel"].as_str().unwrap_or("?"), mc["db"].as_str().unwrap_or("?"),
        mc["kafka"].as_str().unwrap_or("?"), mc["loadavg_at_start"].as_str().unwrap_or("?"),
        mc["relay_commit"].as_str().unwrap_or("?"),
    );
    if let Some(n) = st["relay_nice"].as_i64() {
        let _ = writeln!(m, "The relays ran at nice {n} (`BENCH_RELAY_NICE`).\n");
    }
    if let Some(o) = st["relay_overrides"].as_object().filter(|o| !o.is_empty()) {
        let list: Vec<String> = o
            .iter()
            .map(|(k, v)| format!("`{k}={}`", v.as_str().unwrap_or("?")))
            .collect();
        let _ = writeln!(
            m,
            "Relay settings changed for this run: {}.\n",
            list.join(", ")
        );
    }
    let _ = writeln!(
        m,
        "**Backlog drain** ({} rows, {}-byte JSON payloads, {} keys, transactions of 1–100 rows; written in {} s):\n",
        st["rows"], st["payload_bytes"], st["keys"], f(&d["backlog"]["write_secs"], 1)
    );
    m.push_str("rows/s: from the system's start to its last record on Kafka; startup: its start to its first record; streaming rows/s: its first record to its last, the rate × limit compares (the limit's clock starts as its tools connect, not at a process start; it also counts the wait for its first record, about 1 % of it, in the relay's favour).\n\n");
    m.push_str("| | rows/s | startup s | streaming rows/s | MB/s | × limit | CPU s / M rows | records / CPU s | peak RSS MB | DB CPU s | DB queries/s | machine busy |\n");
    m.push_str(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let l = &d["limit"];
    for (key, label) in [
        ("binlog_read", "bare binlog read"),
        ("produce", "bare producer"),
        (
            "both_at_once",
            "both at once (read and produce together, each record after its read)",
        ),
        (
            "both_at_once_after",
            "both at once, right after the relay's drain (the limit takes the mean of the two)",
        ),
    ] {
        let v = &l[key];
        if v.is_object() {
            let _ = writeln!(
                m,
                "| limit: {label} | {} | | | {} | | {} | | | | | {} |",
                f(&v["rows_per_s"], 0),
                f(&v["mb_per_s"], 1),
                f(&v["cpu_s_per_million"], 2),
                pct(&v["machine_busy"]),
            );
        }
    }
    for s in SYSTEMS {
        let r = &d[s];
        if r.is_null() {
            continue;
        }
        if let Some(e) = r["error"].as_str() {
            let first = e.lines().next().unwrap_or("");
            let _ = writeln!(m, "| {s} | not measured: {first} | | | | | | | | | | |");
            if r.get("rows_per_s").is_none() {
                continue;
            }
        }
        let _ = writeln!(
            m,
            "| **{s}** | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f(&r["rows_per_s"], 0),
            f(&r["startup_secs"], 2),
            f(&r["streaming_rows_per_s"], 0),
            f(&r["mb_per_s"], 1),
            f(&r["fraction_of_limit"], 2),
            f(&r["cpu_s_per_million"], 2),
            f(&r["records_per_cpu_s"], 0),
            f(&r["peak_rss_mb"], 1),
            f(&r["db_cpu_s"], 1),
            f(&r["db_queries_per_s"], 0),
            pct(&r["machine_busy"]),
        );
    }
    if let Some(runs) = d["relay_runs"].as_array().filter(|r| r.len() > 1) {
        let list: Vec<String> = runs
            .iter()
            .map(|r| {
                let mut run = format!(
                    "{} / {} = {}",
                    f(&r["streaming_rows_per_s"], 0),
                    f(&r["limit_rows_per_s"], 0),
                    f(&r["fraction_of_limit"], 2)
                );
                if r["fraction_of_bare_producer"].is_number() {
                    let _ = write!(
                        run,
                        " ({}× the bare producer)",
                        f(&r["fraction_of_bare_producer"], 2)
                    );
                }
                run
            })
            .collect();
        let against = if l["both_at_once"].is_object() {
            "the limit measured right before it (the lowest of the bare read, the bare producer \
             and the two at once)"
        } else {
            "the bare producer measured right before it"
        };
        let _ = writeln!(
            m,
            "\nRelay drains, each against {against} (streaming rows/s; the median is in the table): {}.",
            list.join("; ")
        );
    }
    if let Some(line) = drain_cpu_line(&d["relay"], l) {
        let _ = writeln!(m, "\n{line}");
    }
    let cores = mc["cpus"].as_f64().unwrap_or(1.0);
    if let Some(line) = drain_machine_line(&d["relay"], l, cores) {
        let _ = writeln!(m, "\n{line}");
    }
    if let Some(line) = drain_sampled_line(&d["relay"]["sampled"]) {
        let _ = writeln!(m, "\n{line}");
    }
    let _ = writeln!(
        m,
        "\n**Steady state** ({} s per rate; latency = broker LogAppendTime − the writer's clock in the row, ms, 1 ms resolution):\n",
        st["steady_secs"]
    );
    m.push_str("relay_eos: latency = when a live read_committed consumer received the record − the writer's clock (its records are appended before their transaction commits); \"visible p99\" is that figure for both relay modes.\n\n");
    m.push_str("| system | rows/s | rows/txn | written rows/s | p50 | p99 | p999 | max | visible p99 | kept up | CPU % | DB CPU s | DB queries/s |\n");
    m.push_str(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n",
    );
    for v in all["steady"].as_array().into_iter().flatten() {
        if v.get("rate").is_none() {
            if let Some(e) = v["error"].as_str() {
                let _ = writeln!(
                    m,
                    "| {} | not measured: {} | | | | | | | | | | | |",
                    v["system"].as_str().unwrap_or("?"),
                    e.lines().next().unwrap_or("")
                );
            }
            continue;
        }
        if let Some(e) = v["error"].as_str() {
            let _ = writeln!(
                m,
                "| {} | {} | {} | error: {} | | | | | | | | | |",
                v["system"].as_str().unwrap_or("?"),
                v["rate"],
                v["txn"],
                e.lines().next().unwrap_or("")
            );
            continue;
        }
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            v["system"].as_str().unwrap_or("?"),
            v["rate"],
            v["txn"],
            f(&v["writer_rows_per_s"], 0),
            f(&v["p50_ms"], 1),
            f(&v["p99_ms"], 1),
            f(&v["p999_ms"], 1),
            f(&v["max_ms"], 1),
            f(&v["visible_p99_ms"], 1),
            if v["kept_up"] == true {
                "yes"
            } else {
                "**no**"
            },
            f(&v["cpu_pct"], 0),
            f(&v["db_cpu_s"], 1),
            f(&v["db_queries_per_s"], 0),
        );
    }
    if let Some(line) = tail_sentence(all) {
        let _ = writeln!(m, "\n**Where the tail comes from**: {line}");
    }
    budget_table(&mut m, all);
    repeats_table(&mut m, all);
    let rss: Vec<String> = all["steady"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            Some(format!(
                "{} {} MB",
                v["system"].as_str()?,
                f(v.get("steady_peak_rss_mb")?, 1)
            ))
        })
        .collect();
    if !rss.is_empty() {
        let _ = writeln!(m, "\nPeak RSS over the steady runs: {}.", rss.join(", "));
    }
    m.push_str(
        "\n**Targets**:\n\n| target | goal | measured | met |\n| --- | --- | ---: | --- |\n",
    );
    for t in all["targets"].as_array().into_iter().flatten() {
        target_row(&mut m, t);
    }
    if let Some(image) = image {
        let server = server_title(all["server"].as_str().unwrap_or("?"));
        let _ = writeln!(m, "\n![latency percentiles per rate on {server}]({image})");
    }
    m
}

/// One row of a targets table: target, goal, measured value, met (empty for a bound that is
/// not a target: its goal in parentheses).
fn target_row(m: &mut String, t: &Value) {
    let met = match t["met"].as_bool() {
        Some(true) => "yes",
        Some(false) => "**no**",
        None if t["goal"].as_str().is_some_and(|g| g.starts_with('(')) => "",
        None => "not measured",
    };
    let _ = writeln!(
        m,
        "| {} | {} | {} | {met} |",
        t["target"].as_str().unwrap_or("?"),
        t["goal"].as_str().unwrap_or("?"),
        f(&t["value"], 2)
    );
}

/// min / median / max over repeated steady runs (`BENCH_STEADY_REPEAT`), when there were any.
fn repeats_table(m: &mut String, all: &Value) {
    let rows: Vec<&Value> = all["steady_repeats"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    if rows.is_empty() {
        return;
    }
    m.push_str("\n**Repeated steady runs** (ms, min / median / max over the runs; `pairing floor`: the p99 of `pair_floor`, two bare producers paired row by row, with `BENCH_PAIR_CONTROL=1`):\n\n");
    m.push_str("| system | rows/s | rows/txn | runs | p99 | visible p99 | relay share of p99 | paired per row | pairing floor |\n");
    m.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let mmm = |x: &Value| {
        if x.is_null() {
            "–".to_owned()
        } else {
            format!(
                "{} / {} / {}",
                f(&x["min"], 1),
                f(&x["median"], 1),
                f(&x["max"], 1)
            )
        }
    };
    for v in rows {
        let r = &v["repeats"];
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            v["system"].as_str().unwrap_or("?"),
            v["rate"],
            v["txn"],
            r["p99_ms"]["runs"],
            mmm(&r["p99_ms"]),
            mmm(&r["visible_p99_ms"]),
            mmm(&r["relay_share_p99_ms"]),
            mmm(&r["relay_excess_p99_ms"]),
            mmm(&r["pair_floor_p99_ms"]),
        );
    }
}

/// The latency budget of the relay's steady runs (stages.rs): per run, p50/p99/p999 of each
/// stage and the relay's own share of the p99, and the machine's load when the run started.
fn budget_table(m: &mut String, all: &Value) {
    let runs = median_budget_runs(all);
    if runs.is_empty() {
        return;
    }
    m.push_str(
        "\n**Latency budget per stage** (ms, p50 / p99 / p999 of each row's time in the stage; \
         `relay share` = the relay's commit → ack p99 − (bare binlog arrival p99 + bare producer \
         send → ack p99), measured on the same rows in the same run; `load` = 1-minute load \
         average when the run started (it remembers the bench's own warm-up and previous run) \
         and, in brackets, the share of all cores busy in the second before it, **busy** above \
         BENCH_MAX_BUSY (25 %): something else was running; `CPU busy` = share of all cores busy \
         while the rows were written; of repeated runs, the one with the median p99):\n\n",
    );
    for (name, what) in crate::stages::STAGES {
        let _ = writeln!(m, "- `{name}`: {what}");
    }
    m.push_str("\n| system | rows/s | rows/txn | load | CPU busy | stage | p50 | p99 | p999 |\n");
    m.push_str("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n");
    for v in runs {
        let b = &v["budget"];
        let before =
            num(&v["machine"]["busy_pct"]).map_or(String::new(), |b| format!(" ({b:.0}%)"));
        let load = match (num(&v["machine"]["load1"]), v["machine"]["busy"] == true) {
            (Some(l), true) => format!("**{l:.1}{before} busy**"),
            (Some(l), false) => format!("{l:.1}{before}"),
            (None, _) => "–".into(),
        };
        let head = format!(
            "| {} | {} | {} | {load} | {} |",
            v["system"].as_str().unwrap_or("?"),
            v["rate"],
            v["txn"],
            pct(&v["machine_busy"])
        );
        for (name, _) in crate::stages::STAGES {
            let st = &b["stages"][name];
            if st.is_null() {
                continue;
            }
            let _ = writeln!(
                m,
                "{head} {name} | {} | {} | {} |",
                f(&st["p50_ms"], 2),
                f(&st["p99_ms"], 2),
                f(&st["p999_ms"], 2)
            );
        }
        let _ = writeln!(
            m,
            "{head} **relay share of p99** | | **{}** | |",
            f(&b["relay_share_p99_ms"], 2)
        );
        if let Some(e) = b["bare_error"].as_str() {
            let _ = writeln!(
                m,
                "{head} **the bare transactional producer stopped** (its figures cover the rows before): {} | | | |",
                e.replace('|', "/")
            );
        }
        if !b["relay_eos_share_p99_ms"].is_null() {
            let _ = writeln!(
                m,
                "{head} **relay share of the visible p99** (against the bare transactional producer) | | **{}** | |",
                f(&b["relay_eos_share_p99_ms"], 2)
            );
        }
        let gc = &v["broker_gc"];
        if !gc.is_null() {
            let _ = writeln!(
                m,
                "{head} broker GC pauses: {} (total / max ms) | | {} | {} |",
                gc["pauses"],
                f(&gc["total_ms"], 1),
                f(&gc["max_ms"], 1)
            );
        }
    }
}

/// Writes `latest.json`, `latest.md` and `latency-<server>.png` per server of `all`
/// ([`combine`]) into `out`, and the benchmark page's section. Plots of servers not in `all` (and the
/// single `latency.png` from before per-server results) are removed: they would show an
/// earlier run's figures.
///
/// # Errors
/// A file cannot be written (a plot failing is only reported).
pub fn write_all(all: &Value, out: &Path, readme: Option<&Path>) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("latest.json"),
        serde_json::to_string_pretty(all)? + "\n",
    )?;
    std::fs::write(out.join("latest.md"), markdown_all(all, ""))?;
    let mut plots = Vec::new();
    for (name, v) in servers(all) {
        let file = plot_name(name);
        match plot(v, &out.join(&file)) {
            Ok(()) => plots.push(file),
            Err(e) => eprintln!("[bench] no plot for {name}: {e:#}"),
        }
        if has_budget(v) {
            let file = stage_plot_name(name);
            match plot_stages(v, &out.join(&file)) {
                Ok(()) => plots.push(file),
                Err(e) => eprintln!("[bench] no stage plot for {name}: {e:#}"),
            }
        }
    }
    for entry in std::fs::read_dir(out)?.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if (file.starts_with("latency") || file.starts_with("stages"))
            && file.ends_with(".png")
            && !plots.contains(&file)
        {
            eprintln!("[bench] removing {file} (not a server of this run)");
            std::fs::remove_file(entry.path())?;
        }
    }
    if let Some(readme) = readme {
        write_section(readme, "bench", &markdown_all(all, RESULTS_URL))?;
    }
    Ok(())
}

/// Replaces what `page` holds between `<!-- NAME:begin -->` and `<!-- NAME:end -->` with
/// `body`; `false` (nothing written) when the page has no such markers.
///
/// # Errors
/// The page cannot be read or written.
fn write_section(page: &Path, name: &str, body: &str) -> Result<bool> {
    let text =
        std::fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    let Some((a, b)) = text.find(&begin).zip(text.find(&end)) else {
        return Ok(false);
    };
    std::fs::write(page, format!("{}{begin}\n{body}{}", &text[..a], &text[b..]))?;
    Ok(true)
}

/// Writes the latency budget's outputs of `all` ([`combine`] of steady-only runs, `make
/// bench-budget`) into `out`: `latest.json`, `latest.md` ([`budget_markdown`]) and
/// `stages-<server>.png`, and the benchmark page's section between `<!-- budget:begin -->` and
/// `<!-- budget:end -->` (its images from [`RESULTS_URL`]`budget/`).
///
/// # Errors
/// A file cannot be written (a plot failing is only reported).
pub fn write_budget(all: &Value, out: &Path, page: Option<&Path>) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("latest.json"),
        serde_json::to_string_pretty(all)? + "\n",
    )?;
    std::fs::write(out.join("latest.md"), budget_markdown(all, ""))?;
    for (name, v) in servers(all) {
        if has_budget(v) {
            if let Err(e) = plot_stages(v, &out.join(stage_plot_name(name))) {
                eprintln!("[bench] no stage plot for {name}: {e:#}");
            }
        }
    }
    if let Some(page) = page {
        let body = budget_markdown(all, &format!("{RESULTS_URL}budget/"));
        anyhow::ensure!(
            write_section(page, "budget", &body)?,
            "{} has no <!-- budget:begin --> … <!-- budget:end -->",
            page.display()
        );
    }
    Ok(())
}

/// The latency budget report of steady-only runs: per server, the machine, where the tail comes
/// from, the issue's targets on latency, `relay` against `relay_ref` (another build) when it
/// ran, the stage table, the repeated runs and the stage plot from `image_dir`.
pub fn budget_markdown(all: &Value, image_dir: &str) -> String {
    let mut m = String::new();
    for (name, v) in servers(all) {
        let _ = writeln!(m, "\n### {} (`{name}`)\n", server_title(name));
        if let Some(e) = v["error"].as_str() {
            let _ = writeln!(m, "Not measured: {}", e.lines().next().unwrap_or(""));
            continue;
        }
        let mc = &v["machine"];
        let _ = writeln!(
            m,
            "Machine: {} CPUs ({}), server {}, Kafka {}; load at start {}; relay {}; {} s per run.",
            mc["cpus"],
            mc["cpu_model"].as_str().unwrap_or("?"),
            mc["db"].as_str().unwrap_or("?"),
            mc["kafka"].as_str().unwrap_or("?"),
            mc["loadavg_at_start"].as_str().unwrap_or("?"),
            mc["relay_commit"].as_str().unwrap_or("?"),
            v["settings"]["steady_secs"],
        );
        if let Some(n) = v["settings"]["relay_nice"].as_i64() {
            let _ = writeln!(m, "The relays ran at nice {n} (`BENCH_RELAY_NICE`).");
        }
        if let Some(line) = tail_sentence(v) {
            let _ = writeln!(m, "\n**Where the tail comes from**: {line}");
        }
        m.push_str("\n| target | goal | measured (median of the runs) | met |\n| --- | --- | ---: | --- |\n");
        for t in targets(v)
            .as_array()
            .into_iter()
            .flatten()
            .take(BUDGET_TARGETS)
        {
            target_row(&mut m, t);
        }
        ref_table(&mut m, v);
        budget_table(&mut m, v);
        repeats_table(&mut m, v);
        if has_budget(v) {
            let _ = writeln!(
                m,
                "\n![latency by stage on {}]({image_dir}{})",
                server_title(name),
                stage_plot_name(name)
            );
        }
    }
    m
}

/// `relay` against `relay_ref` (`BENCH_REF_BIN`) per rate: median p99 commit → broker append
/// (the figure both builds have) over the repeated runs.
fn ref_table(m: &mut String, v: &Value) {
    let steady = v["steady"].as_array().cloned().unwrap_or_default();
    if !steady.iter().any(|r| r["system"] == "relay_ref") {
        return;
    }
    let mut rates: Vec<u64> = steady.iter().filter_map(|r| r["rate"].as_u64()).collect();
    rates.sort_unstable();
    rates.dedup();
    m.push_str(
        "\n**Today's build against the reference build** (`relay_ref`, at-least-once, same \
         run; median over the runs of the p99 commit → broker append, ms). The systems run one \
         after the other, `relay_ref` last on the longest-warmed broker: each one's bare \
         producer, sending the same rows at the same moments, shows its minutes' broker, so \
         the builds compare by the ratio to it:\n\n\
         | rows/s | relay | its bare producer | ratio | relay_ref | its bare producer | ratio |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for rate in rates {
        let p = |sys: &str| {
            median(steady_runs(&steady, sys, rate, 1).filter_map(|r| num(&r["p99_ms"])))
        };
        let bare = |sys: &str| {
            median(
                steady_runs(&steady, sys, rate, 1)
                    .filter_map(|r| num(&r["budget"]["stages"]["bare_produce"]["p99_ms"])),
            )
        };
        let ratio = |a: Option<f64>, b: Option<f64>| {
            json!(a.zip(b.filter(|b| *b > 0.0)).map(|(a, b)| a / b))
        };
        let (relay, relay_bare) = (p("relay"), bare("relay"));
        let (reference, ref_bare) = (p("relay_ref"), bare("relay_ref"));
        let _ = writeln!(
            m,
            "| {rate} | {} | {} | {} | {} | {} | {} |",
            f(&json!(relay), 1),
            f(&json!(relay_bare), 1),
            f(&ratio(relay, relay_bare), 2),
            f(&json!(reference), 1),
            f(&json!(ref_bare), 1),
            f(&ratio(reference, ref_bare), 2),
        );
    }
}

/// Where the benchmark page finds the latency plots: the committed files on GitHub (the book is
/// built from docs/src, which holds no copy of tests/bench/results).
const RESULTS_URL: &str =
    "https://github.com/outbox-relay/outbox-relay/raw/main/tests/bench/results/";

const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn register_font() -> Result<()> {
    let path = FONT_PATHS
        .iter()
        .find(|p| Path::new(p).exists())
        .context("no DejaVuSans.ttf (Debian package fonts-dejavu-core)")?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(path)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{path} is not a usable font"))?;
    Ok(())
}

/// Latency percentiles (p50, p99, p99.9; log scale) per rate, one line per system, one row of
/// panels per transaction size.
fn plot(all: &Value, path: &Path) -> Result<()> {
    register_font()?;
    let steady: Vec<&Value> = all["steady"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| num(&v["p50_ms"]).is_some())
        .collect();
    let mut txns: Vec<u64> = steady.iter().filter_map(|v| v["txn"].as_u64()).collect();
    txns.sort_unstable();
    txns.dedup();
    let mut rates: Vec<u64> = steady.iter().filter_map(|v| v["rate"].as_u64()).collect();
    rates.sort_unstable();
    rates.dedup();
    anyhow::ensure!(!txns.is_empty(), "no steady-state latencies to plot");
    let ymax = steady
        .iter()
        .filter_map(|v| num(&v["p999_ms"]))
        .fold(1.0f64, f64::max)
        * 2.0;
    let pcts = [("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")];
    let root = BitMapBackend::new(path, (1500, 480 * txns.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let server = server_title(all["server"].as_str().unwrap_or("?"));
    let root = root.titled(
        &format!("{server}: commit -> Kafka ack latency (ms, log scale) per rate"),
        ("sans-serif", 26),
    )?;
    let panels = root.split_evenly((txns.len(), pcts.len()));
    let colors = [
        RGBColor(200, 30, 30),
        RGBColor(150, 60, 170),
        RGBColor(30, 90, 200),
        RGBColor(40, 150, 40),
        RGBColor(120, 120, 120),
    ];
    let xs = |rate: u64| rates.iter().position(|r| *r == rate).unwrap_or(0) as i32;
    for (i, panel) in panels.iter().enumerate() {
        let (txn, (key, label)) = (txns[i / pcts.len()], pcts[i % pcts.len()]);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{label}, {txn}-row transactions"),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(
                -0.5f64..(rates.len() as f64 - 0.5),
                (0.1f64..ymax).log_scale(),
            )?;
        let rates_fmt = rates.clone();
        chart
            .configure_mesh()
            .x_labels(rates.len())
            .x_label_formatter(&|x| {
                let i = x.round() as usize;
                rates_fmt
                    .get(i)
                    .map(|r| format!("{r}/s"))
                    .unwrap_or_default()
            })
            .y_desc("ms")
            .label_style(("sans-serif", 14))
            .draw()?;
        for (si, sys) in SYSTEMS.iter().enumerate() {
            let pts: Vec<(f64, f64)> = steady
                .iter()
                .filter(|v| v["system"] == *sys && v["txn"] == txn)
                .filter_map(|v| Some((f64::from(xs(v["rate"].as_u64()?)), num(&v[key])?.max(0.1))))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let c = colors[si];
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                .label(*sys)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// The latency budget as bars: one panel per steady run with a budget (of repeated runs the
/// median one, as in the table), the stages of its timeline top to bottom, p50 and p99 of each
/// (ms, log scale).
fn plot_stages(all: &Value, path: &Path) -> Result<()> {
    register_font()?;
    let runs = median_budget_runs(all);
    anyhow::ensure!(!runs.is_empty(), "no latency budget to plot");
    let names: Vec<&str> = crate::stages::STAGES.iter().map(|(n, _)| *n).collect();
    let cols = 2usize.min(runs.len());
    let rows = runs.len().div_ceil(cols);
    let root = BitMapBackend::new(path, (900 * cols as u32, 420 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let server = server_title(all["server"].as_str().unwrap_or("?"));
    let root = root.titled(
        &format!("{server}: latency by stage (ms, log scale; light: p50, dark: p99)"),
        ("sans-serif", 26),
    )?;
    let panels = root.split_evenly((rows, cols));
    let xmax = runs
        .iter()
        .flat_map(|v| {
            names
                .iter()
                .filter_map(move |n| num(&v["budget"]["stages"][*n]["p99_ms"]))
        })
        .fold(1.0f64, f64::max)
        * 2.0;
    for (run, panel) in runs.iter().zip(panels.iter()) {
        let st = &run["budget"]["stages"];
        let present: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !st[*n].is_null())
            .collect();
        let n = present.len();
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "{} at {}/s, {}-row transactions (load {})",
                    run["system"].as_str().unwrap_or("?"),
                    run["rate"],
                    run["txn"],
                    f(&run["machine"]["load1"], 1)
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(140)
            .build_cartesian_2d((0.01f64..xmax).log_scale(), -0.5f64..n as f64 - 0.5)?;
        let labels = present.clone();
        chart
            .configure_mesh()
            .y_labels(n)
            .y_label_formatter(&|y| {
                // Stage i is centred on y = n-1-i: the first stage on top.
                let i = n as f64 - 1.0 - y;
                labels
                    .get(i.round().max(0.0) as usize)
                    .filter(|_| (i - i.round()).abs() < 0.01)
                    .map(|s| (*s).to_owned())
                    .unwrap_or_default()
            })
            .x_desc("ms")
            .label_style(("sans-serif", 13))
            .draw()?;
        let light = RGBColor(140, 180, 230);
        let dark = RGBColor(30, 70, 160);
        for (i, name) in present.iter().enumerate() {
            let mid = (n - 1 - i) as f64;
            for (key, color, y0, y1) in [
                ("p99_ms", dark, mid - 0.35, mid),
                ("p50_ms", light, mid, mid + 0.35),
            ] {
                if let Some(x) = num(&st[*name][key]) {
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(0.01, y0), (x.max(0.01), y1)],
                        color.filled(),
                    )))?;
                }
            }
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_cpu_line_divides_each_thread_by_the_rows() {
        let relay = json!({"records": 2_000_000, "machine_busy": 0.9, "broker_cpu_s": 6.0,
                           "db_cpu_s": 1.0, "cpu_s_per_million": 4.5,
                           "cpu_s_by_thread": {"binlog_reader": 4.0, "pipeline": 3.0,
                                               "librdkafka": 2.0}});
        let limit = json!({"produce": {"cpu_s_per_million": 3.6},
                           "binlog_read": {"cpu_s_per_million": 0.4}});
        assert_eq!(
            drain_cpu_line(&relay, &limit).as_deref(),
            Some(
                "CPU of the reported relay drain, s per million rows: binlog reader thread \
                 (read + decode) 2.00, pipeline (route, produce, acknowledge, checkpoint) 1.50, \
                 librdkafka's threads 1.00; the broker 3.00; the database 0.50 (the bare \
                 producer: 3.60 of its own); machine busy 90%. The relay's own CPU beyond the \
                 bare binlog read (0.40) and the bare producer (3.60): 0.50 s per million rows \
                 (+12 %)."
            )
        );
        assert_eq!(drain_cpu_line(&json!({"records": 10}), &limit), None);
        let mut waited = relay.clone();
        waited["runq_wait_s_by_thread"] = json!({"binlog_reader": 2.0, "pipeline": 3.0});
        let line = drain_cpu_line(&waited, &limit).expect("a line");
        assert!(
            line.contains(
                "Runnable but waiting for a core, s per million rows: reader 1.00 s (0.50 of \
                 its CPU), pipeline 1.50 s (1.00 of its CPU)."
            ),
            "{line}"
        );
    }

    #[test]
    fn the_machine_line_splits_the_ratio_into_ceiling_cpu_and_busy_share() {
        // 2 cores: read 0.5 × 2 / 1M = 1 µs, producer 0.75 × 2 / 300k = 5 µs, relay
        // 0.8 × 2 / 200k = 8 µs; 200k / 300k = 0.67 = 5/6 × 6/8 × 0.8/0.75.
        let relay = json!({"machine_busy": 0.8, "rows_per_s": 200_000.0});
        let limit = json!({"binlog_read": {"machine_busy": 0.5, "rows_per_s": 1_000_000.0},
                           "produce": {"machine_busy": 0.75, "rows_per_s": 300_000.0}});
        assert_eq!(
            drain_machine_line(&relay, &limit, 2.0).as_deref(),
            Some(
                "The whole machine's CPU per row (all 2 cores' busy time ÷ rows: relay or bare \
                 tool, broker, database): bare binlog read 1.00 µs, bare producer 5.00 µs, relay \
                 8.00 µs (+2.00 µs beyond the two). A relay that spent no CPU of its own would, \
                 at the bare producer's busy share (75 %), reach 0.83× the bare producer on this \
                 machine (p / (r + p): reading the binlog costs CPU the bare producer does not \
                 spend); the relay reached 0.67× = 0.83 (that ceiling) × 0.75 (CPU per row of \
                 the two ÷ its own) × 1.07 (its busy share ÷ the producer's)."
            )
        );
        assert_eq!(drain_machine_line(&json!({}), &limit, 2.0), None);
        let mut measured = limit.clone();
        measured["both_at_once"] = json!({"rows_per_s": 249_000.0});
        let line = drain_machine_line(&relay, &measured, 2.0).unwrap_or_default();
        assert!(
            line.ends_with(
                "Measured rather than computed: the bare read and the bare producer at once \
                 reached 0.83× the bare producer alone."
            ),
            "{line}"
        );
    }

    #[test]
    fn the_sampled_line_gives_the_window_and_the_pipeline_thread() {
        let s = json!({"samples": 80, "max_in_flight": 10000.0, "in_flight_p50": 900.0,
                       "in_flight_p90": 4000.0, "share_below_quarter": 0.7,
                       "pipeline_runnable_share": 0.9});
        assert_eq!(
            drain_sampled_line(&s).as_deref(),
            Some(
                "Sampled every 50 ms during the reported drain (80 samples): records in flight \
                 median 900, p90 4000 of at most 10000 (below a quarter of it in 70 % of \
                 samples); the pipeline's thread runnable (running or waiting for a core) in \
                 90 %."
            )
        );
        let s = json!({"samples": 80, "max_in_flight": 10000.0, "in_flight_p50": 900.0,
                       "in_flight_p90": 10000.0, "pipeline_runnable_share": 0.7,
                       "pipeline_asleep_window_full_share": 0.1,
                       "pipeline_asleep_window_open_share": 0.2,
                       "reader_runnable_share": 0.35});
        assert_eq!(
            drain_sampled_line(&s).as_deref(),
            Some(
                "Sampled every 50 ms during the reported drain (80 samples): records in flight \
                 median 900, p90 10000 of at most 10000; the pipeline's thread runnable \
                 (running or waiting for a core) in 70 %, asleep with the window at three \
                 quarters or more (waiting for acknowledgements) in 10 % and below it (waiting \
                 for the reader) in 20 %; the binlog-reader thread runnable in 35 %."
            )
        );
        let s = json!({"samples": 80, "max_in_flight": 10000.0, "in_flight_p50": 900.0,
                       "in_flight_p90": 10000.0, "reader_runnable_share": 0.8,
                       "server_dump_runnable_share": 0.1,
                       "server_dump_asleep_in": "poll_schedule_timeout",
                       "server_dump_asleep_in_share": 0.85});
        assert_eq!(
            drain_sampled_line(&s).as_deref(),
            Some(
                "Sampled every 50 ms during the reported drain (80 samples): records in flight \
                 median 900, p90 10000 of at most 10000; the binlog-reader thread runnable in \
                 80 %; the database's busiest thread (its binlog dump) runnable in 10 %, asleep \
                 in `poll_schedule_timeout` in 85 %."
            )
        );
        let s = json!({"samples": 70, "max_in_flight": 10000.0, "in_flight_p50": 900.0,
                       "in_flight_p90": 10000.0, "skipped_before_first_record": 26});
        assert_eq!(
            drain_sampled_line(&s).as_deref(),
            Some(
                "Sampled every 50 ms during the reported drain from its first record in flight \
                 on (70 samples; 26 of its startup not counted): records in flight median 900, \
                 p90 10000 of at most 10000."
            )
        );
        assert_eq!(drain_sampled_line(&Value::Null), None);
    }

    #[test]
    fn the_drain_table_gives_startup_and_the_streaming_rate_the_limit_compares() {
        let all = json!({"machine": {}, "settings": {}, "steady": [], "drain": {
        "limit": {"produce": {"rows_per_s": 400_000.0}},
        "relay": {"rows_per_s": 300_000.0, "startup_secs": 0.31,
                  "streaming_rows_per_s": 330_000.0, "fraction_of_limit": 0.825},
        "relay_runs": [
            {"rows_per_s": 300_000.0, "streaming_rows_per_s": 330_000.0,
             "limit_rows_per_s": 400_000.0, "fraction_of_limit": 0.825},
            {"rows_per_s": 290_000.0, "streaming_rows_per_s": 320_000.0,
             "limit_rows_per_s": 400_000.0, "fraction_of_limit": 0.8},
        ]}});
        let md = markdown(&all, None);
        assert!(
            md.contains("| **relay** | 300000 | 0.31 | 330000 | – | 0.82 |"),
            "{md}"
        );
        // Every line of the drain table has the header's number of cells.
        let table: Vec<&str> = md
            .lines()
            .skip_while(|l| !l.starts_with("| | rows/s | startup s"))
            .take_while(|l| l.starts_with('|'))
            .collect();
        assert!(table.len() >= 4, "header, separator, limit, relay: {md}");
        let cells = |l: &str| l.matches('|').count();
        assert!(
            table.iter().all(|l| cells(l) == cells(table[0])),
            "{table:#?}"
        );
        assert!(
            md.contains("330000 / 400000 = 0.82; 320000 / 400000 = 0.80"),
            "{md}"
        );
    }

    #[test]
    fn combines_servers_and_figures_from_before_per_server_results() {
        let old = json!({"machine": {"mariadb": "mariadbd Ver 10.11"}, "drain": {}, "steady": []});
        let mysql = json!({"server": "mysql8", "machine": {"db": "mysqld Ver 8.0.31"},
                           "drain": {"relay": {"rows_per_s": 100.0}}, "steady": [],
                           "duration_s": 2.0});
        let failed = json!({"server": "mariadb11", "error": "the harness failed"});
        let all = combine(vec![old, mysql, failed]).expect("combined");
        let names: Vec<&String> = servers(&all).map(|(n, _)| n).collect();
        assert_eq!(names, ["mariadb10", "mariadb11", "mysql8"]);
        assert_eq!(
            all["servers"]["mariadb10"]["machine"]["db"],
            "mariadbd Ver 10.11"
        );
        assert!(all["servers"]["mysql8"]["targets"].is_array());
        assert_eq!(all["duration_s"], 2.0);
        let md = markdown_all(&all, "img/");
        assert!(md.contains("### MySQL 8.0 (`mysql8`)"), "{md}");
        assert!(md.contains("Not measured: the harness failed"), "{md}");
        assert!(md.contains("| MySQL 8.0 | 100 |"), "{md}");
        // No steady-state latencies: no plot to link.
        assert!(!md.contains("img/latency-mysql8.png"), "{md}");
        assert!(combine(vec![json!({"drain": {}})]).is_err());
    }

    #[test]
    fn the_budget_names_the_tails_largest_stage_and_judges_the_issues_targets() {
        let stage = |p99: f64| json!({"p50_ms": 1.0, "p99_ms": p99});
        let run = |sys: &str, share: f64, broker: f64, ack_p99: f64, visible: f64| {
            json!({"system": sys, "rate": 5000, "txn": 1, "p99_ms": 20.0,
                   "visible_p99_ms": visible,
                   "budget": {"relay_share_p99_ms": share, "stages": {
                       "binlog_arrival": stage(2.0), "relay_read": stage(1.5),
                       "relay_handoff": stage(0.2), "broker_append": stage(broker),
                       "ack": stage(3.0), "commit_to_ack": stage(ack_p99),
                       "bare_produce": stage(15.0)}}})
        };
        // Three repetitions: the median run (by commit → ack p99) is the 18 ms one, whose share
        // is 4.0, also the median share; the exactly-once run is 60 ms over the at-least-once
        // ack p99 of the median run.
        let all = json!({"drain": {}, "steady": [
            run("relay", 9.0, 12.0, 30.0, 19.0), run("relay", 4.0, 12.0, 18.0, 19.0),
            run("relay", 1.0, 12.0, 10.0, 19.0), run("relay_eos", 0.0, 1.0, 9.0, 78.0)]});
        let line = tail_sentence(&all).expect("a sentence");
        assert!(line.contains("`broker_append`"), "{line}");
        assert!(line.contains("p99 12.0 ms of the 18.0 ms"), "{line}");
        assert!(line.contains("share of the p99 is 4.0 ms"), "{line}");
        let find = |all: &Value, prefix: &str| {
            targets(all)
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["target"].as_str().is_some_and(|n| n.starts_with(prefix)))
                .cloned()
                .expect("target")
        };
        assert_eq!(find(&all, "the relay's own share")["value"], 4.0);
        assert_eq!(find(&all, "the relay's own share")["met"], true);
        assert_eq!(find(&all, "exactly-once visible p99 -")["value"], 60.0);
        assert_eq!(find(&all, "exactly-once visible p99 -")["met"], false);
        // Not measured (no bare transactional producer in these runs): no verdict.
        let eos_share = "exactly-once: the relay's own share";
        assert_eq!(find(&all, eos_share)["met"], Value::Null);
        let mut with_txn = all.clone();
        let eos = &mut with_txn["steady"][3]["budget"];
        eos["relay_eos_share_p99_ms"] = json!(7.5);
        eos["stages"]["bare_visible"] = stage(70.0);
        assert_eq!(find(&with_txn, eos_share)["value"], 7.5);
        assert_eq!(find(&with_txn, eos_share)["met"], true);
        // 70 ms visible for the bare transactional producer, 15 ms ack for the bare one.
        assert_eq!(
            find(&with_txn, "  bound: a bare transactional")["value"],
            55.0
        );
        // `make bench-budget` prints the first BUDGET_TARGETS: the budget's, that bound last.
        let ts = targets(&with_txn);
        let names: Vec<&str> = ts
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["target"].as_str())
            .collect();
        assert!(names[BUDGET_TARGETS - 1].starts_with("  bound: a bare transactional"));
        assert!(names[BUDGET_TARGETS].starts_with("exactly-once drain"));
    }
}
