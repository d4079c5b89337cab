#!/usr/bin/env bash
# `make bench-inbox` (also the last step of `make bench`): the cost of the inbox, per language.
# The relay produces BENCH_INBOX_RECORDS (default 20000) outbox rows to a topic of one partition
# (the unit of consumer parallelism); then each helper's scenario consumer (inbox/CONTRACT.md,
# built by `make inbox`) reads all of them twice, in a fresh consumer group each time: `plain`
# (the coupon INSERT in autocommit, no inbox) and `inbox` (inbox row + coupon in one
# transaction), committing offsets the same way. Each run prints `BENCH records= seconds=
# p50_ms= p99_ms=` (latency: from the poll that returned the record until it was settled).
# Writes tests/bench/results/inbox-latest.md and the README's inbox bench table.
# Server: BENCH_INBOX_SERVER (default mariadb10); languages: OUTBOX_INBOX_LANGS (default
# rust,java,go,python).
source "$(dirname "${BASH_SOURCE[0]}")/../services/common.sh"
cd "$REPO_ROOT"
SERVER="${BENCH_INBOX_SERVER:-mariadb10}"
N="${BENCH_INBOX_RECORDS:-20000}"
LANGS="${OUTBOX_INBOX_LANGS:-rust,java,go,python}"
tests/services/server.sh "$SERVER" up
tests/services/kafka.sh up
PORT="$(tests/services/server.sh "$SERVER" port)"
sql() { mariadb --protocol=TCP -h127.0.0.1 -P"$PORT" -uroot "$@"; }
${CARGO:-cargo} build --quiet -p outbox-relay --bin outbox-relay
${CARGO:-cargo} build --quiet --release -p outbox-inbox --example scenario_consumer
RELAY=target/debug/outbox-relay
work="$(mktemp -d)"
relay_pid=""
trap '[ -z "$relay_pid" ] || kill "$relay_pid" 2>/dev/null; rm -rf "$work"' EXIT

suffix="$(date +%s)"
DB="bench_inbox_$suffix"
TOPIC="bench_inbox_$suffix.order"
log "database $DB on $SERVER (127.0.0.1:$PORT), topic $TOPIC (1 partition), $N records"
sql -e "CREATE DATABASE $DB"
sql "$DB" < migrations/0001_outbox.sql
sql "$DB" < migrations/0002_checkpoint.sql
sql "$DB" < migrations/0003_checkpoint_layouts.sql
sql "$DB" < migrations/0004_inbox.sql
sql "$DB" -e "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(191), order_id VARCHAR(255), event_key VARCHAR(255), version BIGINT NULL)"
kafka_topics() { java -cp "${KAFKA_LIBS_DIR:-$SERVICES_DIR/kafka-libs-$KAFKA_VERSION}/*" org.apache.kafka.tools.TopicCommand "$@"; }
kafka_topics --bootstrap-server "127.0.0.1:$KAFKA_PORT" --create --topic "$TOPIC" --partitions 1 --replication-factor 1 >/dev/null

cat > "$work/relay.toml" <<EOF
connector_name = "bench-inbox-$suffix"
[mysql]
url = "mysql://root@127.0.0.1:$PORT/$DB"
server_id = 5003
[outbox]
tables = ["$DB.outbox"]
topic = "bench_inbox_$suffix.{aggregate_type}"
[kafka]
bootstrap_servers = "127.0.0.1:$KAFKA_PORT"
[http]
enabled = false
EOF
"$RELAY" run --config "$work/relay.toml" > "$work/relay.log" 2>&1 &
relay_pid=$!
has_checkpoint() { [ "$(sql -N "$DB" -e "SELECT COUNT(*) FROM outbox_relay_checkpoint")" = 1 ]; }
wait_for 60 "relay" has_checkpoint || { cat "$work/relay.log"; die "the relay did not start"; }
# N rows in transactions of 1000, each with its own event_key.
sql "$DB" -e "
  CREATE TABLE d (n INT); INSERT INTO d VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9);
  CREATE TABLE seq (n INT PRIMARY KEY);
  INSERT INTO seq SELECT a.n * 100 + b.n * 10 + c.n + 1 FROM d a, d b, d c;"
