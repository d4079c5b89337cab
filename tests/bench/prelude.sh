# Sourced by tests/bench/bench.sh and budget.sh: the services' settings, the repository as the
# working folder, BENCH_SERVERS (default mariadb10,mysql8) checked into the array `servers`,
# the plots' font, and the relay and the bench harness built in release.
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
