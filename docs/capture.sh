#!/usr/bin/env bash
# `make docs-capture`: runs the commands whose output the book shows, against the test servers
# (MariaDB 10.11 on MARIADB_PORT, Kafka on KAFKA_PORT; started if needed, as `make services-up`
# does), and writes each output into its block of the book's pages:
#
#   <!-- capture:NAME -->
#   ```text
#   $ outbox-relay status --config relay.toml
#   ...the output...
#   ```
#   <!-- capture:end -->
#
# Every block of that form in docs/src is rewritten (whatever it held), so running it again after
# a change of the commands' messages updates the book in one step; a block whose NAME this script
# does not capture, or a capture no page has a block for, fails the run (nothing is written then).
#
# The scenario: a database and topics of its own, the README's least-privileged relay user, a
# relay started (its start-up log lines are a capture), four outbox rows (two records; a row of a
# second outbox table stamped with its created_at two hours ahead, which the topic refuses
# (Kafka 4's log.message.timestamp.after.max.ms, 1 h): dead-lettered with its value, replayable;
# a row whose aggregate type makes no valid topic, dead-lettered for good), a consumer group that
# read the records, then the relay stopped, the operator commands run, and one more row written
# for `trace` to find not relayed yet. `trace` is shown with
# its report (stdout) only: its log lines (stderr) about the scenario's own DDL are left out.
#
# What varies from run to run is normalized, and only that (docs/capture_normalize.py):
#   - the run's unique name (database, connector, topics) is shown as `shop`;
#   - each distinct date-time, binlog file number, binlog position, MariaDB GTID sequence number,
#     duration in seconds, byte count of a lag, host:pid, connection id, and port the system chose
#     becomes a fixed value of its kind, numbered in the order of first appearance within its block
#     (so equal values stay equal, and the text reads as a real run);
#   - log lines lose their leading timestamp;
#   (so a second run on otherwise idle servers rewrites no block; on servers other tests write to,
#   the lag and checkpoint lines of status and trace may differ, as they do in a real run);
#   - counts of the shared servers' binlog files and Kafka topics become fixed numbers;
#   - `fleet status`'s partition of each source (murmur2 of the source's name, which holds the
#     run's unique name) is numbered like the other values.
# Exit codes other than 0 are shown as `$ echo $?` and the code.
#
# The commands that change state act only with --yes (the operator commands' confirmation rule:
# without it, a plan and exit code 4); the plans and the runs shown are these.
PRUNE_PLAN_ARGS=(prune --older-than 1s)
DLQ_PLAN_ARGS=(dlq replay --dry-run)
DLQ_RUN_ARGS=(dlq replay --yes)
#
#   docs/capture.sh            (OUTBOX_RELAY_BIN: a built relay; default: cargo build -p outbox-relay)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tests/services/common.sh"
cd "$REPO_ROOT"

tests/services/server.sh mariadb10 up
tests/services/kafka.sh up
if [ -z "${OUTBOX_RELAY_BIN:-}" ]; then
  cargo build -q -p outbox-relay --bin outbox-relay
  target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  OUTBOX_RELAY_BIN="$target/debug/outbox-relay"
fi
relay="$OUTBOX_RELAY_BIN"

