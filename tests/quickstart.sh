#!/usr/bin/env bash
# The README's "Run it yourself in five minutes", run as a reader pastes it: every ```sh block
# between <!-- quickstart:begin --> and <!-- quickstart:end --> in README.md, in order, in one
# bash, from the repository's root, against the test servers (MariaDB 10.11 on MARIADB_PORT,
# Kafka on KAFKA_PORT). The blocks read DB, DB_PORT, KAFKA_PORT and DIR with defaults; this test
# sets them to a database and topic of its own and a scratch folder, and the relay's HTTP port to
# one the system picks (OUTBOX_RELAY__HTTP__LISTEN, which the relay reads from the environment: the
# README's 9719 may be taken by another relay on a shared machine); it changes nothing else.
# It runs them twice (a reader pasting them again: the second run must read its own record, not
# the first run's). Then it checks with its own Kafka reader that each run's record arrived with
# the key, headers and value the README shows, that the README's own reader printed it, that the
# relay stopped cleanly with its checkpoint stored, and that the README's next command, `check`,
# prints no WARN or FAIL line on this setup. Part of `make test` (tests/run.sh); about 30 s when
# the relay is built.
#   tests/quickstart.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/services/common.sh"
cd "$REPO_ROOT"

fail() { printf '[quickstart] FAILED: %s\n' "$*" >&2; exit 1; }
say() { printf '[quickstart] %s\n' "$*" >&2; }

# Letters and digits only: a database name the README's lines take unquoted.
name="qs$$x$(date +%s)"
scratch="$(mktemp -d)"
topic="$name.Order"
sql() { mariadb --protocol=TCP -h127.0.0.1 -P"$MARIADB_PORT" -uroot "$@"; }

# The README's lines, extracted: nothing is added to them but a first line that fails the
# script on the first command that fails (as a reader would stop there).
python3 - README.md >"$scratch/quickstart.sh" <<'EOF'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
m = re.search(r"<!-- quickstart:begin -->(.*?)<!-- quickstart:end -->", text, re.S)
if not m:
    sys.exit("README.md has no <!-- quickstart:begin --> ... <!-- quickstart:end --> block")
blocks = re.findall(r"^```sh\n(.*?)^```", m.group(1), re.S | re.M)
if not blocks:
    sys.exit("the quickstart block of README.md holds no ```sh block")
print("set -euo pipefail")
print("".join(blocks), end="")
EOF
say "running $(grep -c . "$scratch/quickstart.sh") lines of README.md (DB=$name, DIR=$scratch)"

cleanup() {
  [ -z "${pgid:-}" ] || kill -- "-$pgid" 2>/dev/null || true
  sql -e "DROP DATABASE IF EXISTS \`$name\`" 2>/dev/null || true
  tests/services/kafka-topics.sh --bootstrap-server "127.0.0.1:$KAFKA_PORT" --delete --if-exists \
    --topic "$topic" >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT

# run_readme N: runs the README's lines (output in $scratch/out.N.txt, err.N.txt), in its own
# process group, so that a run that hangs (a record that never comes: the README's kcat waits
# for one) is stopped whole, the relay it started included.
run_readme() {
  local n="$1" start=$SECONDS status=0
  DB="$name" DB_PORT="$MARIADB_PORT" KAFKA_PORT="$KAFKA_PORT" DIR="$scratch" OUTBOX_RELAY__HTTP__LISTEN=127.0.0.1:0 \
    setsid bash "$scratch/quickstart.sh" >"$scratch/out.$n.txt" 2>"$scratch/err.$n.txt" &
  pgid=$!
  local deadline=$((SECONDS + ${QUICKSTART_TIMEOUT:-180}))
  while kill -0 "$pgid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 1; done
  if kill -0 "$pgid" 2>/dev/null; then
    cat "$scratch/out.$n.txt" "$scratch/err.$n.txt" "$scratch/relay.log" >&2 2>/dev/null || true
    fail "the README's lines (run $n) did not finish within ${QUICKSTART_TIMEOUT:-180} s"
  fi
  wait "$pgid" || status=$?
  pgid=""
  if [ "$status" != 0 ]; then
    cat "$scratch/out.$n.txt" "$scratch/err.$n.txt" >&2
    [ ! -f "$scratch/relay.log" ] || { echo "--- relay.log" >&2; cat "$scratch/relay.log" >&2; }
    fail "the README's lines (run $n) exited with $status"
  fi
  say "the README's lines (run $n) ran in $((SECONDS - start)) s"
  # What the README's own reader printed: this run's record (id n), not an older one.
  grep -qx 'key order-1001' "$scratch/out.$n.txt" || { cat "$scratch/out.$n.txt" >&2; fail "the README's kcat line (run $n) printed no 'key order-1001'"; }
  grep -q "^headers id=$n," "$scratch/out.$n.txt" || { cat "$scratch/out.$n.txt" >&2; fail "the README's kcat line (run $n) printed no record with id=$n"; }
  # `kill $!` asked the relay to stop: it writes its checkpoint and says so.
  for _ in $(seq 1 30); do grep -q "stopped cleanly" "$scratch/relay.log" && break; sleep 1; done
  grep -q "stopped cleanly" "$scratch/relay.log" || { cat "$scratch/relay.log" >&2; fail "the relay (run $n) did not stop cleanly after kill \$!"; }
}

# Pasted once, then again (as a reader who tries it twice): the second run reads its own record.
run_readme 1
run_readme 2

# The records, read again by this test: exactly one per run, with the README's key, headers and
# value.
records="$(kcat -q -C -b "127.0.0.1:$KAFKA_PORT" -t "$topic" -o beginning -e -f '%k|%h|%s\n')"
[ "$(printf '%s\n' "$records" | grep -c .)" = 2 ] || fail "expected 2 records on $topic, found: $records"
for n in 1 2; do
  IFS='|' read -r key headers value <<<"$(printf '%s\n' "$records" | sed -n "${n}p")"
  [ "$key" = order-1001 ] || fail "key: expected order-1001, found $key"
  [[ $headers =~ ^id=$n,event_key=[0-9a-f-]{36},event_type=OrderCreated,aggregate_type=Order$ ]] ||
    fail "headers: expected id=$n,event_key=<uuid>,event_type=OrderCreated,aggregate_type=Order, found $headers"
  [ "$value" = '{"total": 42}' ] || fail "value: expected {\"total\": 42}, found $value"
  event_key="${headers#*event_key=}"; event_key="${event_key%%,*}"
  [ "$(sql -N "$name" -e "SELECT event_key FROM outbox WHERE id = $n")" = "$event_key" ] ||
    fail "the record's event_key $event_key is not the outbox row's"
done
  [ "$(sql -N "$name" -e "SELECT COUNT(*) FROM outbox_relay_checkpoint WHERE connector_name = '$name-relay'")" = 1 ] ||
  fail "no checkpoint row for connector $name-relay"

# The README's next line, `check` on the same setup: a correct setup gets no warning.
check="$(cargo run -q -p outbox-relay -- check --config "$scratch/relay.toml" 2>&1)" ||
  { printf '%s\n' "$check" >&2; fail "check on the README's setup exited with $?"; }
if printf '%s\n' "$check" | grep -E '^(WARN|FAIL)'; then
  printf '%s\n' "$check" >&2
  fail "check on the README's setup warned (above)"
fi
say "OK: each run's record arrived on $topic with key order-1001, the README's headers and value, and the README's reader printed it; the relay stopped cleanly; check warned about nothing"
