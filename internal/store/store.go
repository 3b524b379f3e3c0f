// Package store holds every SQL statement of paystream's schema (see
// package migrations): the processor's batch writes, offsets and fencing,
// replay, the refetch sweeper, retention, gauges, the topic layout and the
// inspect queries.
// A reader finds every statement that touches a table here; the processor
// keeps the logic (deciding, fencing, retries) and calls this package.
// Every write of payments goes through a batch transaction (BatchTx,
// batchtx.go): BeginBatch locks and reads (Reads, reads.go), Write writes
// what the caller decided (Writes, writes.go), each in one round trip.
// The sink keeps its replication statements (the wal_level check, the
// publication, the slot and its lag), which touch no table of the schema.
//
// Functions take the smallest interface they need (a pool, a connection or
// a transaction all fit), so the caller decides the transaction.
package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the store's statements need: a pool, a connection or a
// transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// queryRows runs a read and collects its rows with scan; what names the
// read in its errors ("load transitions: ...").
func queryRows[T any](ctx context.Context, db DB, scan pgx.RowToFunc[T], what, sql string, args ...any) ([]T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// Delivery statuses (the deliveries.status column).
const (
	StatusProcessed   = "processed"
	StatusIgnored     = "ignored"
	StatusDeferred    = "deferred"
	StatusQuarantined = "quarantined"
)

// Reasons the store itself writes.
const (
	// ReasonDuplicateEvent is a redelivery of an event whose dedup key is
	// stored.
	ReasonDuplicateEvent = "duplicate_event"
	// ReasonPaymentHeld is an event deferred because its payment is held.
	ReasonPaymentHeld = "payment_held"
	// ReasonAwaitingRefetch is an event waiting for its payment to be
	// refetched from the gateway.
	ReasonAwaitingRefetch = "awaiting_refetch"
)

// ErrOutcomeChanged is returned when a stored delivery's outcome was about
// to be rewritten but the row no longer has the status it was read with:
// another writer decided it meanwhile. Nothing was written by the statement.
var ErrOutcomeChanged = errors.New("delivery changed concurrently")