uid="docs$$x$(date +%s)"
work="$(mktemp -d)"
out="$work/captures"
mkdir -p "$out"
kafka="127.0.0.1:$KAFKA_PORT"
sql() { mariadb --protocol=TCP -h127.0.0.1 -P"$MARIADB_PORT" -uroot "$@"; }
relay_pid=""
cleanup() {
  [ -z "$relay_pid" ] || { kill "$relay_pid" 2>/dev/null; wait "$relay_pid" 2>/dev/null; } || true
  sql -e "DROP DATABASE IF EXISTS \`$uid\`" || true
  for t in "$uid.Order" "$uid.dead_letter"; do
    tests/services/kafka-topics.sh --bootstrap-server "$kafka" --delete --if-exists --topic "$t" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# capture NAME CMD...: runs `outbox-relay CMD...` in $work (configs are named there), keeps the
# command line as shown, its stdout and stderr (stdout only with STDOUT_ONLY=1), and its exit code.
capture() {
  local name="$1"; shift
  local code=0
  if [ "${STDOUT_ONLY:-0}" = 0 ]; then
    (cd "$work" && "$relay" "$@") >"$out/$name.out" 2>&1 || code=$?
  else
    (cd "$work" && "$relay" "$@") >"$out/$name.out" 2>"$out/$name.err" || code=$?
  fi
  { printf '$ outbox-relay %s\n' "$*"; cat "$out/$name.out"
    [ "$code" = 0 ] || printf '$ echo $?\n%s\n' "$code"; } >"$out/$name.txt"
  log "captured $name (exit code $code)"
}

log "scenario: database and topics $uid"
sql -e "CREATE DATABASE \`$uid\` DEFAULT CHARACTER SET utf8mb4"
sql "$uid" <migrations/0001_outbox.sql
sql "$uid" <migrations/0002_checkpoint.sql
sql "$uid" -e "CREATE TABLE outbox_future LIKE outbox"
sql -e "CREATE USER IF NOT EXISTS 'relay'@'%' IDENTIFIED BY 'secret';
  GRANT REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER ADMIN, REPLICA MONITOR ON *.* TO 'relay'@'%';
  GRANT SELECT ON \`$uid\`.outbox TO 'relay'@'%';
  GRANT SELECT ON \`$uid\`.outbox_future TO 'relay'@'%';
  GRANT SELECT, INSERT, UPDATE ON \`$uid\`.outbox_relay_checkpoint TO 'relay'@'%';"
tests/services/kafka-topics.sh --bootstrap-server "$kafka" --create --topic "$uid.Order" --partitions 3 >/dev/null 2>&1
# One partition: dlq replay lists the dead letters in one order on every run.
tests/services/kafka-topics.sh --bootstrap-server "$kafka" --create --topic "$uid.dead_letter" --partitions 1 >/dev/null 2>&1

cat >"$work/relay.toml" <<EOF
connector_name = "$uid-relay"

[mysql]
url = "mysql://relay:secret@127.0.0.1:$MARIADB_PORT/$uid"
server_id = 5001

[outbox]
tables = ["$uid.outbox"]
topic = "{database}.{aggregate_type}"

[[outbox.table]]
name = "$uid.outbox_future"
timestamp = "column"
timestamp_refused = "row_error"

[kafka]
bootstrap_servers = "$kafka"

[dead_letter]
enabled = true
topic = "$uid.dead_letter"

[http]
listen = "127.0.0.1:0"
EOF

# The relay's start-up, as its log shows it.
(cd "$work" && exec "$relay" run --config relay.toml) 2>"$work/relay.log" &
relay_pid=$!
wait_for 60 "the relay (streaming)" grep -q "streaming binlog" "$work/relay.log" ||
  { cat "$work/relay.log" >&2; die "the relay did not start streaming"; }
{ echo '$ outbox-relay run --config relay.toml'; sed '/streaming binlog/q' "$work/relay.log"; } >"$out/startup-log.txt"
log "captured startup-log"

sql "$uid" -e "
  BEGIN;
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
    VALUES ('Order', 'order-1001', 'OrderCreated', 'evt-1001-created', '{\"total\": 42}');
  COMMIT;
  BEGIN;
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
    VALUES ('Order', 'order-1001', 'OrderPaid', 'evt-1001-paid', '{\"paid\": 42}');
  INSERT INTO outbox_future (aggregate_type, aggregate_id, event_type, event_key, payload, created_at)
    VALUES ('Order', 'order-1002', 'OrderCreated', 'evt-1002-created', '{\"total\": 7}',
            UTC_TIMESTAMP(6) + INTERVAL 2 HOUR);
  COMMIT;
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
    VALUES ('Bad Type!', 'order-1003', 'OrderCreated', 'evt-1003-created', '{}');"
count() { kcat -q -C -b "$kafka" -t "$1" -o beginning -e -f '%o\n' 2>/dev/null | grep -c . || true; }
relayed() { [ "$(count "$uid.Order")" -ge 2 ] && [ "$(count "$uid.dead_letter")" -ge 2 ]; }
wait_for 60 "2 records and 2 dead letters" relayed || { cat "$work/relay.log" >&2; die "the records did not arrive"; }
# A consumer group (the fulfilment service) that read both records and committed its offsets.
kcat -q -C -b "$kafka" -G "$uid-fulfilment" -c 2 -X auto.offset.reset=earliest "$uid.Order" >/dev/null
wait_for 30 "checkpoint past the rows" bash -c "[ \"\$(mariadb --protocol=TCP -h127.0.0.1 -P$MARIADB_PORT -uroot -N $uid -e 'SELECT COUNT(*) FROM outbox_relay_checkpoint WHERE updated_at > NOW(6) - INTERVAL 5 SECOND')\" = 1 ]" || true

# Best effort: the checkpoint caught up with the server's end (on an otherwise idle server it is
# within a second; on a busy shared one the lag lines may differ from run to run).
caught_up() { (cd "$work" && "$relay" status --config relay.toml --json) | grep -q '"lag":{"bytes":0,'; }
wait_for 15 "the relay caught up" caught_up || true
capture status status --config relay.toml
capture status-json status --config relay.toml --json
STDOUT_ONLY=1 capture trace trace --config relay.toml evt-1001-created
STDOUT_ONLY=1 capture trace-dead-letter trace --config relay.toml evt-1003-created

kill -TERM "$relay_pid"
wait "$relay_pid" || die "the relay did not stop cleanly"
relay_pid=""

capture version --version
capture check check --config relay.toml
capture reset-plan reset --config relay.toml --to earliest
capture prune-plan "${PRUNE_PLAN_ARGS[@]}" --config relay.toml
capture republish-plan republish --config relay.toml --event-key evt-1001-created --event-key evt-1001-paid
capture dlq-replay-plan "${DLQ_PLAN_ARGS[@]}" --config relay.toml
capture dlq-replay "${DLQ_RUN_ARGS[@]}" --config relay.toml

# A row committed while no relay runs: trace finds it not relayed yet (exit code 5).
sql "$uid" -e "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
  VALUES ('Order', 'order-1004', 'OrderCreated', 'evt-1004-created', '{\"total\": 9}')"
STDOUT_ONLY=1 capture trace-not-relayed trace --config relay.toml evt-1004-created

# check on a table whose created_at is not a date-time (a failure, exit code 3): its FAIL line.
sql "$uid" -e "CREATE TABLE outbox_text LIKE outbox; ALTER TABLE outbox_text MODIFY created_at VARCHAR(32) NOT NULL DEFAULT '';
  GRANT SELECT ON \`$uid\`.outbox_text TO 'relay'@'%';"
sed -e "s/tables = \[\"$uid.outbox\"\]/tables = [\"$uid.outbox_text\"]/" -e '/^\[\[outbox.table\]\]/,/^timestamp_refused/d' \
  "$work/relay.toml" >"$work/relay-text.toml"
capture check-failure check --config relay-text.toml
{ head -1 "$out/check-failure.txt"; grep -A1 '^FAIL' "$out/check-failure.out"; sed -n '/^\$ echo/,$p' "$out/check-failure.txt"; } >"$out/check-failure.cut"
mv "$out/check-failure.cut" "$out/check-failure.txt"

# Exactly-once with a transaction timeout over the brokers' transaction.max.timeout.ms (15 min by
# default): check's FAIL line and its transaction.version line.
sed -e 's/^\[kafka\]$/[kafka]\ndelivery = "exactly_once"\ntransaction_timeout_ms = 1000000/' \
  "$work/relay.toml" >"$work/relay-eos.toml"
capture check-eos check --config relay-eos.toml
{ head -1 "$out/check-eos.txt"; grep -A1 'kafka.transaction_timeout_ms' "$out/check-eos.out" | grep -v '^--$';
  grep '^OK    transaction.version' "$out/check-eos.out"; sed -n '/^\$ echo/,$p' "$out/check-eos.txt"; } >"$out/check-eos.cut"
mv "$out/check-eos.cut" "$out/check-eos.txt"

# A fleet of two sources on this database, no process running: fleet status.
cat >"$work/fleet.toml" <<EOF
[kafka]
bootstrap_servers = "$kafka"

[fleet]
group_id = "$uid-fleet"
control_topic = "$uid.fleet"

[outbox]
topic = "{database}.{aggregate_type}"

[[source]]
name = "$uid-relay"
[source.mysql]
url = "mysql://relay:secret@127.0.0.1:$MARIADB_PORT/$uid"
[source.outbox]
tables = ["$uid.outbox"]

[[source]]
name = "$uid-payments"
[source.mysql]
url = "mysql://relay:secret@127.0.0.1:$MARIADB_PORT/$uid"
[source.outbox]
tables = ["$uid.outbox"]
EOF
capture fleet-status fleet status --config fleet.toml

# The same fleet with Kafka unreachable (nothing listens on port 1) and one attempt to join: the
# process gives up and exits 1 with the error that names the fix (its ERROR line only).
sed -e 's/^bootstrap_servers = .*/bootstrap_servers = "127.0.0.1:1"/' \
  -e 's/^\[fleet\]$/[retry]\nmax_attempts = 1\n\n[fleet]/' "$work/fleet.toml" >"$work/fleet-down.toml"
capture fleet-join-error run --config fleet-down.toml
{ head -1 "$out/fleet-join-error.txt"; grep 'ERROR' "$out/fleet-join-error.out" | tail -1;
  sed -n '/^\$ echo/,$p' "$out/fleet-join-error.txt"; } >"$out/fleet-join-error.cut"
mv "$out/fleet-join-error.cut" "$out/fleet-join-error.txt"

python3 docs/capture_normalize.py "$uid" "$out" docs/src
log "done: every capture block of docs/src rewritten"
