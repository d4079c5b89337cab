#!/usr/bin/env bash
# Stops everything the service scripts and the tests started: the three servers, their GTID
# replicas, Kafka, and the private servers tests/security_e2e.rs starts itself (TLS servers on
# 3366+, SASL Kafka on 9492-9494, data in .services/private/) when a killed test run left them.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for server in mariadb10 mariadb11 mysql8; do "$HERE/replica.sh" "$server" down || true; done
"$HERE/jaeger.sh" down || true
"$HERE/kafka.sh" down || true
for server in mariadb10 mariadb11 mysql8; do "$HERE/server.sh" "$server" down || true; done
for private in "$SERVICES_DIR"/private/*/; do
  [ -d "$private" ] || continue
  for server in mariadb10 mariadb11 mysql8; do
    OUTBOX_SERVICES_DIR="${private%/}" "$HERE/server.sh" "$server" down || true
  done
  OUTBOX_SERVICES_DIR="${private%/}" "$HERE/kafka.sh" down || true
done
