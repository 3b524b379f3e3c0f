#!/bin/bash
# Runs a Kafka main class with the image's jars; tool logging (warnings) to stderr.
# shellcheck disable=SC2086
exec java ${KAFKA_TOOLS_HEAP_OPTS:--Xmx256m} -Djava.awt.headless=true \
  -Dlog4j2.configurationFile=/opt/kafka/config/tools-log4j2.xml -cp '/opt/kafka/libs/*' "$@"
