#!/usr/bin/env bash
# Starts every server in OUTBOX_TEST_SERVERS, Kafka and Jaeger (what `make test` needs); idempotent.
# OUTBOX_JAEGER=off leaves Jaeger out (the fault matrix needs none, and its private services folder
# must not start a second Jaeger on the default ports).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
IFS=',' read -r -a servers <<<"$OUTBOX_TEST_SERVERS"
for server in "${servers[@]}"; do
  server="${server// /}"
  [ -n "$server" ] && "$HERE/server.sh" "$server" up
done
"$HERE/kafka.sh" up
[ "${OUTBOX_JAEGER:-on}" = off ] || "$HERE/jaeger.sh" up
