// Package sink relays the payment-state events the processor writes into
// Postgres's write-ahead log (logical decoding messages, see package
// statelog) to the normalized topic, exactly once for read_committed
// consumers.
//
// The Relay reads the messages from a logical replication slot, one per
// database and schema (SlotName; its Kafka transactional id and checkpoint
// key come from the database's Identity). Only one connection can stream a slot: the relay that
// holds it is the active one, other replicas are standbys that retry it.
// Whole Postgres transactions, in commit order, go into one Kafka
// transaction together with a checkpoint record — the WAL position they
// reach — on a small compacted topic; the slot is confirmed to Postgres
// only after the Kafka commit. A relay that takes over fences its
// predecessor's transactional producer, reads the committed checkpoint and
// skips what the slot sends again below it. So a consumer reading with
// isolation.level=read_committed sees every event id
// "{payment key}:{version}" once, each payment's events in order on one
// partition, and nothing from a rolled-back Postgres transaction.
//
// The slot makes Postgres keep WAL until the relay confirms it: a relay
// down for long holds back WAL up to the server's max_slot_wal_keep_size,
// past which Postgres invalidates the slot. The active relay emits a small
// heartbeat message every HeartbeatInterval so the slot moves on a quiet
// database too. A lost slot (a Postgres failover before failover slots, a
// restore) is never recreated silently: Republish publishes again what it
// may not have relayed. Beside the state topic the relay can keep a
// compacted latest-state topic (each payment's newest event, in the same
// transactions; Backfill rebuilds it), and every record carries the
// CloudEvents binary-mode headers; the value is JSON, or Avro in the
// Confluent wire format (Config.StateFormat).
//
// Files: config.go (Config, New), relay.go (leadership: Run, setup, lead),
// session.go (one leadership's stream and Kafka transactions),
// checkpoint.go, slot.go, identity.go, republish.go, backfill.go,
// latest.go, cloudevents.go, format.go, metrics.go.
package sink
