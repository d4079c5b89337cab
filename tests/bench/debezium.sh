#!/usr/bin/env bash
# Resolves Debezium embedded 3.x (engine, connector, outbox event router) and its dependencies
# from Maven Central into $OUTBOX_SERVICES_DIR/debezium-libs-<version>, for the benchmark's
# Debezium runner (tests/bench/debezium/Runner.java). Prefers the MariaDB connector
# (io.debezium:debezium-connector-mariadb); falls back to the MySQL connector when the MariaDB one
# cannot be resolved. Prints the jars folder; writes the connector class to <folder>/.connector-class.
#   tests/bench/debezium.sh
source "$(dirname "${BASH_SOURCE[0]}")/../services/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="${DEBEZIUM_VERSION:-3.6.1.Final}"
LIBS="$SERVICES_DIR/debezium-libs-$VERSION"
if [ ! -f "$LIBS/.complete" ]; then
  command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
  command -v javac >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless
  command -v mvn >/dev/null 2>&1 || apt_install maven
  rm -rf "$LIBS"; mkdir -p "$LIBS"
  for connector in debezium-connector-mariadb:io.debezium.connector.mariadb.MariaDbConnector \
                   debezium-connector-mysql:io.debezium.connector.mysql.MySqlConnector; do
    artifact="${connector%%:*}"
    log "resolving io.debezium:$artifact:$VERSION (+ debezium-embedded) from Maven Central into $LIBS"
    if mvn -q -B -f "$HERE/debezium/pom.xml" -Ddebezium.version="$VERSION" -Ddebezium.connector="$artifact" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS" \
        >"$SERVICES_DIR/debezium-maven.log" 2>&1; then
      echo "${connector#*:}" > "$LIBS/.connector-class"
      touch "$LIBS/.complete"
      break
    fi
    log "io.debezium:$artifact:$VERSION did not resolve (see $SERVICES_DIR/debezium-maven.log)"
  done
  [ -f "$LIBS/.complete" ] || die "Maven could not resolve Debezium $VERSION, see $SERVICES_DIR/debezium-maven.log"
fi
echo "$LIBS"
