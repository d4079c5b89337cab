#!/usr/bin/env bash
# `make test`: the unit tests once, then every end-to-end suite against each server named in
# OUTBOX_TEST_SERVERS (default mariadb10,mariadb11,mysql8; names as tests/services/server.sh).
# cargo runs with --no-fail-fast, and every server's run goes on after another's failure; the exit
# status is non-zero when anything failed, and a summary names what.
#   tests/run.sh [extra arguments for the test binaries, e.g. --test-threads=4]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/services/common.sh"
cd "$REPO_ROOT"
CARGO="${CARGO:-cargo}"
test_args=("$@")
[ ${#test_args[@]} -gt 0 ] || test_args=(--nocapture --test-threads=4)

# Each run's output is also kept in target/test-logs/<label>.log, and the summary names every
# failed test binary and test found there, so a red CI run says what failed in its last lines.
logs="$REPO_ROOT/target/test-logs"
mkdir -p "$logs"
summary=()
run() {
  local label="$1"; shift
  local start=$SECONDS
  local log="$logs/${label//[^A-Za-z0-9]/_}.log"
  printf '\n[test] ===== %s =====\n' "$label" >&2
  if "$@" 2>&1 | tee "$log" >&2; then
    summary+=("ok     $label ($((SECONDS - start)) s)")
  else
    summary+=("FAILED $label ($((SECONDS - start)) s; log: ${log#"$REPO_ROOT"/})")
    # cargo's "N targets failed" list, then the test names of each binary's "failures:" list.
    while IFS= read -r line; do summary+=("         $line"); done < <(
      awk '/^failures:$/ { f = 1; next } f && /^    [A-Za-z_][A-Za-z0-9_:]*$/ { print "test " $1; next }
           /^$/ { f = 0 } /^    `.*--test [^`]+`$|^--- FAIL: |^FAILED |^\[ERROR\] Tests run/' "$log" |
        sort -u | head -40
    )
    # What the failed tests said: an `Err` returned by a test prints "Error: …", a panic
    # "thread '…' panicked at …" and its message on the next line (the first 10, cut at 400
    # characters; a test's relay output can hold such lines too, so they are hints, not a verdict).
    while IFS= read -r line; do summary+=("           $line"); done < <(
      awk '/^Error: / { print; next }
           p { print "  " prev " " $0; p = 0; next }
           /^thread .* panicked at / { prev = $0; p = 1 }' "$log" | cut -c1-400 | head -10
    )
  fi
}

# Unit tests (no server needed) of every crate.
run "unit tests" "$CARGO" test --workspace --lib --bins --no-fail-fast -- "${test_args[@]}"

# The exactly-once fault matrix (tests/faults_eos.rs, about 6 minutes) runs against the first
# server only, to keep CI within its budget; the at-least-once matrix and every exactly-once
# end-to-end test (tests/eos_e2e.rs) run against each server, and
# `make faults FAULTS_ARGS=--exactly-once` runs the matrix against any one.
# The runs of the real Debezium (tests/debezium_e2e.rs, a JVM each, about 4 minutes a server)
# run against MySQL 8.0 and MariaDB 10.11 only: Debezium 3.6's MariaDB connector is not on Maven
# Central here, so on MariaDB its MySQL connector runs (under a MySQL version string), and
# MariaDB 11.4 would repeat 10.11's run of it. The relay's side of the profile runs on every
# server in the other suites' unit and mapping tests; `OUTBOX_TEST_SERVER=mariadb11 cargo test
# -p outbox-relay-e2e --test debezium_e2e` runs it there by hand. The fleet's tests
# (tests/fleet_e2e.rs, about 100 s a server) likewise run on those two servers only (its
# exactly-once failover and its join retries on MySQL 8.0 alone; the fleet's fault profile,
# `make faults-fleet`, covers all three servers in both delivery modes): what they
# test is Kafka's group protocol and the lease, whose server side (GET_LOCK, wait_timeout) both
# flavors cover; `OUTBOX_TEST_SERVER=mariadb11 cargo test -p outbox-relay-e2e --test fleet_e2e`
# runs them on 11.4 (they passed there when written). The inbox's parked-version, retry-tier and
# batch-mode scenarios (tests/inbox_e2e.rs, four languages each, a few minutes a server) likewise
# run on MariaDB 10.11 and MySQL 8.0: their SQL is the same on 10.11 and 11.4 (batch mode's
# RETURNING path on MariaDB, its SELECT … FOR UPDATE path on MySQL);
# `OUTBOX_TEST_SERVER=mariadb11 cargo test -p outbox-relay-e2e --test inbox_e2e` runs them there.
IFS=',' read -r -a servers <<<"$OUTBOX_TEST_SERVERS"
skip=()
for server in "${servers[@]}"; do
  server="${server// /}"
  [ -n "$server" ] || continue
  # The batch-mode variants of the rebalance, gap-expiry and retry-tier scenarios run in
  # `make test-inbox-batch` (all ten shared scenarios in batch mode), not here: CI time.
  per_server=(--skip batch_mode_rebalance --skip batch_mode_a_gap --skip batch_mode_retry_tiers
              --skip batch_mode_crash_while)
  case "$server" in
    mysql8) ;;
    # The fleet's exactly-once and join-retry tests once (on MySQL 8.0): the first is the
    # failover test in the other delivery mode, the second never reaches a database server.
    mariadb10) per_server+=(--skip a_fleet_of_exactly_once_sources_fails_over_without_duplicates
                         --skip joining_follows_the_retry_policy_while_kafka_is_unreachable) ;;
    *) per_server+=(--skip same_records_as_debezium --skip migrate_from_debezium_mid_transaction
                 --skip a_fleet_shares_its_sources_fails_over_and_takes_in_a_new_process
                 --skip a_frozen_process_produces_nothing_after_it_resumes
                 --skip a_fleet_of_exactly_once_sources_fails_over_without_duplicates
                 --skip joining_follows_the_retry_policy_while_kafka_is_unreachable
                 --skip parked_versions_resume_by_themselves
                 --skip a_gap_that_never_closes_is_dead_lettered_at_its_deadline
                 --skip retry_tiers_move_the_partition_on_and_dead_letter_after_the_last
                 --skip crash_while_a_copy_waits_in_a_retry_tier_grants_once
                 --skip batch_mode_) ;;
  esac
  notes=()
  [ ${#skip[@]} -eq 0 ] || notes+=("without the exactly-once fault matrix")
  case "$server" in
    mysql8) ;;
    mariadb10) notes+=("without the fleet's exactly-once and join-retry tests") ;;
    *) notes+=("without the runs of Debezium, the fleet's tests and the inbox's parked-version, retry-tier and batch-mode scenarios") ;;
  esac
  label="$server"
  if [ ${#notes[@]} -gt 0 ]; then
    joined="$(printf '%s, ' "${notes[@]}")"
    label="$server (${joined%, })"
  fi
  run "end-to-end suites on $label" \
    env OUTBOX_TEST_SERVER="$server" \
    "$CARGO" test --workspace --test '*' --no-fail-fast -- "${test_args[@]}" "${skip[@]}" "${per_server[@]}"
  skip=(--skip fault_matrix_short_exactly_once_has_no_duplicates)
done

# The README's five-minute run, pasted as written (tests/quickstart.sh: MariaDB 10.11 and Kafka,
# a database and topic of its own; about 20 s with the relay built by the suites above).
run "README quick start (tests/quickstart.sh)" tests/quickstart.sh

# The consumer helpers' own suites (inbox/, built by `make inbox`), once, against the first
# server of OUTBOX_TEST_SERVERS and the shared Kafka, their batch-mode tests also against MySQL
# 8.0 (INBOX_TEST_MYSQL_PORT: batch mode's MySQL statements differ); the shared inbox scenarios
# (tests/inbox_e2e.rs) ran above against every server.
first="${servers[0]// /}"
inbox_port="$(tests/services/server.sh "${first:-mariadb10}" port)"
tests/services/server.sh mysql8 up >&2 # started already unless OUTBOX_TEST_SERVERS leaves it out
run "inbox helper suites: Go (on $first)" env INBOX_TEST_DB_PORT="$inbox_port" \
  INBOX_TEST_MYSQL_PORT="$(tests/services/server.sh mysql8 port)" \
  INBOX_TEST_BOOTSTRAP="127.0.0.1:$KAFKA_PORT" bash -c 'cd inbox/go && go test -count=1 ./...'
run "inbox helper suites: Python (on $first)" env INBOX_TEST_DB_PORT="$inbox_port" \
  INBOX_TEST_MYSQL_PORT="$(tests/services/server.sh mysql8 port)" \
  INBOX_TEST_BOOTSTRAP="127.0.0.1:$KAFKA_PORT" bash -c 'cd inbox/python && .venv/bin/pytest -q'
run "inbox helper suites: Java (on $first)" env INBOX_TEST_DB_PORT="$inbox_port" \
  INBOX_TEST_MYSQL_PORT="$(tests/services/server.sh mysql8 port)" \
  INBOX_TEST_BOOTSTRAP="127.0.0.1:$KAFKA_PORT" bash -c 'cd inbox/java && mvn -q -B test'

printf '\n[test] summary:\n' >&2
failed=0
for line in "${summary[@]}"; do
  printf '  %s\n' "$line" >&2
  [[ $line == FAILED* ]] && failed=1
done
exit $failed
