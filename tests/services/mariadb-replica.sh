#!/usr/bin/env bash
# Starts or stops a SECOND private MariaDB on 127.0.0.1:$MARIADB_REPLICA_PORT (default 3307) that
# replicates, by GTID, from the primary started by mariadb.sh (127.0.0.1:$MARIADB_PORT). Used by
# the GTID failover test (tests/failover.rs). Idempotent: `up` on a healthy replica only checks it.
#   tests/services/mariadb-replica.sh up|down|status
#
# The replica:
#   * server_id=2, gtid_domain_id=2, log_bin, log_slave_updates=ON, binlog ROW/FULL/FULL,
#     gtid_strict_mode=ON: a relay can follow it like the primary.
#   * gtid_domain_id=2 so that LOCAL writes on the replica (the relay's checkpoint row, which must
#     live on the server the relay reads) get GTIDs 2-2-N and never collide with the primary's
#     domain 0 (with gtid_strict_mode a local 0-2-N would stop replication at the primary's next
#     0-1-N: "out-of-order sequence number").
#   * replicates only the databases matching $MARIADB_REPLICA_WILD_DO_TABLE (default
#     `failover_%.%`, the failover tests' databases): the primary is shared by tests that create
#     and drop their databases concurrently, and a replica that started in the middle of that
#     would stop at the first write to a database it never saw created. Everything else (the
#     relays' state databases on either server among it) stays local to its server.
#   * starts from the primary's CURRENT GTID position (@@gtid_binlog_pos): old history is never
#     replayed. Create a test's database on the primary after `up`; it replicates.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
MARIADB_REPLICA_PORT="${MARIADB_REPLICA_PORT:-3307}"
MARIADB_REPLICA_WILD_DO_TABLE="${MARIADB_REPLICA_WILD_DO_TABLE:-failover_%.%}"
DIR="$SERVICES_DIR/mariadb-replica"
CNF="$DIR/my.cnf"
PIDFILE="$DIR/mariadbd.pid"
LOG="$DIR/mariadbd.log"
SOCK="$DIR/mariadbd.sock"

primary() { mariadb --protocol=TCP -h127.0.0.1 -P"$MARIADB_PORT" -uroot -N -B "$@"; }
replica() { mariadb --protocol=TCP -h127.0.0.1 -P"$MARIADB_REPLICA_PORT" -uroot -N -B "$@"; }
ping() { mariadb-admin --protocol=TCP -h127.0.0.1 -P"$MARIADB_REPLICA_PORT" -uroot ping; }
running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# Prints "IO SQL MASTER_PORT LAST_ERROR" from SHOW SLAVE STATUS (empty when not a replica).
slave_status() {
  mariadb --protocol=TCP -h127.0.0.1 -P"$MARIADB_REPLICA_PORT" -uroot -E -e 'SHOW SLAVE STATUS' 2>/dev/null \
    | awk -F': ' '
        /^ *Slave_IO_Running:/ {io=$2}
        /^ *Slave_SQL_Running:/ {sql=$2}
        /^ *Master_Port:/ {port=$2}
        /^ *Last_Error:/ {err=$2}
        /^ *Last_IO_Error:/ {ioerr=$2}
        END {printf "%s %s %s %s%s\n", io, sql, port, err, ioerr}'
}

healthy() {
  local s; s="$(slave_status)"
  set -- $s
  [ "${1:-}" = "Yes" ] && [ "${2:-}" = "Yes" ] && [ "${3:-}" = "$MARIADB_PORT" ]
}

# Points the replica at the primary's current GTID position and starts replication.
seed() {
  local pos
  pos="$(primary -e 'SELECT @@GLOBAL.gtid_binlog_pos')" || die "cannot query the primary on 127.0.0.1:$MARIADB_PORT (is mariadb.sh up?)"
  log "replica: replicating from 127.0.0.1:$MARIADB_PORT starting after GTID position '${pos}' (databases ${MARIADB_REPLICA_WILD_DO_TABLE})"
  # RESET MASTER: the replica's own binlog history from an earlier run could hold domain-0 GTIDs
  # ahead of a primary that was re-created since, which gtid_strict_mode would refuse.
  replica -e "STOP SLAVE; RESET SLAVE ALL; RESET MASTER;
    SET GLOBAL gtid_slave_pos = '${pos}';
    CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=${MARIADB_PORT}, MASTER_USER='root',
      MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1, MASTER_HEARTBEAT_PERIOD=1;
    START SLAVE;" || die "configuring replication failed"
}

up() {
  if running && ping >/dev/null 2>&1 && healthy; then
    log "MariaDB replica already running on 127.0.0.1:$MARIADB_REPLICA_PORT, replicating from :$MARIADB_PORT (log: $LOG)"
    return 0
  fi
  command -v mariadbd >/dev/null 2>&1 || apt_install mariadb-server mariadb-client
  primary -e 'SELECT 1' >/dev/null 2>&1 || die "the primary on 127.0.0.1:$MARIADB_PORT is not reachable: run tests/services/mariadb.sh up first"
  if ! (running && ping >/dev/null 2>&1); then
    running || refuse_foreign_port "MariaDB replica" "$MARIADB_REPLICA_PORT" MARIADB_REPLICA_PORT
    mkdir -p "$DIR/data" "$DIR/binlog"
    cat > "$CNF" <<CNF
[mariadbd]
user=root
datadir=$DIR/data
socket=$SOCK
pid-file=$PIDFILE
port=$MARIADB_REPLICA_PORT
bind-address=127.0.0.1
skip-name-resolve
log-error=$LOG
server_id=2
gtid_domain_id=2
gtid_strict_mode=ON
log_bin=$DIR/binlog/mariadb-bin
log_slave_updates=ON
relay_log=$DIR/binlog/relay-bin
skip_slave_start=ON
replicate_wild_do_table=$MARIADB_REPLICA_WILD_DO_TABLE
binlog_format=ROW
binlog_row_image=FULL
binlog_row_metadata=FULL
binlog_checksum=CRC32
expire_logs_days=2
max_connections=200
innodb_buffer_pool_size=128M
innodb_log_file_size=64M
innodb_flush_log_at_trx_commit=2
sync_binlog=0
max_allowed_packet=64M
CNF
    if [ ! -d "$DIR/data/mysql" ]; then
      log "initialising the replica's data directory in $DIR/data"
      mariadb-install-db --defaults-file="$CNF" --user=root --datadir="$DIR/data" \
        --auth-root-authentication-method=normal >"$DIR/install.log" 2>&1 \
        || die "mariadb-install-db failed, see $DIR/install.log"
    fi
    log "starting the MariaDB replica on 127.0.0.1:$MARIADB_REPLICA_PORT (log: $LOG)"
    setsid mariadbd --defaults-file="$CNF" >>"$DIR/stdout.log" 2>&1 < /dev/null &
    wait_for 60 "MariaDB replica on 127.0.0.1:$MARIADB_REPLICA_PORT" ping || die "the replica did not become ready in 60 s, see $LOG"
  fi
  seed
  wait_for 60 "replication (Slave_IO_Running=Yes, Slave_SQL_Running=Yes)" healthy \
    || die "replication did not start: $(slave_status); see $LOG"
}

down() {
  if running; then
    local pid; pid="$(cat "$PIDFILE")"
    log "stopping the MariaDB replica (pid $pid)"
    replica -e 'STOP SLAVE' >/dev/null 2>&1 || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) running && ping >/dev/null && healthy ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
