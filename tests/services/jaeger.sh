#!/usr/bin/env bash
# Starts or stops Jaeger v2 (an OpenTelemetry Collector build with Jaeger's in-memory storage and
# query API): the OTLP receiver the relay's spans are tested against (tests/otel_e2e.rs).
#   tests/services/jaeger.sh up|down|status|port
# Built from the Go module proxy with the machine's Go (`go build` of the tool module in
# tests/services/jaeger/, whose go.mod/go.sum pin github.com/jaegertracing/jaeger v1.76.0) into
# $OUTBOX_SERVICES_DIR/jaeger/jaeger; the first build takes minutes (Go's build cache keeps it).
# Listens on 127.0.0.1 only: OTLP/HTTP $JAEGER_OTLP_HTTP_PORT (4318), OTLP/gRPC
# $JAEGER_OTLP_GRPC_PORT (4317), query HTTP API and UI $JAEGER_QUERY_PORT (16686; the API:
# /api/traces/<trace id>, /api/v3/traces/<trace id>), query gRPC $JAEGER_QUERY_GRPC_PORT (16685).
# Spans are kept in memory (lost at `down`). `port` prints the OTLP/HTTP port. Idempotent.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="$SERVICES_DIR/jaeger"
BIN="$DIR/jaeger"
CONFIG="$DIR/config.yaml"
PIDFILE="$DIR/jaeger.pid"
LOG="$DIR/jaeger.log"

ready() {
  port_in_use "$JAEGER_OTLP_HTTP_PORT" &&
    curl -fsS "http://127.0.0.1:$JAEGER_QUERY_PORT/api/services" >/dev/null 2>&1
}

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

build() {
  # Rebuilt when the pinned module changes (go.sum's hash is kept beside the binary).
  local want; want="$(sha256sum "$HERE/jaeger/go.sum" | cut -d' ' -f1)"
  [ -x "$BIN" ] && [ "$(cat "$DIR/.go-sum" 2>/dev/null)" = "$want" ] && return 0
  command -v go >/dev/null 2>&1 || apt_install golang-go
  log "building Jaeger (github.com/jaegertracing/jaeger/cmd/jaeger, see $HERE/jaeger/go.mod) into $BIN; the first build takes several minutes"
  (cd "$HERE/jaeger" && go build -buildvcs=false -o "$BIN.tmp" github.com/jaegertracing/jaeger/cmd/jaeger) \
    >"$DIR/build.log" 2>&1 || die "building Jaeger failed, see $DIR/build.log"
  mv "$BIN.tmp" "$BIN"
  echo "$want" >"$DIR/.go-sum"
}

up() {
  command -v curl >/dev/null 2>&1 || apt_install curl
  if running && ready; then
    log "Jaeger already running (OTLP/HTTP 127.0.0.1:$JAEGER_OTLP_HTTP_PORT, query 127.0.0.1:$JAEGER_QUERY_PORT; log: $LOG)"
    return 0
  fi
  mkdir -p "$DIR"
  build
  if ! running; then
    refuse_foreign_port "Jaeger OTLP/HTTP" "$JAEGER_OTLP_HTTP_PORT" JAEGER_OTLP_HTTP_PORT
    refuse_foreign_port "Jaeger OTLP/gRPC" "$JAEGER_OTLP_GRPC_PORT" JAEGER_OTLP_GRPC_PORT
    refuse_foreign_port "Jaeger query" "$JAEGER_QUERY_PORT" JAEGER_QUERY_PORT
    refuse_foreign_port "Jaeger query gRPC" "$JAEGER_QUERY_GRPC_PORT" JAEGER_QUERY_GRPC_PORT
    cat >"$CONFIG" <<YAML
# Written by tests/services/jaeger.sh: OTLP in, in-memory storage, query API; loopback only.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info

extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:$JAEGER_QUERY_PORT
    grpc:
      endpoint: 127.0.0.1:$JAEGER_QUERY_GRPC_PORT

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$JAEGER_OTLP_GRPC_PORT
      http:
        endpoint: 127.0.0.1:$JAEGER_OTLP_HTTP_PORT

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
YAML
    log "starting Jaeger (OTLP/HTTP 127.0.0.1:$JAEGER_OTLP_HTTP_PORT, query 127.0.0.1:$JAEGER_QUERY_PORT; log: $LOG)"
    setsid "$BIN" --config "file:$CONFIG" >>"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
  fi
  wait_for 60 "Jaeger on 127.0.0.1:$JAEGER_OTLP_HTTP_PORT" ready || die "Jaeger did not become ready in 60 s, see $LOG"
}

down() {
  if running; then
    local pid; pid="$(cat "$PIDFILE")"
    stop_pid Jaeger "$pid"
    [ "$(cat "$PIDFILE" 2>/dev/null)" != "$pid" ] || rm -f "$PIDFILE"
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) running && ready ;;
  port) echo "$JAEGER_OTLP_HTTP_PORT" ;;
  *) echo "usage: $0 up|down|status|port" >&2; exit 2 ;;
esac
