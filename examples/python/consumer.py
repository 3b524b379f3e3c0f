#!/usr/bin/env python3
"""A consumer of paystream's payment-state topic, the way docs/consumers.md says.

* reads with isolation.level=read_committed: the sink writes in Kafka
  transactions, so nothing of an aborted one is ever returned;
* parses each record as a CloudEvent (binary content mode: ce_* headers, the
  value is the data) with the CloudEvents SDK, and checks its id against the
  event-id header and the value's event_id;
* deduplicates by event id: it keeps, per payment, the last version handled
  and skips an event at or below it (a relay that re-sent, a restart before a
  commit); versions are 1, 2, 3... per payment, so a version that is not the
  last plus one is counted as out of order;
* commits offsets only after the events of a poll were handled.

It prints one line per transition and, when it stops (Ctrl-C, or with
--exit-at-end once it has read every partition to its end), a JSON summary
as its last line:

    python3 consumer.py --brokers 127.0.0.1:9092 --group my-team --exit-at-end
    2026-11-29T18:00:05Z acme:pay_123 v2 pending -> paid (capture 1050 BRL)
    {"events": 1, "payments": 1, "duplicates": 0, "out_of_order": 0, "records": 1}

Here the last version per payment lives in memory, to show the rule; a real
consumer stores it (or a unique key on event_id) in the same transaction as
its own effect. Dependencies: requirements.txt.
"""

import argparse
import json
import signal
import sys

from cloudevents.core.bindings.kafka import KafkaMessage, from_binary_event
from confluent_kafka import Consumer, KafkaError, KafkaException

CE_TYPE = "io.paystream.payment.state.v1"


class Deduper:
    """The last version handled per payment."""

    def __init__(self):
        self.last = {}

    def seen(self, ev):
        return ev["version"] <= self.last.get(ev["payment_key"], 0)

    def in_order(self, ev):
        return ev["version"] == self.last.get(ev["payment_key"], 0) + 1

    def done(self, ev):
        self.last[ev["payment_key"]] = ev["version"]


def parse(msg):
    """Returns the record's event (the CloudEvent's data), checked."""
    where = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
    headers = {k: v for k, v in (msg.headers() or [])}
    ce = from_binary_event(KafkaMessage(headers=headers, key=msg.key(), value=msg.value()))
    ev = ce.get_data()
    # Integers stay integers with json: amount_minor is in minor units.
    if not isinstance(ev, dict) or not isinstance(ev.get("version"), int):
        raise ValueError(f"record {where}: not a payment-state event")
    event_id = headers.get("event-id", b"").decode()
    if not (event_id == ev["event_id"] == ce.get_id()):
        raise ValueError(f"record {where}: event-id {event_id!r}, ce_id {ce.get_id()!r} and event_id {ev['event_id']!r} differ")
    if ce.get_type() != CE_TYPE or ce.get_subject() != ev["payment_key"]:
        raise ValueError(f"record {where}: ce_type {ce.get_type()!r}, ce_subject {ce.get_subject()!r}")
    return ev


def print_transition(ev):
    prev = ev["previous_status"] or "(new)"
    print(f"{ev['occurred_at']} {ev['payment_key']} v{ev['version']} {prev} -> {ev['status']} "
          f"({ev['kind']} {ev['amount_minor']} {ev['currency']})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--brokers", default="127.0.0.1:9092", help="Kafka seed brokers, comma-separated")
    ap.add_argument("--topic", default="paystream.payments.state.v1", help="payment-state topic")
    ap.add_argument("--group", default="paystream-example-consumer-python", help="consumer group")
    ap.add_argument("--exit-at-end", action="store_true", help="stop once every partition is read to its end")
    ap.add_argument("--quiet", action="store_true", help="print the summary only")
    args = ap.parse_args()

    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": args.group,
        # The sink writes in Kafka transactions: never see an aborted one.
        "isolation.level": "read_committed",
        # Commit after handling, never before: at least once, then dedup.
        "enable.auto.commit": False,
        # A new group starts with the oldest event kept.
        "auto.offset.reset": "earliest",
        # The end of a partition (its last stable offset) is reported.
        "enable.partition.eof": args.exit_at_end,
    })
    assigned, at_end = set(), set()

    def on_assign(c, partitions):
        assigned.update((p.topic, p.partition) for p in partitions)

    def on_revoke(c, partitions):
        for p in partitions:
            assigned.discard((p.topic, p.partition))
            at_end.discard((p.topic, p.partition))

    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))

    d = Deduper()
    stats = {"events": 0, "payments": 0, "duplicates": 0, "out_of_order": 0, "records": 0}
    try:
        while not stopping:
            handled = False
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                tp = (msg.topic(), msg.partition())
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(tp)
                        continue
                    raise KafkaException(msg.error())
                at_end.discard(tp)
                handled = True
                stats["records"] += 1
                ev = parse(msg)
                if d.seen(ev):
                    stats["duplicates"] += 1  # a redelivery: already handled
                    continue
                if not d.in_order(ev):
                    stats["out_of_order"] += 1
                    print(f"out of order: {ev['event_id']} after version {d.last.get(ev['payment_key'], 0)}", file=sys.stderr)
                if not args.quiet:
                    print_transition(ev)
                d.done(ev)
                stats["events"] += 1
            if handled:
                consumer.commit(asynchronous=False)
            if args.exit_at_end and assigned and assigned <= at_end:
                break
    finally:
        consumer.close()
    stats["payments"] = len(d.last)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
