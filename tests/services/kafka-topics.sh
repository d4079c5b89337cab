#!/usr/bin/env bash
# Kafka's own kafka-topics.sh, for the broker tests/services/kafka.sh runs: that script fetches
# Kafka as jars from Maven Central (no bin/ folder), so this runs the same tool
# (org.apache.kafka.tools.TopicCommand) from those jars with the arguments given, e.g.
#   tests/services/kafka-topics.sh --bootstrap-server 127.0.0.1:9092 --create --topic shop.Order
# With an installed Kafka, its bin/kafka-topics.sh takes the same arguments.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LIBS="${KAFKA_LIBS_DIR:-$SERVICES_DIR/kafka-libs-$KAFKA_VERSION}"
[ -f "$LIBS/.complete" ] || die "no Kafka jars in $LIBS: start Kafka first (make services-up, or tests/services/kafka.sh up)"
exec java -Xmx128m -cp "$LIBS/*" org.apache.kafka.tools.TopicCommand "$@"
