#!/usr/bin/env bash
# Starts or stops a single-node Apache Kafka 4.x broker in KRaft mode (combined broker+controller)
# on 127.0.0.1:$KAFKA_PORT, from the official org.apache.kafka artifacts on Maven Central, run with
# the machine's Java 17. Idempotent.
#   tests/services/kafka.sh up|down|status
# With KAFKA_SASL_SCRAM=1 the broker also has a SASL_PLAINTEXT listener on 127.0.0.1:$KAFKA_SASL_PORT
# (default KAFKA_PORT+2) that accepts SCRAM-SHA-512 only, and user $KAFKA_SASL_USER (default
# relay) with password $KAFKA_SASL_PASSWORD (default relay-secret) is created when the storage is
# formatted (kafka-storage format --add-scram, KIP-900); the PLAINTEXT listener stays for the
# broker itself and for tests' consumers. tests/security_e2e.rs starts such a private broker.
# KAFKA_AUTO_CREATE=false: the broker creates no topics (auto.create.topics.enable=false).
# KAFKA_DENY_TOPIC_PREFIX=<prefix> (with KAFKA_SASL_SCRAM=1): the broker runs the KRaft
# StandardAuthorizer (super user User:ANONYMOUS, the PLAINTEXT and controller listeners;
# allow.everyone.if.no.acl.found=true) and denies $KAFKA_SASL_USER every operation on topics
# starting with <prefix> (an ACL added by kafka-acls' AclCommand once the broker is up).
# tests/refusals_e2e.rs starts such a private broker.
#   tests/services/kafka.sh acl <kafka-acls options>   (such a broker, running): runs kafka-acls'
# AclCommand against it as the super user, e.g. to deny one topic's WRITE but not its DESCRIBE
# and lift that later (a topic refused only when produced to).
# KAFKA_EXTRA_PROPS: broker properties appended to server.properties, one per line (a private
# broker with short transaction timeouts: tests/eos_e2e.rs).
# KAFKA_ADVERTISED_PORT: the port the PLAINTEXT listener advertises (default KAFKA_PORT), so that
# clients reach the broker through a TCP proxy listening there (the EndTxn fault).
# KAFKA_LIBS_DIR: where the Kafka jars are (default $OUTBOX_SERVICES_DIR/kafka-libs-VERSION).
# KAFKA_DIR: the broker's folder (config, data, logs; default $OUTBOX_SERVICES_DIR/kafka), for a
# private broker beside servers of the default folder (the fault matrix test's broker).
# KAFKA_GC_LOG=1: the broker's JVM logs its garbage collections to $KAFKA_DIR/gc.log, each line
# stamped in ms since the epoch (make bench-budget counts the pauses within each run).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${KAFKA_DIR:-$SERVICES_DIR/kafka}"
LIBS="${KAFKA_LIBS_DIR:-$SERVICES_DIR/kafka-libs-$KAFKA_VERSION}"
SASL="${KAFKA_SASL_SCRAM:-0}"
SASL_PORT="${KAFKA_SASL_PORT:-$((KAFKA_PORT + 2))}"
SASL_USER="${KAFKA_SASL_USER:-relay}"
SASL_PASSWORD="${KAFKA_SASL_PASSWORD:-relay-secret}"
AUTO_CREATE="${KAFKA_AUTO_CREATE:-true}"
DENY_PREFIX="${KAFKA_DENY_TOPIC_PREFIX:-}"
PROPS="$DIR/server.properties"
PIDFILE="$DIR/kafka.pid"
LOG="$DIR/kafka.log"

ready() { kcat -b "127.0.0.1:$KAFKA_PORT" -L -m 5 >/dev/null 2>&1; }

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

fetch_libs() {
  [ -f "$LIBS/.complete" ] && return 0
  command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
  command -v mvn >/dev/null 2>&1 || apt_install maven
  log "resolving org.apache.kafka:kafka_2.13:$KAFKA_VERSION from Maven Central into $LIBS"
  rm -rf "$LIBS"; mkdir -p "$LIBS"
  mvn -q -B -f "$HERE/kafka-pom.xml" -Dkafka.version="$KAFKA_VERSION" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS" \
    >"$SERVICES_DIR/kafka-maven.log" 2>&1 || die "Maven could not resolve Kafka, see $SERVICES_DIR/kafka-maven.log"
  touch "$LIBS/.complete"
}