batches=$(( (N + 999) / 1000 ))
for b in $(seq 0 $((batches - 1))); do
  sql "$DB" -e "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
    SELECT 'order', CONCAT('order-', $b * 1000 + n), 'OrderPaid', CONCAT('order-', $b * 1000 + n, '-paid'),
           JSON_OBJECT('order_id', CONCAT('order-', $b * 1000 + n), 'amount', 10)
    FROM seq WHERE $b * 1000 + n <= $N"
done
relayed() { [ "$(kcat -C -b "127.0.0.1:$KAFKA_PORT" -t "$TOPIC" -o beginning -e -q -f '%o\n' 2>/dev/null | wc -l)" -ge "$N" ]; }
wait_for 300 "$N records on $TOPIC" relayed || die "the relay did not produce $N records"
kill -TERM "$relay_pid"; wait "$relay_pid" || true; relay_pid=""

program() {
  case "$1" in
    rust) echo "target/release/examples/scenario_consumer" ;;
    java) echo "inbox/java/run-scenario-consumer" ;;
    go) echo "inbox/go/bin/scenario-consumer" ;;
    python) echo "inbox/python/.venv/bin/python -m outbox_inbox.examples.scenario_consumer" ;;
  esac
}
results="$work/results.tsv"
IFS=',' read -r -a langs <<<"${LANGS// /}"
for lang in "${langs[@]}"; do
  for mode in plain inbox; do
    log "$lang, $mode"
    line=$(env INBOX_BOOTSTRAP="127.0.0.1:$KAFKA_PORT" INBOX_DB_HOST=127.0.0.1 INBOX_DB_PORT="$PORT" \
      INBOX_DB_USER=root INBOX_DB_NAME="$DB" INBOX_TOPIC="$TOPIC" INBOX_GROUP="bench-$lang-$mode-$suffix" \
      INBOX_CONSUMER="bench-$lang-$mode" INBOX_DLQ_TOPIC="$TOPIC.dlq" INBOX_MODE="$mode" INBOX_EXIT_AFTER="$N" \
      timeout 900 $(program "$lang") 2>"$work/$lang-$mode.log" | grep '^BENCH' || true)
    [ -n "$line" ] || { tail -20 "$work/$lang-$mode.log"; die "$lang $mode printed no BENCH line"; }
    echo "  $line"
    printf '%s\t%s\t%s\n' "$lang" "$mode" "$line" >> "$results"
  done
done
sql -e "DROP DATABASE $DB"

out=tests/bench/results/inbox-latest.md
{
  echo "| language | plain records/s | inbox records/s | inbox / plain | plain p99 ms | inbox p99 ms |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  for lang in "${langs[@]}"; do
    p=$(awk -F'\t' -v l="$lang" '$1==l && $2=="plain"{print $3}' "$results")
    i=$(awk -F'\t' -v l="$lang" '$1==l && $2=="inbox"{print $3}' "$results")
    val() { printf '%s' "$1" | tr ' ' '\n' | awk -F= -v k="$2" '$1==k{print $2}'; }
    pr=$(awk -v n="$(val "$p" records)" -v s="$(val "$p" seconds)" 'BEGIN{printf "%.0f", n/s}')
    ir=$(awk -v n="$(val "$i" records)" -v s="$(val "$i" seconds)" 'BEGIN{printf "%.0f", n/s}')
    ratio=$(awk -v a="$ir" -v b="$pr" 'BEGIN{printf "%.2f", a/b}')
    echo "| $lang | $pr | $ir | $ratio | $(val "$p" p99_ms) | $(val "$i" p99_ms) |"
  done
  echo
  echo "$N records on one partition, $SERVER and Kafka on 127.0.0.1, $(nproc) cores, $(date -u +%Y-%m-%d);"
  echo "\`make bench-inbox\` (BENCH_INBOX_RECORDS=$N). Rust built in release; Java on $(java -version 2>&1 | head -1 | cut -d'"' -f2); Go $(go env GOVERSION); Python $(inbox/python/.venv/bin/python -c 'import platform; print(platform.python_version())')."
} > "$out"
cat "$out"
# The README's table between its markers.
python3 - "$out" <<'EOF'
import re, sys
table = open(sys.argv[1]).read().strip()
readme = open("README.md").read()
start, end = "<!-- inbox-bench:start -->", "<!-- inbox-bench:end -->"
if start in readme and end in readme:
    readme = re.sub(re.escape(start) + ".*?" + re.escape(end), start + "\n" + table + "\n" + end, readme, flags=re.S)
    open("README.md", "w").write(readme)
EOF
