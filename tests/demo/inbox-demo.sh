#!/usr/bin/env bash
# `make demo-inbox`: the consumer half of the pattern. The relay produces order events; a
# fulfilment consumer built on the Rust inbox helper (crates/inbox, its scenario consumer example:
# one coupon row per OrderPaid event, inbox/CONTRACT.md) grants coupons. The demo crashes the
# consumer (exit 137) right after a database commit and before its Kafka offset commit, restarts
# it, then delivers one record a second time by hand: every order still has exactly one coupon.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib.sh"
demo_dir demo-inbox
demo_services_up

step "building outbox-relay and the Rust inbox helper's consumer"
(cd "$ROOT" && cargo build --quiet -p outbox-relay --bin outbox-relay && cargo build --quiet -p outbox-inbox --example scenario_consumer)
RELAY="$ROOT/target/debug/outbox-relay"
CONSUMER="$ROOT/target/debug/examples/scenario_consumer"

suffix=$(date +%s)
TOPIC="demo_inbox_$suffix.order"
DLQ="demo_inbox_$suffix.fulfilment.dead_letter"
step "schema: shop_demo (outbox, checkpoint) and fulfilment_demo (inbox tables by 'outbox-relay migrate --inbox', coupons)"
sql -e "DROP DATABASE IF EXISTS shop_demo; CREATE DATABASE shop_demo; DROP DATABASE IF EXISTS fulfilment_demo; CREATE DATABASE fulfilment_demo"
sql shop_demo < "$ROOT/migrations/0001_outbox.sql"
sql shop_demo < "$ROOT/migrations/0002_checkpoint.sql"
sql shop_demo < "$ROOT/migrations/0003_checkpoint_layouts.sql"
"$RELAY" migrate --inbox --database-url "mysql://root@127.0.0.1:$MARIADB_PORT/fulfilment_demo"
# No unique key on purpose: a double grant would show as two rows.
sql fulfilment_demo -e "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(191), order_id VARCHAR(255), event_key VARCHAR(255), version BIGINT NULL)"

step "starting the relay (log: $DEMO_DIR/relay.log)"
cfg="$DEMO_DIR/relay.toml"
cat > "$cfg" <<EOF
connector_name = "demo-inbox-$suffix"
[mysql]
url = "mysql://root@127.0.0.1:$MARIADB_PORT/shop_demo"
server_id = 5002
[outbox]
tables = ["shop_demo.outbox"]
topic = "demo_inbox_$suffix.{aggregate_type}"
[kafka]
bootstrap_servers = "127.0.0.1:$KAFKA_PORT"
[http]
enabled = false
EOF
"$RELAY" run --config "$cfg" > "$DEMO_DIR/relay.log" 2>&1 &
relay_pid=$!
consumer_pid=
cleanup() {
  kill "$relay_pid" 2>/dev/null || true
  [ -z "$consumer_pid" ] || kill "$consumer_pid" 2>/dev/null || true
}
trap cleanup EXIT
has_checkpoint() { [ "$(sql -N shop_demo -e "SELECT COUNT(*) FROM outbox_relay_checkpoint")" = 1 ]; }
wait_for 60 "relay (initial checkpoint stored)" has_checkpoint || { cat "$DEMO_DIR/relay.log"; die "the relay did not start"; }

step "order service: 6 orders paid (OrderPaid events in the outbox, one transaction each)"
for n in 1 2 3 4 5 6; do
  sql shop_demo -e "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload) VALUES ('order', 'order-$n', 'OrderPaid', 'order-$n-paid', JSON_OBJECT('order_id', 'order-$n', 'amount', 10 * $n))"
done

