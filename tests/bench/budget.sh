#!/usr/bin/env bash
# `make bench-budget`: the latency budget per stage (crates/bench/src/stages.rs) on each server
# of BENCH_SERVERS (default mariadb10,mysql8): steady runs of the relay (at-least-once and
# exactly-once, and `relay_ref`, another build, when one is given) with a bare replica and a bare
# producer on the same rows, on a fresh private Kafka broker (empty storage, as a dedicated
# cluster: a broker holding the test suite's thousands of partitions has a slower tail).
# Writes tests/bench/results/budget/ (latest.json, latest.md, stages-<server>.png) and the
# benchmark page's budget section (docs/src/benchmark.md, BENCH_README to change, empty: leave).
# Settings (defaults): BENCH_RATES (1000,5000), BENCH_STEADY_SECS (15), BENCH_STEADY_REPEAT (3),
# BENCH_WARMUP_SECS (20), BENCH_MAX_LOAD (1.0: the 1-minute load each server's runs should start
# below; the script waits up to BENCH_QUIET_WAIT seconds, default 600, for it), BENCH_MAX_BUSY
# (25: a run starting while more than this % of the CPUs is busy is flagged busy in the report), BENCH_KAFKA_PORT (9292; its controller the next port),
# BENCH_REF_COMMIT (a commit to build once into target/bench-ref/<commit> and run as relay_ref,
# e.g. ec800a1) or BENCH_REF_BIN (a relay binary to run as relay_ref). The harness's own settings
# pass through too: BENCH_PAIR_CONTROL=1 (a second bare producer in at-least-once runs: the
# `pair_floor` stage, the noise floor of the relay's paired figure), BENCH_RELAY_NICE=N (the relays' priority).
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

systems="relay,relay_eos"
if [ -n "${BENCH_REF_COMMIT:-}" ]; then
  ref_dir="$REPO_ROOT/target/bench-ref/$BENCH_REF_COMMIT"
  export BENCH_REF_BIN="$ref_dir/target/release/outbox-relay"
  if [ ! -x "$BENCH_REF_BIN" ]; then
    log "building the reference relay at $BENCH_REF_COMMIT (once) in $ref_dir"
    [ -d "$ref_dir/src" ] || git worktree add --force --detach "$ref_dir/src" "$BENCH_REF_COMMIT" >&2
    (cd "$ref_dir/src" && CARGO_TARGET_DIR="$ref_dir/target" ${CARGO:-cargo} build --release -p outbox-relay)
  fi
fi
if [ -n "${BENCH_REF_BIN:-}" ]; then
  [ -x "$BENCH_REF_BIN" ] || die "BENCH_REF_BIN: $BENCH_REF_BIN is not an executable"
  systems="$systems,relay_ref"
fi

export KAFKA_PORT="${BENCH_KAFKA_PORT:-9292}"
export KAFKA_CONTROLLER_PORT="$((KAFKA_PORT + 1))"
export KAFKA_DIR KAFKA_GC_LOG=1
KAFKA_DIR="$(mktemp -d /tmp/outbox-bench-kafka.XXXXXX)"
# Its GC pauses within each run go into the report (stages.rs, gc_pauses).
export BENCH_KAFKA_GC_LOG="$KAFKA_DIR/gc.log"
runs="$(mktemp -d)"
trap 'tests/services/kafka.sh down || true; rm -rf "$KAFKA_DIR" "$runs"' EXIT
tests/services/kafka.sh up

files=()
for server in "${servers[@]}"; do
  tests/services/server.sh "$server" up
  wait_quiet "$server"
  OUTBOX_TEST_SERVER="$server" BENCH_PHASES=steady BENCH_SYSTEMS="$systems" \
    BENCH_RATES="${BENCH_RATES:-1000,5000}" BENCH_TXN_SIZES=1 \
    BENCH_STEADY_SECS="${BENCH_STEADY_SECS:-15}" BENCH_STEADY_REPEAT="${BENCH_STEADY_REPEAT:-3}" \
    BENCH_WARMUP_SECS="${BENCH_WARMUP_SECS:-20}" \
    target/release/outbox-relay-bench measure "$runs/$server.json" \
    || printf '{"server": "%s", "error": "the harness failed: see the output of make bench-budget"}\n' "$server" >"$runs/$server.json"
  files+=("$runs/$server.json")
done
BENCH_OUT="${BENCH_OUT:-tests/bench/results/budget}" target/release/outbox-relay-bench budget-report "${files[@]}"
