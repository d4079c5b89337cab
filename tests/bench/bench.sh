#!/usr/bin/env bash
# `make bench`: builds the relay and the harness (crates/bench) in release, resolves Debezium
# (tests/bench/debezium.sh; the bench goes on without it when that fails), and runs the harness
# on the local MariaDB and Kafka (started by `make services-up`). Results: tests/bench/results/
# (latest.json, latest.md, latency.png) and the README's bench section. Settings: BENCH_* (see
# crates/bench/src/main.rs), e.g. BENCH_ROWS=100000 BENCH_STEADY_SECS=15 make bench.
source "$(dirname "${BASH_SOURCE[0]}")/../services/common.sh"
cd "$REPO_ROOT"
apt_install fonts-dejavu-core
log "building outbox-relay and the bench harness (release)"
${CARGO:-cargo} build --release -p outbox-relay -p outbox-relay-bench
if [ -z "${BENCH_DEBEZIUM_LIBS:-}" ] && [[ "${BENCH_SYSTEMS:-debezium}" == *debezium* ]]; then
  if libs="$(tests/bench/debezium.sh)"; then
    export BENCH_DEBEZIUM_LIBS="$libs"
  else
    log "Debezium is not available: the bench reports it as not measured"
  fi
fi
log "load before the run: $(cat /proc/loadavg)"
exec target/release/outbox-relay-bench