consumer_env=(
  INBOX_BOOTSTRAP="127.0.0.1:$KAFKA_PORT" INBOX_DB_HOST=127.0.0.1 INBOX_DB_PORT="$MARIADB_PORT"
  INBOX_DB_USER=root INBOX_DB_NAME=fulfilment_demo INBOX_TOPIC="$TOPIC" INBOX_GROUP=fulfilment
  INBOX_CONSUMER=fulfilment INBOX_DLQ_TOPIC="$DLQ"
)
coupons() { sql -N fulfilment_demo -e "SELECT COUNT(*) FROM coupons"; }

step "fulfilment consumer, run 1: it will crash (exit 137) right after the database commit of order-3-paid, before its Kafka offset commit"
rm -f "$DEMO_DIR/crash.marker"
set +e
timeout 120 env "${consumer_env[@]}" INBOX_CRASH_POINT=after_db_commit INBOX_CRASH_EVENT_KEY=order-3-paid \
  INBOX_CRASH_MARKER="$DEMO_DIR/crash.marker" "$CONSUMER" 2>"$DEMO_DIR/consumer1.log"
status=$?
set -e
echo "consumer exited with status $status (137: the crash)"
sql -t fulfilment_demo -e "SELECT event_key, COUNT(*) AS coupons FROM coupons GROUP BY event_key ORDER BY event_key"

step "fulfilment consumer, run 2: Kafka redelivers what was not committed; the inbox recognises order-3-paid"
env "${consumer_env[@]}" "$CONSUMER" > "$DEMO_DIR/consumer2.out" 2>"$DEMO_DIR/consumer2.log" &
consumer_pid=$!
six() { [ "$(coupons)" -ge 6 ]; }
wait_for 90 "six coupons" six || { cat "$DEMO_DIR/consumer2.log"; die "the consumer did not grant the coupons"; }
has_outcome() { grep -q "^OUTCOME .* order-3-paid " "$DEMO_DIR/consumer2.out"; }
wait_for 30 "the consumer's outcome for order-3-paid" has_outcome || true
grep '^OUTCOME' "$DEMO_DIR/consumer2.out"

step "a duplicate delivery: order-5-paid's record produced again by hand (key, value and headers unchanged)"
record=$(kcat -C -b "127.0.0.1:$KAFKA_PORT" -t "$TOPIC" -o beginning -e -q -f '%k\t%s\t%h\n' 2>/dev/null | grep 'event_key=order-5-paid' | head -1)
key=$(printf '%s' "$record" | cut -f1)
value=$(printf '%s' "$record" | cut -f2)
printf '%s\t%s\n' "$key" "$value" | kcat -P -b "127.0.0.1:$KAFKA_PORT" -t "$TOPIC" -K '\t' \
  -H "event_key=order-5-paid" -H "aggregate_type=order" -H "event_type=OrderPaid"
dup() { [ "$(grep -c "^OUTCOME duplicate order-5-paid" "$DEMO_DIR/consumer2.out")" -ge 1 ]; }
wait_for 60 "the duplicate to be recognised" dup || { cat "$DEMO_DIR/consumer2.log"; die "the duplicate was not seen"; }
grep '^OUTCOME duplicate order-5-paid' "$DEMO_DIR/consumer2.out"

step "coupons per order (one each: the crash and the duplicate granted nothing twice) and the inbox"
sql -t fulfilment_demo -e "SELECT event_key, COUNT(*) AS coupons FROM coupons GROUP BY event_key ORDER BY event_key"
sql -t fulfilment_demo -e "SELECT consumer, event_key, topic, kafka_partition, kafka_offset, processed_at FROM outbox_inbox ORDER BY event_key"
total=$(coupons)
[ "$total" = 6 ] || die "expected 6 coupons, found $total"

step "stopping the consumer (SIGTERM: commit offsets, leave the group) and the relay"
kill -TERM "$consumer_pid"; wait "$consumer_pid" && echo "consumer exited with code 0"
consumer_pid=
kill -TERM "$relay_pid"; wait "$relay_pid" && echo "relay exited with code 0"
trap - EXIT
demo_services_down
step "done"
