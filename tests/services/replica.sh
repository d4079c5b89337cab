#!/usr/bin/env bash
# Starts or stops a SECOND private server of the same flavor that replicates, by GTID, from the
# primary started by `server.sh FLAVOR up`. Used by the GTID failover tests (tests/failover.rs).
# Idempotent: `up` on a healthy replica only checks it.
#   tests/services/replica.sh mariadb10|mariadb11|mysql8 up|down|status|port
#
# Port: $REPLICA_PORT, default the primary's port + 1 (3307, 3317, 3327). Data:
# $SERVICES_DIR/replica/<flavor>. The replica:
#   * server_id=2, log_bin with replica updates logged (log_slave_updates / log_replica_updates):
#     a relay can follow it like the primary;
#   * replicates only the databases matching $REPLICA_WILD_DO_TABLE (default `failover_%.%`, the
#     failover tests' databases): the primary is shared by tests that create and drop their
#     databases concurrently, and a replica that started in the middle of that would stop at the
#     first write to a database it never saw created. Everything else (the relays' state
#     databases on either server among it) stays local to its server;
#   * starts from the primary's CURRENT GTID state: old history is never replayed. Create a
#     test's database on the primary after `up`; it replicates;
#   * MariaDB: gtid_domain_id=2, so LOCAL writes on the replica (the relay's checkpoint row) get
#     GTIDs 2-2-N and never collide with the primary's domain 0 under gtid_strict_mode;
#     replication by MASTER_USE_GTID=slave_pos from @@gtid_binlog_pos.
#   * MySQL: GTID auto-positioning (SOURCE_AUTO_POSITION=1) after gtid_purged is set to the
#     primary's @@gtid_executed; local writes carry the replica's own server_uuid.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FLAVOR="${1:-}"
ACTION="${2:-}"
PRIMARY_PORT="$("$HERE/server.sh" "$FLAVOR" port)" || exit 2
REPLICA_PORT="${REPLICA_PORT:-$((PRIMARY_PORT + 1))}"
REPLICA_WILD_DO_TABLE="${REPLICA_WILD_DO_TABLE:-${MARIADB_REPLICA_WILD_DO_TABLE:-failover_%.%}}"
REPLICA_DIR="$SERVICES_DIR/replica"

# Every client call is bounded (connect 10 s, the whole call 60 s): a call that never returns
# would otherwise hang the script and the failover tests waiting on it.
primary() { timeout 60 mariadb --connect-timeout=10 --protocol=TCP -h127.0.0.1 -P"$PRIMARY_PORT" -uroot -N -B "$@"; }
replica() { timeout 60 mariadb --connect-timeout=10 --protocol=TCP -h127.0.0.1 -P"$REPLICA_PORT" -uroot -N -B "$@"; }

# The replica's server.sh: same flavor, its own port, data folder and settings.
replica_server() {
  local port_var; port_var="$(case "$FLAVOR" in mariadb10) echo MARIADB_PORT ;; mariadb11) echo MARIADB11_PORT ;; mysql8) echo MYSQL8_PORT ;; esac)"
  local extra
  if [ "$FLAVOR" = mysql8 ]; then
    extra="log_replica_updates=ON
relay_log=$REPLICA_DIR/$FLAVOR-relay-bin
skip_replica_start=ON
replicate_wild_do_table=$REPLICA_WILD_DO_TABLE"
  else
    extra="gtid_domain_id=2
gtid_strict_mode=ON
log_slave_updates=ON
relay_log=$REPLICA_DIR/$FLAVOR-relay-bin
skip_slave_start=ON
replicate_wild_do_table=$REPLICA_WILD_DO_TABLE"
  fi
  env "$port_var=$REPLICA_PORT" OUTBOX_SERVICES_DIR="$REPLICA_DIR" SERVER_ID=2 \
    SERVER_EXTRA_CNF="$extra" "$HERE/server.sh" "$FLAVOR" "$@"
}

# Prints "IO SQL SOURCE_PORT ERRORS" from SHOW SLAVE STATUS / SHOW REPLICA STATUS.
replication_status() {
  local stmt='SHOW SLAVE STATUS'
  [ "$FLAVOR" = mysql8 ] && stmt='SHOW REPLICA STATUS'
  timeout 30 mariadb --connect-timeout=10 --protocol=TCP -h127.0.0.1 -P"$REPLICA_PORT" -uroot -E -e "$stmt" 2>/dev/null \
    | awk -F': ' '
        /^ *(Slave|Replica)_IO_Running:/ {io=$2}
        /^ *(Slave|Replica)_SQL_Running:/ {sql=$2}
        /^ *(Master|Source)_Port:/ {port=$2}
        /^ *Last_Error:/ {err=$2}
        /^ *Last_IO_Error:/ {ioerr=$2}
        END {printf "%s %s %s %s%s\n", io, sql, port, err, ioerr}'
}

