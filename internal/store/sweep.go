package store

import (
	"context"
	"fmt"
	"time"
)

// DueQuery selects the deferred deliveries of one partition that the
// refetch sweeper retries.
type DueQuery struct {
	Topic     string
	Partition int32
	// Sources are the sources that can refetch.
	Sources []string
	// Retry is how long after a failed refetch an event is due again.
	Retry time.Duration
	// Window is how long an event waits for its predecessor before it is
	// refetched.
	Window time.Duration
	Limit  int
}

// ListDue lists, oldest first, q's partition's deferred deliveries that
// wait for a refetch their source can do: those awaiting_refetch never
// tried (stored with attempts = 1) or last tried Retry ago, and those still
// waiting for a predecessor after Window (at most once per Retry). Events
// of a held payment wait for replay instead.
func ListDue(ctx context.Context, db DB, q DueQuery) ([]StoredDelivery, error) {
	return queryRows(ctx, db, scanStoredDelivery, "list due deferred deliveries", `
		SELECT `+deliveryColumns+` FROM deliveries
		 WHERE status IN ('deferred', 'quarantined') AND status = 'deferred'
		   AND topic = $1 AND partition = $2 AND source = ANY($3)
		   AND ((reason = $4 AND (attempts <= 1 OR processed_at < now() - $5::interval))
		     OR (reason IS DISTINCT FROM $4 AND reason IS DISTINCT FROM $6
		         AND received_at < now() - $7::interval AND processed_at < now() - $5::interval))
		 ORDER BY id LIMIT $8`,
		q.Topic, q.Partition, q.Sources, ReasonAwaitingRefetch, q.Retry, ReasonPaymentHeld, q.Window, q.Limit)
}

// Postpone makes paymentKey's deferred deliveries ids due again after the
// sweeper's retry interval. It records no outcome: they stay deferred.
func Postpone(ctx context.Context, db DB, paymentKey string, ids []int64) error {
	if _, err := db.Exec(ctx, `
		UPDATE deliveries SET processed_at = now(), attempts = attempts + 1
		 WHERE payment_key = $1 AND id = ANY($2) AND status = 'deferred'`, paymentKey, ids); err != nil {
		return fmt.Errorf("postpone refetch: %w", err)
	}
	return nil
}