up() {
  command -v kcat >/dev/null 2>&1 || apt_install kcat
  if running && ready; then
    log "Kafka already running on 127.0.0.1:$KAFKA_PORT (log: $LOG)"
    return 0
  fi
  fetch_libs
  if ! running; then
    refuse_foreign_port Kafka "$KAFKA_PORT" KAFKA_PORT
    refuse_foreign_port "Kafka controller" "$KAFKA_CONTROLLER_PORT" KAFKA_CONTROLLER_PORT
    [ "$SASL" != 1 ] || refuse_foreign_port "Kafka SASL listener" "$SASL_PORT" KAFKA_SASL_PORT
  fi
  mkdir -p "$DIR/data"
  local listeners="PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT"
  local advertised="PLAINTEXT://127.0.0.1:${KAFKA_ADVERTISED_PORT:-$KAFKA_PORT}"
  local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  local sasl_props="" format_args=() authorizer_props=""
  if [ -n "$DENY_PREFIX" ]; then
    [ "$SASL" = 1 ] || die "KAFKA_DENY_TOPIC_PREFIX needs KAFKA_SASL_SCRAM=1 (the denied principal is the SASL user)"
    authorizer_props="authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS
allow.everyone.if.no.acl.found=true"
  fi
  if [ "$SASL" = 1 ]; then
    listeners="$listeners,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT"
    advertised="$advertised,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT"
    protocols="$protocols,SASL_PLAINTEXT:SASL_PLAINTEXT"
    sasl_props="sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_plaintext.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
    format_args=(--add-scram "SCRAM-SHA-512=[name=\"$SASL_USER\",password=\"$SASL_PASSWORD\"]")
  fi
  cat > "$PROPS" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
$sasl_props
$authorizer_props
log.dirs=$DIR/data
num.partitions=3
auto.create.topics.enable=$AUTO_CREATE
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
background.threads=2
log.retention.hours=24
${KAFKA_EXTRA_PROPS:-}
PROPS
  cat > "$DIR/log4j2.properties" <<L4J
rootLogger.level=INFO
rootLogger.appenderRef.file.ref=FILE
appender.file.type=File
appender.file.name=FILE
appender.file.fileName=$LOG
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
logger.kafka.name=kafka
logger.kafka.level=INFO
logger.state.name=state.change.logger
logger.state.level=WARN
L4J
  local java_opts=(-Xms256m -Xmx768m -XX:+UseG1GC -XX:ParallelGCThreads=1 -XX:ConcGCThreads=1
    -XX:CICompilerCount=2 -Djava.awt.headless=true "-Dlog4j2.configurationFile=$DIR/log4j2.properties")
  [ "${KAFKA_GC_LOG:-0}" != 1 ] || java_opts+=("-Xlog:gc:file=$DIR/gc.log:timemillis")
  if [ ! -f "$DIR/data/meta.properties" ]; then
    local cluster_id
    cluster_id="$(java -cp "$LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)"
    log "formatting KRaft storage in $DIR/data (cluster $cluster_id)"
    java "${java_opts[@]}" -cp "$LIBS/*" kafka.tools.StorageTool format -t "$cluster_id" -c "$PROPS" "${format_args[@]}" \
      >"$DIR/format.log" 2>&1 || die "formatting Kafka storage failed, see $DIR/format.log"
  fi
  log "starting Kafka $KAFKA_VERSION (KRaft) on 127.0.0.1:$KAFKA_PORT (log: $LOG)"
  setsid java "${java_opts[@]}" -cp "$LIBS/*" kafka.Kafka "$PROPS" >>"$DIR/stdout.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  wait_for 120 "Kafka on 127.0.0.1:$KAFKA_PORT" ready || die "Kafka did not become ready in 120 s, see $LOG and $DIR/stdout.log"
  if [ -n "$DENY_PREFIX" ]; then
    java -Xmx128m -cp "$LIBS/*" org.apache.kafka.tools.AclCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" \
      --add --deny-principal "User:$SASL_USER" --operation All --topic "$DENY_PREFIX" \
      --resource-pattern-type prefixed >"$DIR/acl.log" 2>&1 || die "adding the deny ACL failed, see $DIR/acl.log"
  fi
}

down() {
  if running; then
    local pid; pid="$(cat "$PIDFILE")"
    stop_pid Kafka "$pid"
    # Only our broker's pid file: a concurrent `up` may have written a new one meanwhile.
    [ "$(cat "$PIDFILE" 2>/dev/null)" != "$pid" ] || rm -f "$PIDFILE"
  fi
}

acl() {
  running || die "Kafka is not running in $DIR"
  java -Xmx128m -cp "$LIBS/*" org.apache.kafka.tools.AclCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" "$@" \
    >>"$DIR/acl.log" 2>&1 || die "kafka-acls $* failed, see $DIR/acl.log"
}

case "${1:-}" in
  up) up ;;
  acl) shift; acl "$@" ;;
  down) down ;;
  status) running && ready ;;
  *) echo "usage: $0 up|down|status|acl <kafka-acls options>" >&2; exit 2 ;;
esac