healthy() {
  local s; s="$(replication_status)"
  set -- $s
  [ "${1:-}" = "Yes" ] && [ "${2:-}" = "Yes" ] && [ "${3:-}" = "$PRIMARY_PORT" ]
}

# Points the replica at the primary's current GTID state and starts replication.
seed() {
  if [ "$FLAVOR" = mysql8 ]; then
    local executed
    executed="$(primary -e 'SELECT @@GLOBAL.gtid_executed' | tr -d '\n')" || die "cannot query the primary on 127.0.0.1:$PRIMARY_PORT (is server.sh $FLAVOR up?)"
    log "replica: replicating from 127.0.0.1:$PRIMARY_PORT after GTID set '${executed}' (tables ${REPLICA_WILD_DO_TABLE})"
    # RESET MASTER clears the replica's own GTID history so gtid_purged can be set.
    replica -e "STOP REPLICA; RESET REPLICA ALL; RESET MASTER;
      SET GLOBAL gtid_purged = '${executed}';
      CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', SOURCE_PORT=${PRIMARY_PORT},
        SOURCE_USER='root', SOURCE_PASSWORD='', SOURCE_AUTO_POSITION=1, SOURCE_CONNECT_RETRY=1,
        SOURCE_HEARTBEAT_PERIOD=1, GET_SOURCE_PUBLIC_KEY=1;
      START REPLICA;" || die "configuring replication failed"
  else
    local pos
    pos="$(primary -e 'SELECT @@GLOBAL.gtid_binlog_pos')" || die "cannot query the primary on 127.0.0.1:$PRIMARY_PORT (is server.sh $FLAVOR up?)"
    log "replica: replicating from 127.0.0.1:$PRIMARY_PORT starting after GTID position '${pos}' (tables ${REPLICA_WILD_DO_TABLE})"
    # RESET MASTER: the replica's own binlog history from an earlier run could hold domain-0 GTIDs
    # ahead of a primary that was re-created since, which gtid_strict_mode would refuse.
    # MASTER_SSL_VERIFY_SERVER_CERT=0: MariaDB 11.4 connects to its primary with TLS and verifies
    # the certificate by default, and the primary's is self-signed (generated at start); a
    # self-signed certificate is only accepted for users with a password, and root has none here.
    # Loopback only; 10.11 does not verify by default anyway.
    replica -e "STOP SLAVE; RESET SLAVE ALL; RESET MASTER;
      SET GLOBAL gtid_slave_pos = '${pos}';
      CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=${PRIMARY_PORT}, MASTER_USER='root',
        MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1, MASTER_HEARTBEAT_PERIOD=1,
        MASTER_SSL_VERIFY_SERVER_CERT=0;
      START SLAVE;" || die "configuring replication failed"
  fi
}

up() {
  if replica_server status >/dev/null 2>&1 && healthy; then
    log "$FLAVOR replica already running on 127.0.0.1:$REPLICA_PORT, replicating from :$PRIMARY_PORT"
    return 0
  fi
  primary -e 'SELECT 1' >/dev/null 2>&1 || die "the primary on 127.0.0.1:$PRIMARY_PORT is not reachable: run tests/services/server.sh $FLAVOR up first"
  replica_server up
  seed
  wait_for 60 "replication from :$PRIMARY_PORT to :$REPLICA_PORT" healthy \
    || die "replication did not start: $(replication_status); see $REPLICA_DIR/*/*.log"
}

down() {
  if replica_server status >/dev/null 2>&1; then
    replica -e 'STOP SLAVE' >/dev/null 2>&1 || replica -e 'STOP REPLICA' >/dev/null 2>&1 || true
  fi
  replica_server down
}

case "$ACTION" in
  up) up ;;
  down) down ;;
  status) replica_server status >/dev/null && healthy ;;
  port) echo "$REPLICA_PORT" ;;
  *) echo "usage: $0 mariadb10|mariadb11|mysql8 up|down|status|port" >&2; exit 2 ;;
esac
