# Sourced by tests/bench/bench.sh and budget.sh: the services' settings, the repository as the
# working folder, BENCH_SERVERS (default mariadb10,mysql8) checked into the array `servers`,
# the plots' font, the relay and the bench harness built in release, and wait_quiet (below).
source "$(dirname "${BASH_SOURCE[0]}")/../services/common.sh"
cd "$REPO_ROOT"
BENCH_SERVERS="${BENCH_SERVERS:-mariadb10,mysql8}"
IFS=',' read -r -a servers <<<"${BENCH_SERVERS// /}"
for server in "${servers[@]}"; do
  case "$server" in mariadb10|mariadb11|mysql8) ;; *) die "BENCH_SERVERS: unknown server '$server' (mariadb10, mariadb11, mysql8)" ;; esac
done
apt_install fonts-dejavu-core
log "building outbox-relay and the bench harness (release)"
${CARGO:-cargo} build --release -p outbox-relay -p outbox-relay-bench

# wait_quiet <server>: waits (up to BENCH_QUIET_WAIT seconds, default 600) for the machine's
# 1-minute load to drop below BENCH_MAX_LOAD (1.0), so each server's runs start on a quiet
# machine rather than in the wake of the previous server's runs (whose load the average keeps
# for minutes), then logs the load the runs start at; says so when it is still above.
wait_quiet() {
  local max="${BENCH_MAX_LOAD:-1.0}" deadline=$((SECONDS + ${BENCH_QUIET_WAIT:-600}))
  quiet() { awk -v max="$max" '{ exit !($1 < max) }' /proc/loadavg; }
  quiet || log "$1: waiting up to ${BENCH_QUIET_WAIT:-600} s for the 1-minute load ($(cut -d' ' -f1 /proc/loadavg)) to drop below $max"
  until quiet || [ $SECONDS -ge $deadline ]; do sleep 5; done
  quiet || log "the 1-minute load is still $(cut -d' ' -f1 /proc/loadavg) (above $max): $1's runs start on a busier machine"
  log "$1: load before the run: $(cat /proc/loadavg)"
}
