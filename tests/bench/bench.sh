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
# Debezium's MySQL connector (the MariaDB one is not served here) takes MariaDB 10.11 for MySQL
# >= 8.4 and fails on SHOW BINARY LOG STATUS; its JDBC driver asks for @@transaction_isolation
# from 8.0.3 on. So for the run the server reports version 8.0.2-MariaDB-log (still "MariaDB":
# the relay and the binlog client recognise it), and gets its own version back afterwards.
# A full run writes ~10 GB of binlog (backlog, polling updates, steady workloads) on the
# project's own test server: purge it at the end (all but the current file).
after_run() {
  log "purging the test server's binary logs (all but the current file)"
  mariadb --protocol=TCP -h127.0.0.1 -P"$MARIADB_PORT" -uroot -e "PURGE BINARY LOGS BEFORE NOW()" || true
  if [ -n "${BENCH_DEBEZIUM_LIBS:-}" ]; then
    log "restarting MariaDB with its own version string"
    tests/services/mariadb.sh down
    tests/services/mariadb.sh up
  fi
}
trap after_run EXIT
if [ -n "${BENCH_DEBEZIUM_LIBS:-}" ]; then
  log "restarting MariaDB with version=8.0.2-MariaDB-log for Debezium's MySQL connector"
  tests/services/mariadb.sh down
  MARIADB_VERSION_STRING=8.0.2-MariaDB-log tests/services/mariadb.sh up
fi
log "load before the run: $(cat /proc/loadavg)"
target/release/outbox-relay-bench
