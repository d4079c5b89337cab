#!/usr/bin/env bash
# Starts or stops a private MariaDB (Debian's mariadb-server) on 127.0.0.1:$MARIADB_PORT with the
# binlog settings outbox-relay needs. Idempotent: `up` on a running server only checks it.
#   tests/services/mariadb.sh up|down|status
# With MARIADB_TLS_DIR=<folder holding ca.pem, server-cert.pem, server-key.pem> the server also
# accepts TLS (ssl_ca/ssl_cert/ssl_key); plain connections keep working unless a user is created
# REQUIRE SSL. tests/security_e2e.rs starts such a private server on its own port.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DIR="$SERVICES_DIR/mariadb"
CNF="$DIR/my.cnf"
PIDFILE="$DIR/mariadbd.pid"
LOG="$DIR/mariadbd.log"
SOCK="$DIR/mariadbd.sock"

ping() { mariadb-admin --protocol=TCP -h127.0.0.1 -P"$MARIADB_PORT" -uroot ping; }

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

up() {
  if running && ping >/dev/null 2>&1; then
    log "MariaDB already running on 127.0.0.1:$MARIADB_PORT (log: $LOG)"
    return 0
  fi
  command -v mariadbd >/dev/null 2>&1 || apt_install mariadb-server mariadb-client
  running || refuse_foreign_port MariaDB "$MARIADB_PORT" MARIADB_PORT
  mkdir -p "$DIR/data" "$DIR/binlog"
  local tls_conf=""
  if [ -n "${MARIADB_TLS_DIR:-}" ]; then
    local tls_dir; tls_dir="$(cd "$MARIADB_TLS_DIR" && pwd)" || die "MARIADB_TLS_DIR=$MARIADB_TLS_DIR is not a folder"
    for f in ca.pem server-cert.pem server-key.pem; do
      [ -r "$tls_dir/$f" ] || die "MARIADB_TLS_DIR=$tls_dir has no readable $f"
    done
    tls_conf="ssl_ca=$tls_dir/ca.pem
ssl_cert=$tls_dir/server-cert.pem
ssl_key=$tls_dir/server-key.pem"
  fi
  cat > "$CNF" <<CNF
[mariadbd]
user=root
datadir=$DIR/data
socket=$SOCK
pid-file=$PIDFILE
port=$MARIADB_PORT
bind-address=127.0.0.1
skip-name-resolve
log-error=$LOG
server_id=1
log_bin=$DIR/binlog/mariadb-bin
binlog_format=ROW
binlog_row_image=FULL
binlog_row_metadata=FULL
binlog_checksum=CRC32
expire_logs_days=2
max_connections=300
innodb_buffer_pool_size=256M
innodb_log_file_size=128M
innodb_flush_log_at_trx_commit=2
sync_binlog=0
max_allowed_packet=64M
${MARIADB_VERSION_STRING:+version=$MARIADB_VERSION_STRING}
$tls_conf
CNF
  if [ ! -d "$DIR/data/mysql" ]; then
    log "initialising MariaDB data directory in $DIR/data"
    mariadb-install-db --defaults-file="$CNF" --user=root --datadir="$DIR/data" \
      --auth-root-authentication-method=normal >"$DIR/install.log" 2>&1 \
      || die "mariadb-install-db failed, see $DIR/install.log"
  fi
  log "starting MariaDB on 127.0.0.1:$MARIADB_PORT (log: $LOG)"
  setsid mariadbd --defaults-file="$CNF" >>"$DIR/stdout.log" 2>&1 < /dev/null &
  wait_for 60 "MariaDB on 127.0.0.1:$MARIADB_PORT" ping || die "MariaDB did not become ready in 60 s, see $LOG"
}

down() {
  if running; then
    local pid; pid="$(cat "$PIDFILE")"
    log "stopping MariaDB (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) running && ping ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
