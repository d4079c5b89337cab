# Shared by the demo scripts (tests/demo/*.sh). Sourced, not run: defines ROOT, DEMO_DIR
# ($SERVICES_DIR/<name>), sql (the mariadb client on MARIADB_PORT), step (a heading), and
# `demo_services_up` (MariaDB 10.11 and Kafka, remembering which it started in
# started_services so `demo_services_down` stops only those).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tests/services/common.sh"
sql() { mariadb --protocol=TCP -h127.0.0.1 -P"$MARIADB_PORT" -uroot "$@"; }
step() { printf '\n== %s\n' "$*"; }
demo_dir() { DEMO_DIR="$SERVICES_DIR/$1"; mkdir -p "$DEMO_DIR"; }
started_services=()
demo_services_up() {
  "$ROOT/tests/services/mariadb.sh" status >/dev/null 2>&1 || started_services+=(mariadb)
  "$ROOT/tests/services/kafka.sh" status >/dev/null 2>&1 || started_services+=(kafka)
  step "services (MariaDB with binlog ROW, Apache Kafka KRaft)"
  "$ROOT/tests/services/mariadb.sh" up
  "$ROOT/tests/services/kafka.sh" up
}
demo_services_down() {
  local s
  for s in "${started_services[@]}"; do "$ROOT/tests/services/$s.sh" down; done
}
