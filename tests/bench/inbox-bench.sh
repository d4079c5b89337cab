#!/usr/bin/env bash
# `make bench-inbox` (also the last step of `make bench`): the cost of the inbox, per language.
# The relay produces BENCH_INBOX_RECORDS (default 20000) outbox rows to a topic of one partition
# (the unit of consumer parallelism); then each helper's scenario consumer (inbox/CONTRACT.md,
# built by `make inbox`) reads all of them three times, in a fresh consumer group each time:
# `plain` (the coupon INSERT in autocommit, no inbox), `inbox` (inbox row + coupon in one
# transaction per record) and `batch` (batch mode: one transaction per poll batch of up to
# BENCH_INBOX_BATCH records, default 500), committing offsets the same way. Each run prints
# `BENCH records= seconds= p50_ms= p99_ms=` (latency: from the poll that returned the record
# until it was settled). Writes tests/bench/results/inbox-latest.md and the inbox bench table of the book's
# benchmark page (docs/src/benchmark.md).
# Servers: BENCH_INBOX_SERVERS (default mariadb10,mysql8; BENCH_INBOX_SERVER, one name, is still
# read); languages: OUTBOX_INBOX_LANGS (default rust,java,go,python); modes: BENCH_INBOX_MODES
# (default plain,inbox,batch); BENCH_RELAY: a relay binary already built (default: build
# target/debug/outbox-relay).
source "$(dirname "${BASH_SOURCE[0]}")/../services/common.sh"
cd "$REPO_ROOT"
SERVERS="${BENCH_INBOX_SERVERS:-${BENCH_INBOX_SERVER:-mariadb10,mysql8}}"
N="${BENCH_INBOX_RECORDS:-20000}"
LANGS="${OUTBOX_INBOX_LANGS:-rust,java,go,python}"
MODES="${BENCH_INBOX_MODES:-plain,inbox,batch}"
BATCH="${BENCH_INBOX_BATCH:-500}"
IFS=',' read -r -a servers <<<"${SERVERS// /}"
IFS=',' read -r -a langs <<<"${LANGS// /}"
IFS=',' read -r -a modes <<<"${MODES// /}"
for mode in "${modes[@]}"; do
  case "$mode" in plain|inbox|batch) ;; *) die "BENCH_INBOX_MODES names $mode: use plain, inbox, batch" ;; esac
done
tests/services/kafka.sh up
if [ -n "${BENCH_RELAY:-}" ]; then
  RELAY="$BENCH_RELAY"
else
  ${CARGO:-cargo} build --quiet -p outbox-relay --bin outbox-relay
  RELAY=target/debug/outbox-relay
fi
[[ ",$LANGS," != *,rust,* ]] || ${CARGO:-cargo} build --quiet --release -p outbox-inbox --example scenario_consumer
work="$(mktemp -d)"
relay_pid=""
trap '[ -z "$relay_pid" ] || kill "$relay_pid" 2>/dev/null; rm -rf "$work"' EXIT
results="$work/results.tsv"
kafka_topics() { java -cp "${KAFKA_LIBS_DIR:-$SERVICES_DIR/kafka-libs-$KAFKA_VERSION}/*" org.apache.kafka.tools.TopicCommand "$@"; }

program() {
  case "$1" in
    rust) echo "${CARGO_TARGET_DIR:-target}/release/examples/scenario_consumer" ;;
    java) echo "inbox/java/run-scenario-consumer" ;;
    go) echo "inbox/go/bin/scenario-consumer" ;;
    python) echo "inbox/python/.venv/bin/python -m outbox_inbox.examples.scenario_consumer" ;;
  esac
}

