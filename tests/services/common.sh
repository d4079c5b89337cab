# Shared settings for the local test services. Sourced, not run.
# Everything lives under $OUTBOX_SERVICES_DIR (default: <repo>/.services, git-ignored).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SERVICES_DIR="${OUTBOX_SERVICES_DIR:-$REPO_ROOT/.services}"
MARIADB_PORT="${MARIADB_PORT:-3306}"
MARIADB11_PORT="${MARIADB11_PORT:-3316}"
MYSQL8_PORT="${MYSQL8_PORT:-3326}"
MARIADB11_VERSION="${MARIADB11_VERSION:-11.4.5}"
MYSQL8_VERSION=8.0.31
MYSQL8_ARTIFACT_VERSION=1.0.2
# The servers `make test` runs the end-to-end suites against (names as tests/services/server.sh).
OUTBOX_TEST_SERVERS="${OUTBOX_TEST_SERVERS:-mariadb10,mariadb11,mysql8}"
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
# Jaeger v2 (tests/services/jaeger.sh): OTLP receivers and the query API, all on loopback.
JAEGER_OTLP_HTTP_PORT="${JAEGER_OTLP_HTTP_PORT:-4318}"
JAEGER_OTLP_GRPC_PORT="${JAEGER_OTLP_GRPC_PORT:-4317}"
JAEGER_QUERY_PORT="${JAEGER_QUERY_PORT:-16686}"
JAEGER_QUERY_GRPC_PORT="${JAEGER_QUERY_GRPC_PORT:-16685}"
# Unpacked server software (Maven Central artifacts), shared by every services folder.
SERVERS_DIR="${OUTBOX_SERVERS_DIR:-$REPO_ROOT/.services/servers}"
mkdir -p "$SERVICES_DIR"

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

# apt_install PKG...: installs Debian packages that are missing (needs root or sudo).
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing ${missing[*]} (apt-get)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND once a second until it succeeds.
wait_for() {
  local timeout="$1" what="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 1
  done
  log "$what is ready"
}

# port_in_use PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# refuse_foreign_port NAME PORT VAR: stop before starting NAME when another process already
# listens on PORT, instead of silently using (or clobbering) someone else's server.
refuse_foreign_port() {
  if port_in_use "$2"; then
    die "$1: 127.0.0.1:$2 is already in use by a process these scripts did not start. Stop it, or choose free ports with $3=... (and OUTBOX_SERVICES_DIR for a separate data folder)"
  fi
}

# stop_pid NAME PID: SIGTERM, up to 60 s for a clean exit, then SIGKILL.
stop_pid() {
  log "stopping $1 (pid $2)"
  kill "$2" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$2" 2>/dev/null || break; sleep 1; done
  kill -9 "$2" 2>/dev/null || true
}
