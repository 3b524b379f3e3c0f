#!/usr/bin/env python3
"""Read paystream's state topic in Avro, through a Confluent-API Schema Registry.

The sink writes Avro with `paystream sink --state-format avro --schema-registry-url URL`:
each value is in the Confluent wire format (magic byte 0, the schema's registry id, Avro
binary of schemas/payment-state.v1.avsc). confluent-kafka's AvroDeserializer fetches the
writer's schema by that id, so this consumer needs no copy of the schema.

    pip install -r examples/python/requirements-avro.txt
    python examples/python/avro_consumer.py --brokers 127.0.0.1:9092 \
        --registry http://127.0.0.1:8081 --group my-team

It reads with isolation.level=read_committed, commits offsets only after handling, and drops
an event whose version is at or below the payment's last one handled (kept in memory here; a
real consumer stores it with its effect). Prints one JSON line per transition handled.
"""

import argparse
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--brokers", default="127.0.0.1:9092")
    p.add_argument("--registry", required=True, help="Schema Registry URL (Confluent API)")
    p.add_argument("--registry-auth", default="", help="USER:PASSWORD for HTTP basic auth")
    p.add_argument("--topic", default="paystream.payments.state.v1")
    p.add_argument("--group", required=True)
    p.add_argument("--max", type=int, default=0, help="stop after this many events handled (0: never)")
    p.add_argument("--idle-exit", type=float, default=0, help="stop after this many seconds without a record (0: never)")
    args = p.parse_args()

    conf = {"url": args.registry}
    if args.registry_auth:
        conf["basic.auth.user.info"] = args.registry_auth
    deserialize = AvroDeserializer(SchemaRegistryClient(conf))

    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": args.group,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([args.topic])
    last_version: dict[str, int] = {}
    handled = 0
    idle_since = time.monotonic()
    try:
        while not args.max or handled < args.max:
            msg = consumer.poll(0.5)
            if msg is None:
                if args.idle_exit and time.monotonic() - idle_since > args.idle_exit:
                    break
                continue
            if msg.error():
                raise KafkaException(msg.error())
            idle_since = time.monotonic()
            ev = deserialize(msg.value(), SerializationContext(msg.topic(), MessageField.VALUE, msg.headers()))
            key = msg.key().decode()
            if ev["version"] > last_version.get(key, 0):
                last_version[key] = ev["version"]
                handled += 1
                headers = {k: v.decode() for k, v in (msg.headers() or [])}
                print(json.dumps({
                    "event_id": ev["event_id"],
                    "header_event_id": headers.get("event-id"),
                    "content_type": headers.get("content-type"),
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "payment_key": ev["payment_key"],
                    "version": ev["version"],
                    "status": ev["status"],
                    "previous_status": ev["previous_status"],
                    "kind": ev["kind"],
                    "amount_minor": ev["amount_minor"],
                    "currency": ev["currency"],
                    "refund_id": ev["refund_id"],
                    "payment_amount_minor": ev["payment"]["amount_minor"],
                    "recorded_at": ev["recorded_at"].isoformat(),
                }), flush=True)
            consumer.commit(message=msg, asynchronous=False)
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
