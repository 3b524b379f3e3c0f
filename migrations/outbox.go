package migrations

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paystream/paystream/internal/statelog"
)

// beforeSQL holds, by version, Go steps run in a migration's transaction
// before its SQL file.
var beforeSQL = map[int]func(context.Context, pgx.Tx) error{
	4: upgradeOutbox,
}

// ErrOutboxNoSlot is returned by the upgrade to version 4 when the outbox
// still holds unpublished events and no logical replication slot of the
// database would keep them once they are emitted.
var ErrOutboxNoSlot = errors.New("the outbox holds unpublished state events and the database has no logical replication slot to keep them: " +
	"let the old sink drain the outbox first, or create the sink's slot (paystream migrate does, with wal_level = logical) and migrate again")

// ErrUpgradeWAL is returned by the upgrade to version 4 when the WAL it
// would write (the outbox's unpublished events, the inbox, postings and
// payments rewritten) is more than a replication slot of the server can
// retain before max_slot_wal_keep_size invalidates it. Nothing was
// changed.
var ErrUpgradeWAL = errors.New("the upgrade would write more WAL than a replication slot can retain")

// lockOldWriters locks what the processors, replay and outbox relay of
// schema version 3 write, before anything is read: the offset rows first,
// as their batches lock them, so a batch in flight finishes (and is read
// below) and every later one waits, then fails once the tables are gone,
// with its offset not moved: the new processor applies its records
// again. Without the locks, a batch committed between the outbox read and
// the first conflicting lock of the SQL (ALTER TABLE payment_transitions)
// lost its state events with the outbox.
const lockOldWriters = `
LOCK TABLE consumer_offsets IN EXCLUSIVE MODE;
LOCK TABLE inbox, payments, payment_transitions, ledger_postings, outbox IN ACCESS EXCLUSIVE MODE`

// emitChunk is how many outbox events one statement emits: the upgrade
// holds one chunk in memory at a time, whatever the outbox's size.
const emitChunk = 1000

// upgradeOutbox locks out the old writers (lockOldWriters), checks that
// the upgrade's WAL fits what every replication slot can still retain
// (checkWAL), and moves the outbox's unpublished events into the
// write-ahead log as state messages of the migrating transaction (package
// statelog), in outbox id order: per payment, version order. They are
// published by the slot relay exactly as the processor's own; the outbox
// table is dropped by the SQL that follows. An event the old relay sent
// but had not marked yet is sent again with the same event id, as the old
// relay would have.
func upgradeOutbox(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, lockOldWriters); err != nil {
		return fmt.Errorf("lock out the old processors: %w", err)
	}
	var events, eventBytes int64
	if err := tx.QueryRow(ctx, `
		SELECT count(*), COALESCE(sum(octet_length(payment_key) + octet_length(payload::text)), 0)
		  FROM outbox WHERE published_at IS NULL`).Scan(&events, &eventBytes); err != nil {
		return fmt.Errorf("size unpublished outbox events: %w", err)
	}
	if events > 0 {
		var slots bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE database = current_database() AND slot_type = 'logical')`).
			Scan(&slots); err != nil {
			return fmt.Errorf("look up replication slots: %w", err)
		}
		if !slots {
			return ErrOutboxNoSlot
		}
	}
	if err := checkWAL(ctx, tx, events, eventBytes); err != nil {
		return err
	}
	return emitOutbox(ctx, tx)
}

// Estimating the upgrade's WAL: each emitted event is its frame (about its
// key and payload) plus the record's headers and the prefix; the SQL
// writes the inbox, postings and payments again (deliveries and dedup
// keys, movements, the json rewrite), each with its indexes, plus
// full-page images. TestUpgradeRefusesToOverrunSlot measured 112 MiB
// written for 47 MiB of events and 49 MiB of tables (1.3 bytes per table
// byte); the estimate, 146 MiB, keeps about a third in hand.
const (
	walPerEvent     = 128
	walPerTableByte = 2
)

// checkWAL fails with ErrUpgradeWAL when the upgrade's estimated WAL is
// more than the safe_wal_size of a replication slot of the server that
// max_slot_wal_keep_size limits. Every slot counts, not just the sink's:
// WAL is the server's, and the upgrade would invalidate any of them. The
// WAL is one transaction's, which a logical slot retains from its start
// until the relay confirms its commit, so emitting in several statements
// would not lower it: the bound is checked, not spread.
func checkWAL(ctx context.Context, tx pgx.Tx, events, eventBytes int64) error {
	var tables int64
	if err := tx.QueryRow(ctx, `
		SELECT COALESCE(sum(pg_total_relation_size(c)), 0)
		  FROM unnest(ARRAY['inbox', 'payments', 'ledger_postings']::regclass[]) AS c`).Scan(&tables); err != nil {
		return fmt.Errorf("size the tables the upgrade rewrites: %w", err)
	}
	estimate := eventBytes + events*walPerEvent + tables*walPerTableByte
	var slot, keep string
	var safe int64
	err := tx.QueryRow(ctx, `
		SELECT slot_name, safe_wal_size, current_setting('max_slot_wal_keep_size')
		  FROM pg_replication_slots
		 WHERE safe_wal_size IS NOT NULL AND wal_status IN ('reserved', 'extended')
		 ORDER BY safe_wal_size LIMIT 1`).Scan(&slot, &safe, &keep)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no slot, or max_slot_wal_keep_size = -1: no slot is invalidated for WAL
	}
	if err != nil {
		return fmt.Errorf("look up replication slots' WAL headroom: %w", err)
	}
	if estimate <= safe {
		return nil
	}
	return fmt.Errorf("%w: about %s of WAL (%d unpublished outbox events, %s of inbox, postings and payments to rewrite), "+
		"but slot %s can retain only %s more before max_slot_wal_keep_size (%s) invalidates it; "+
		"raise max_slot_wal_keep_size for the upgrade (it takes a reload), or let the old sink drain the outbox, then migrate again",
		ErrUpgradeWAL, mib(estimate), events, mib(tables), slot, mib(safe), keep)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// emitOutbox emits the unpublished outbox events, emitChunk at a time, in
// id order.
func emitOutbox(ctx context.Context, tx pgx.Tx) error {
	after := int64(-1)
	for {
		rows, err := tx.Query(ctx, `
			SELECT id, payment_key, version, payload::text FROM outbox
			 WHERE published_at IS NULL AND id > $1 ORDER BY id LIMIT $2`, after, emitChunk)
		if err != nil {
			return fmt.Errorf("read unpublished outbox events: %w", err)
		}
		var events []statelog.Event
		var ev statelog.Event
		var payload string
		_, err = pgx.ForEachRow(rows, []any{&after, &ev.Key, &ev.Version, &payload}, func() error {
			events = append(events, statelog.Event{Key: ev.Key, Version: ev.Version, Payload: []byte(payload)})
			return nil
		})
		if err != nil {
			return fmt.Errorf("read unpublished outbox events: %w", err)
		}
		if len(events) == 0 {
			return nil
		}
		frames, err := statelog.EncodeAll(events)
		if err != nil {
			return fmt.Errorf("encode outbox events: %w", err)
		}
		if _, err := tx.Exec(ctx, statelog.EmitSQL, frames); err != nil {
			return fmt.Errorf("emit outbox events: %w", err)
		}
		if len(events) < emitChunk {
			return nil
		}
	}
}
