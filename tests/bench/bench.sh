#!/usr/bin/env bash
# `make bench`: builds the relay and the harness (crates/bench) in release, then runs the
# harness once per server in BENCH_SERVERS (default mariadb10,mysql8; names as
# tests/services/server.sh takes them: mariadb10, mariadb11, mysql8) with
# OUTBOX_TEST_SERVER=<server> (the testkit takes that server's port: MARIADB_PORT,
# MARIADB11_PORT, MYSQL8_PORT), on Kafka at KAFKA_PORT. It starts Kafka and those servers when
# they are not running (tests/services/*.sh) and leaves them running. Per server: Debezium's
# connector for it (tests/bench/debezium.sh <server>; that server's run goes on without Debezium
# when that fails), a wait for a quiet machine (wait_quiet in prelude.sh: BENCH_MAX_LOAD,
# BENCH_QUIET_WAIT), the measurement (`outbox-relay-bench measure`), then a purge of that server's
# binary logs. At the end `outbox-relay-bench report` combines the servers' figures into
# tests/bench/results/ (latest.json as {"servers": {"<server>": {...}}, ...}, latest.md,
# latency-<server>.png) and the README's bench section. A server whose run fails is reported as
# not measured, the others' figures are still written, and the script exits 1.
# Settings: BENCH_SERVERS and BENCH_* (see crates/bench/src/main.rs; BENCH_DEBEZIUM_LIBS, when
# set, is used on every server), e.g.
#   BENCH_SERVERS=mysql8 BENCH_ROWS=100000 BENCH_STEADY_SECS=15 make bench
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
tests/services/kafka.sh up
# The broker's CPU during each drain (crates/bench: broker_cpu).
export BENCH_KAFKA_PIDFILE="${KAFKA_DIR:-$SERVICES_DIR/kafka}/kafka.pid"

runs="$(mktemp -d)"
current=""      # the server being measured (for the purge when the script is interrupted)
masqueraded=""  # a MariaDB server running with a MySQL version string
# Debezium's MySQL connector (used on MariaDB only when its MariaDB connector is not served by
# Maven, as on this project's machine) takes MariaDB 10.11 for MySQL >= 8.4 and fails on SHOW
# BINARY LOG STATUS; its JDBC driver asks for @@transaction_isolation from 8.0.3 on. So for the
# run that server reports version 8.0.2-MariaDB-log (still "MariaDB": the relay and the binlog
# client recognise it), and gets its own version back afterwards. MySQL 8.0.31 is a server the
# MySQL connector supports: it runs as it is, never restarted.
masquerade() {
  log "restarting $1 with version=8.0.2-MariaDB-log for Debezium's MySQL connector"
  tests/services/server.sh "$1" down
  masqueraded="$1"
  MARIADB_VERSION_STRING=8.0.2-MariaDB-log tests/services/server.sh "$1" up
}
# A full run writes ~10 GB of binlog per server (backlog, polling updates, steady workloads) on
# the project's own test servers: purge it after each server's run (all but the current file).
after_run() {
  [ -n "$current" ] || return 0
  log "purging $current's binary logs (all but the current file)"
  mariadb --protocol=TCP -h127.0.0.1 -P"$(tests/services/server.sh "$current" port)" -uroot \
    -e "PURGE BINARY LOGS BEFORE NOW()" || true
  current=""
  if [ -n "$masqueraded" ]; then
    log "restarting $masqueraded with its own version string"
    tests/services/server.sh "$masqueraded" down
    tests/services/server.sh "$masqueraded" up
    masqueraded=""
  fi
}
trap 'after_run; rm -rf "$runs"' EXIT

failed=()
for server in "${servers[@]}"; do
  tests/services/server.sh "$server" up
  libs="${BENCH_DEBEZIUM_LIBS:-}"
  if [ -z "$libs" ] && [[ "${BENCH_SYSTEMS:-debezium}" == *debezium* ]]; then
    libs="$(tests/bench/debezium.sh "$server")" \
      || { log "Debezium is not available for $server: the bench reports it as not measured"; libs=""; }
  fi
  current="$server"
  if [ -n "$libs" ] && [[ "$server" == mariadb* ]] \
      && [ "$(cat "$libs/.connector-class" 2>/dev/null)" != io.debezium.connector.mariadb.MariaDbConnector ]; then
    masquerade "$server"
  fi
  wait_quiet "$server"
  if OUTBOX_TEST_SERVER="$server" BENCH_DEBEZIUM_LIBS="$libs" \
      target/release/outbox-relay-bench measure "$runs/$server.json"; then
    :
  else
    status=$?
    log "the bench failed on $server (exit $status)"
    failed+=("$server")
    printf '{"server": "%s", "error": "the harness failed (exit %s): see the output of make bench"}\n' \
      "$server" "$status" >"$runs/$server.json"
  fi
  after_run
done
files=()
for server in "${servers[@]}"; do files+=("$runs/$server.json"); done
target/release/outbox-relay-bench report "${files[@]}"
log "many idle sources in one process (on ${servers[0]})"
OUTBOX_TEST_SERVER="${servers[0]}" target/release/outbox-relay-bench sources || failed+=("sources")
[ ${#failed[@]} -eq 0 ] || die "the bench failed on: ${failed[*]}"
