#!/usr/bin/env bash
# Resolves Debezium embedded 3.x (engine, connector, outbox event router) and its dependencies
# from Maven Central for the benchmark's Debezium runner (tests/bench/debezium/Runner.java), and
# prints the jars folder of the connector to use on SERVER (names as tests/services/server.sh
# takes them; default mariadb10):
#   mysql8               io.debezium:debezium-connector-mysql (MySQL 8.0 is a server it supports)
#   mariadb10, mariadb11 io.debezium:debezium-connector-mariadb when Maven resolves it, else the
#                        MySQL connector (tests/bench/bench.sh then has MariaDB report a MySQL
#                        version for the run)
# Each connector has its own folder, $OUTBOX_SERVICES_DIR/debezium-libs-<version>-<mysql|mariadb>,
# with its connector class in <folder>/.connector-class. When Maven reports the MariaDB connector
# missing, that is remembered in debezium-libs-<version>-mariadb.unavailable (delete it to try
# again); other Maven failures are tried again on the next run.
#   tests/bench/debezium.sh [SERVER]
source "$(dirname "${BASH_SOURCE[0]}")/../services/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="${DEBEZIUM_VERSION:-3.6.1.Final}"
SERVER="${1:-mariadb10}"

# resolve NAME CLASS: io.debezium:debezium-connector-NAME into debezium-libs-VERSION-NAME (once);
# prints the folder, fails when Maven cannot resolve it.
resolve() {
  local name="$1" class="$2" libs="$SERVICES_DIR/debezium-libs-$VERSION-$1"
  local artifact="debezium-connector-$name" mvnlog="$SERVICES_DIR/debezium-maven-$name.log"
  if [ ! -f "$libs/.complete" ]; then
    [ ! -f "$libs.unavailable" ] || return 1
    command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
    command -v javac >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless
    command -v mvn >/dev/null 2>&1 || apt_install maven
    rm -rf "$libs"; mkdir -p "$libs"
    log "resolving io.debezium:$artifact:$VERSION (+ debezium-embedded) from Maven Central into $libs"
    if ! mvn -q -B -f "$HERE/debezium/pom.xml" -Ddebezium.version="$VERSION" -Ddebezium.connector="$artifact" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs" >"$mvnlog" 2>&1; then
      log "io.debezium:$artifact:$VERSION did not resolve (see $mvnlog)"
      rm -rf "$libs"
      ! grep -q "Could not find artifact\|was not found in" "$mvnlog" || touch "$libs.unavailable"
      return 1
    fi
    echo "$class" > "$libs/.connector-class"
    touch "$libs/.complete"
  fi
  printf '%s\n' "$libs"
}

resolve_mysql() { resolve mysql io.debezium.connector.mysql.MySqlConnector; }
case "$SERVER" in
  mysql8) resolve_mysql ;;
  mariadb10|mariadb11) resolve mariadb io.debezium.connector.mariadb.MariaDbConnector || resolve_mysql ;;
  *) die "usage: $0 [mariadb10|mariadb11|mysql8]" ;;
esac || die "Maven could not resolve Debezium $VERSION's connector for $SERVER, see $SERVICES_DIR/debezium-maven-*.log"