# bench_server SERVER: N outbox rows relayed to a topic of one partition, then every language
# consumes them in every mode; one line per run appended to $results.
bench_server() {
  local server="$1" port suffix db topic
  tests/services/server.sh "$server" up
  port="$(tests/services/server.sh "$server" port)"
  sql() { mariadb --protocol=TCP -h127.0.0.1 -P"$port" -uroot "$@"; }
  suffix="$(date +%s)"
  db="bench_inbox_$suffix"
  topic="bench_inbox_$suffix.order"
  log "database $db on $server (127.0.0.1:$port), topic $topic (1 partition), $N records"
  sql -e "CREATE DATABASE $db"
  for m in 0001_outbox 0002_checkpoint 0003_checkpoint_layouts 0004_inbox 0006_inbox_parked; do
    sql "$db" < "migrations/$m.sql"
  done
  sql "$db" -e "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(191),
    order_id VARCHAR(255), event_key VARCHAR(255), version BIGINT NULL,
    created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))"
  kafka_topics --bootstrap-server "127.0.0.1:$KAFKA_PORT" --create --topic "$topic" --partitions 1 --replication-factor 1 >/dev/null

  printf '%s\n' "connector_name = \"bench-inbox-$suffix\"" "[mysql]" \
    "url = \"mysql://root@127.0.0.1:$port/$db\"" "server_id = 5003" "[outbox]" \
    "tables = [\"$db.outbox\"]" "topic = \"bench_inbox_$suffix.{aggregate_type}\"" "[kafka]" \
    "bootstrap_servers = \"127.0.0.1:$KAFKA_PORT\"" "[http]" "enabled = false" > "$work/relay.toml"
  "$RELAY" run --config "$work/relay.toml" > "$work/relay.log" 2>&1 &
  relay_pid=$!
  has_checkpoint() { [ "$(sql -N "$db" -e "SELECT COUNT(*) FROM outbox_relay_checkpoint")" = 1 ]; }
  wait_for 60 "relay" has_checkpoint || { cat "$work/relay.log"; die "the relay did not start"; }
  # N rows in transactions of 1000, each with its own event_key.
  sql "$db" -e "
    CREATE TABLE d (n INT); INSERT INTO d VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9);
    CREATE TABLE seq (n INT PRIMARY KEY);
    INSERT INTO seq SELECT a.n * 100 + b.n * 10 + c.n + 1 FROM d a, d b, d c;"
  local b
  for b in $(seq 0 $(( (N + 999) / 1000 - 1 ))); do
    sql "$db" -e "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
      SELECT 'order', CONCAT('order-', $b * 1000 + n), 'OrderPaid', CONCAT('order-', $b * 1000 + n, '-paid'),
             JSON_OBJECT('order_id', CONCAT('order-', $b * 1000 + n), 'amount', 10)
      FROM seq WHERE $b * 1000 + n <= $N"
  done
  relayed() { [ "$(kcat -C -b "127.0.0.1:$KAFKA_PORT" -t "$topic" -o beginning -e -q -f '%o\n' 2>/dev/null | wc -l)" -ge "$N" ]; }
  wait_for 300 "$N records on $topic" relayed || die "the relay did not produce $N records"
  kill -TERM "$relay_pid"; wait "$relay_pid" || true; relay_pid=""

  local lang mode line batch inbox_mode
  for lang in "${langs[@]}"; do
    for mode in "${modes[@]}"; do
      batch=1; inbox_mode=inbox
      [ "$mode" != batch ] || batch="$BATCH"
      [ "$mode" != plain ] || inbox_mode=plain
      log "$server, $lang, $mode"
      line=$(env INBOX_BOOTSTRAP="127.0.0.1:$KAFKA_PORT" INBOX_DB_HOST=127.0.0.1 INBOX_DB_PORT="$port" \
        INBOX_DB_USER=root INBOX_DB_NAME="$db" INBOX_TOPIC="$topic" INBOX_GROUP="bench-$lang-$mode-$suffix" \
        INBOX_CONSUMER="bench-$lang-$mode" INBOX_DLQ_TOPIC="$topic.dlq" INBOX_MODE="$inbox_mode" \
        INBOX_BATCH="$batch" INBOX_EXIT_AFTER="$N" \
        timeout 900 $(program "$lang") 2>"$work/$server-$lang-$mode.log" | grep '^BENCH' || true)
      [ -n "$line" ] || { tail -20 "$work/$server-$lang-$mode.log"; die "$server $lang $mode printed no BENCH line"; }
      echo "  $line"
      printf '%s\t%s\t%s\t%s\n' "$server" "$lang" "$mode" "$line" >> "$results"
    done
  done
  sql -e "DROP DATABASE $db"
}

for server in "${servers[@]}"; do bench_server "$server"; done

out=tests/bench/results/inbox-latest.md
val() { printf '%s' "$1" | tr ' ' '\n' | awk -F= -v k="$2" '$1==k{print $2}'; }
line_of() { awk -F'\t' -v s="$1" -v l="$2" -v m="$3" '$1==s && $2==l && $3==m{print $4}' "$results"; }
rate() { awk -v n="$(val "$1" records)" -v s="$(val "$1" seconds)" 'BEGIN{if (s > 0) printf "%.0f", n/s}'; }
{
  echo "| server | language | mode | records/s | × plain | p50 ms | p99 ms |"
  echo "| --- | --- | --- | ---: | ---: | ---: | ---: |"
  for server in "${servers[@]}"; do
    for lang in "${langs[@]}"; do
      plain="$(line_of "$server" "$lang" plain)"
      for mode in "${modes[@]}"; do
        l="$(line_of "$server" "$lang" "$mode")"
        r="$(rate "$l")"
        ratio="–"
        [ -z "$plain" ] || ratio=$(awk -v a="$r" -v b="$(rate "$plain")" 'BEGIN{printf "%.2f", a/b}')
        label="$mode"
        [ "$mode" != batch ] || label="batch ($BATCH)"
        echo "| $server | $lang | $label | $r | $ratio | $(val "$l" p50_ms) | $(val "$l" p99_ms) |"
      done
    done
  done
  echo
  echo "$N records on one partition; servers and Kafka on 127.0.0.1, $(nproc) cores, $(date -u +%Y-%m-%d);"
  echo "\`make bench-inbox\` (BENCH_INBOX_RECORDS=$N, BENCH_INBOX_BATCH=$BATCH). \`plain\`: the coupon INSERT in"
  echo "autocommit, no inbox; \`inbox\`: one transaction per record; \`batch\`: batch mode, one transaction"
  echo "per poll batch. Rust built in release; Java $(java -version 2>&1 | head -1 | cut -d'"' -f2); Go $(go env GOVERSION | sed 's/^go//'); Python $(inbox/python/.venv/bin/python -c 'import platform; print(platform.python_version())')."
} > "$out"
cat "$out"
# The benchmark page's table between its markers.
python3 - "$out" <<'EOF'
import re, sys
table = open(sys.argv[1]).read().strip()
readme = open("docs/src/benchmark.md").read()
start, end = "<!-- inbox-bench:start -->", "<!-- inbox-bench:end -->"
if start in readme and end in readme:
    readme = re.sub(re.escape(start) + ".*?" + re.escape(end), start + "\n" + table + "\n" + end, readme, flags=re.S)
    open("docs/src/benchmark.md", "w").write(readme)
EOF
