#!/usr/bin/env bash
# `make demo`: the relay end to end on real servers. Starts MariaDB and Kafka (installing them if
# needed), creates the demo database, runs the relay, lets a separate process write an order flow
# as outbox rows, prints the Kafka records, stops the relay gracefully and the services it
# started.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib.sh"
demo_dir demo
demo_services_up

step "building outbox-relay"
(cd "$ROOT" && cargo build --quiet --bin outbox-relay)
RELAY="$ROOT/target/debug/outbox-relay"

step "schema: database outbox_demo with migrations/0001_outbox.sql, 0002_checkpoint.sql and 0003_checkpoint_layouts.sql"
sql -e "DROP DATABASE IF EXISTS outbox_demo; CREATE DATABASE outbox_demo"
sql outbox_demo < "$ROOT/migrations/0001_outbox.sql"
sql outbox_demo < "$ROOT/migrations/0002_checkpoint.sql"
sql outbox_demo < "$ROOT/migrations/0003_checkpoint_layouts.sql"

step "topics: demo.outbox.event.Order and demo.outbox.event.Payment, 3 partitions each (created before the relay starts, not left to the broker's auto-creation)"
for t in demo.outbox.event.Order demo.outbox.event.Payment; do
  "$ROOT/tests/services/kafka-topics.sh" --bootstrap-server "127.0.0.1:$KAFKA_PORT" --create \
    --if-not-exists --topic "$t" --partitions 3 --replication-factor 1
done

step "starting the relay (log: $DEMO_DIR/relay.log)"
cfg="$DEMO_DIR/relay.toml"
sed -e "s/127.0.0.1:3306/127.0.0.1:$MARIADB_PORT/" -e "s/127.0.0.1:9092/127.0.0.1:$KAFKA_PORT/" "$HERE/relay.toml" > "$cfg"
"$RELAY" run --config "$cfg" > "$DEMO_DIR/relay.log" 2>&1 &
relay_pid=$!
trap 'kill $relay_pid 2>/dev/null || true' EXIT
has_checkpoint() { [ "$(sql -N outbox_demo -e "SELECT COUNT(*) FROM outbox_relay_checkpoint WHERE connector_name='demo'")" = 1 ]; }
wait_for 60 "relay (initial checkpoint stored)" has_checkpoint || { cat "$DEMO_DIR/relay.log"; die "the relay did not start"; }

step "order service: 4 orders created and paid, 1 rolled back (tests/demo/orders.sql, via the mariadb client)"
start_ms=$(( $(date +%s) * 1000 - 1000 ))
sql outbox_demo < "$HERE/orders.sql"
sql -t outbox_demo -e "SELECT id, aggregate_type, aggregate_id, event_type, event_key FROM outbox ORDER BY id"

expected=12
consume() { kcat -C -b "127.0.0.1:$KAFKA_PORT" -t "$1" -o "s@$start_ms" -e -q "${@:2}" 2>/dev/null; }
count() { local n=0 t; for t in demo.outbox.event.Order demo.outbox.event.Payment; do n=$((n + $(consume "$t" -f '%o\n' | grep -c . || true))); done; echo $n; }
have_all() { [ "$(count)" -ge "$expected" ]; }
step "waiting for $expected records on Kafka"
wait_for 60 "Kafka records" have_all || { cat "$DEMO_DIR/relay.log"; die "expected $expected records, saw $(count)"; }

step "records on Kafka (topic, partition, offset, key, headers, value)"
for t in demo.outbox.event.Order demo.outbox.event.Payment; do
  consume "$t" -f 'topic=%t partition=%p offset=%o key=%k\n  headers: %h\n  value:   %s\n'
done
echo "total: $(count) records (8 Order + 4 Payment; the rolled-back order-1005 and the DELETEs produced none)"

if command -v curl >/dev/null 2>&1; then
  step "health and metrics (http.listen, default 127.0.0.1:9719; docs/src/operations/metrics.md)"
  curl -s http://127.0.0.1:9719/readyz
  curl -s http://127.0.0.1:9719/metrics | grep -E '^outbox_relay_(outbox_rows_read_total|records_produced_total|records_in_flight|lag_seconds|checkpoint_binlog)' || true
fi

step "stopping the relay (SIGTERM: finish the transaction, wait for acks, write the checkpoint)"
kill -TERM "$relay_pid"
wait "$relay_pid" && echo "relay exited with code 0"
trap - EXIT
sql -t outbox_demo -e "SELECT connector_name, binlog_file, binlog_pos, gtid_set, updated_at FROM outbox_relay_checkpoint"
sql -t -e "SHOW BINARY LOGS"

demo_services_down
step "done"
