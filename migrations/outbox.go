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
	4: emitOutbox,
}

// ErrOutboxNoSlot is returned by the upgrade to version 4 when the outbox
// still holds unpublished events and no logical replication slot of the
// database would keep them once they are emitted.
var ErrOutboxNoSlot = errors.New("the outbox holds unpublished state events and the database has no logical replication slot to keep them: " +
	"let the old sink drain the outbox first, or create the sink's slot (paystream migrate does, with wal_level = logical) and migrate again")

// emitOutbox moves the outbox's unpublished events into the write-ahead
// log as state messages of the migrating transaction (package statelog), in
// outbox id order: per payment, version order. They are published by the
// slot relay exactly as the processor's own; the outbox table is dropped
// by the SQL that follows. An event the old relay sent but had not marked
// yet is sent again with the same event id, as the old relay would have.
func emitOutbox(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, `SELECT payment_key, version, payload::text FROM outbox WHERE published_at IS NULL ORDER BY id`)
	if err != nil {
		return fmt.Errorf("read unpublished outbox events: %w", err)
	}
	var events []statelog.Event
	var ev statelog.Event
	var payload string
	_, err = pgx.ForEachRow(rows, []any{&ev.Key, &ev.Version, &payload}, func() error {
		events = append(events, statelog.Event{Key: ev.Key, Version: ev.Version, Payload: []byte(payload)})
		return nil
	})
	if err != nil {
		return fmt.Errorf("read unpublished outbox events: %w", err)
	}
	if len(events) == 0 {
		return nil
	}
	var slots bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE database = current_database() AND slot_type = 'logical')`).
		Scan(&slots); err != nil {
		return fmt.Errorf("look up replication slots: %w", err)
	}
	if !slots {
		return ErrOutboxNoSlot
	}
	frames, err := statelog.EncodeAll(events)
	if err != nil {
		return fmt.Errorf("encode outbox events: %w", err)
	}
	if _, err := tx.Exec(ctx, statelog.EmitSQL, frames); err != nil {
		return fmt.Errorf("emit outbox events: %w", err)
	}
	return nil
}
