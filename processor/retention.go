package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/store"
)

// Retention defaults.
const (
	DefaultDeliveryRetention = 14 * 24 * time.Hour
	DefaultDedupRetention    = 35 * 24 * time.Hour
	defaultPartitionsAhead   = 3
	defaultDedupBatch        = 1000
	// MinDedupRetention is the shortest dedup retention allowed: gateways
	// retry for days and operators resend by hand.
	MinDedupRetention = 24 * time.Hour
)

// RetentionConfig configures Retention.
type RetentionConfig struct {
	// DeliveryRetention is how long deliveries (payloads and outcomes) are
	// kept: a daily partition is dropped once its whole day is older.
	// Deferred and quarantined deliveries are kept whatever their age.
	// Defaults to DefaultDeliveryRetention (14 days).
	DeliveryRetention time.Duration
	// DedupRetention is how long an event's dedup key is kept: a
	// redelivery within it is ignored as duplicate_event; after it, the
	// payment state machine still ignores it (duplicate_fact, stale), but
	// it is stored as a new delivery. Defaults to DefaultDedupRetention
	// (35 days); at least MinDedupRetention.
	DedupRetention time.Duration
	// PartitionsAhead is how many days of partitions exist ahead of today.
	// Defaults to 3.
	PartitionsAhead int
	// DedupBatch is how many dedup keys one DELETE removes. Defaults to 1000.
	DedupBatch int
	// DryRun reports what would be created, dropped and deleted, and
	// changes nothing.
	DryRun bool
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger receives one line per step. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *RetentionConfig) defaults() error {
	if c.DeliveryRetention == 0 {
		c.DeliveryRetention = DefaultDeliveryRetention
	}
	if c.DedupRetention == 0 {
		c.DedupRetention = DefaultDedupRetention
	}
	if c.PartitionsAhead == 0 {
		c.PartitionsAhead = defaultPartitionsAhead
	}
	if c.DedupBatch == 0 {
		c.DedupBatch = defaultDedupBatch
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.DeliveryRetention < 24*time.Hour:
		return fmt.Errorf("retention config: DeliveryRetention %s is less than a day", c.DeliveryRetention)
	case c.DedupRetention < MinDedupRetention:
		return fmt.Errorf("retention config: DedupRetention %s is less than %s", c.DedupRetention, MinDedupRetention)
	case c.PartitionsAhead < 1:
		return fmt.Errorf("retention config: PartitionsAhead %d must be at least 1", c.PartitionsAhead)
	case c.DedupBatch < 1:
		return fmt.Errorf("retention config: DedupBatch %d must be positive", c.DedupBatch)
	}
	return nil
}

// RetentionReport says what a retention run did (or, dry, would do).
type RetentionReport struct {
	// Created are the partitions created; MovedFromDefault counts the
	// rows of their days that had landed in the default partition.
	Created          []string
	MovedFromDefault int64
	// Dropped are the partitions dropped, with DroppedRows deliveries;
	// KeptWaiting counts their deferred and quarantined deliveries, moved
	// to the default partition instead.
	Dropped     []string
	DroppedRows int64
	KeptWaiting int64
	// DefaultDeleted counts expired decided deliveries deleted from the
	// default partition.
	DefaultDeleted int64
	// DedupDeleted counts expired dedup keys deleted.
	DedupDeleted int64
}

// ErrRetentionBusy is returned by Retention when another replica or
// command is running it.
var ErrRetentionBusy = store.ErrRetentionBusy

// Retention keeps the deliveries table's partitions and the dedup keys in
// shape, under an advisory lock so one session does it at a time: it
// creates the daily partitions of the coming days (moving rows that landed
// in the default partition), drops the partitions older than
// DeliveryRetention (moving their waiting deliveries out first), deletes
// expired decided rows from the default partition and expired dedup keys,
// in small batches. Each step commits on its own; a run cut short is
// finished by the next.
func Retention(ctx context.Context, pool *pgxpool.Pool, cfg RetentionConfig) (RetentionReport, error) {
	var r RetentionReport
	if err := cfg.defaults(); err != nil {
		return r, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return r, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	unlock, err := store.TryRetentionLock(ctx, conn)
	if err != nil {
		return r, err
	}
	defer unlock()

	now := cfg.Now().UTC()
	log := cfg.Logger
	parts, err := store.ListPartitions(ctx, pool)
	if err != nil {
		return r, err
	}
	have := map[string]bool{}
	for _, p := range parts {
		have[p.Name] = true
	}
	for day := range cfg.PartitionsAhead + 1 {
		p := store.PartitionOf(now.Add(time.Duration(day) * 24 * time.Hour))
		if have[p.Name] {
			continue
		}
		r.Created = append(r.Created, p.Name)
		if cfg.DryRun {
			log.Info("would create partition", "partition", p.Name)
			continue
		}
		moved, err := store.CreatePartition(ctx, pool, p)
		if err != nil {
			return r, err
		}
		r.MovedFromDefault += moved
		log.Info("created partition", "partition", p.Name, "moved_from_default", moved)
	}

	cutoff := now.Add(-cfg.DeliveryRetention)
	for _, p := range parts {
		if p.Day.Add(24 * time.Hour).After(cutoff) {
			break // parts are oldest first
		}
		r.Dropped = append(r.Dropped, p.Name)
		if cfg.DryRun {
			rows, waiting, err := store.PartitionRows(ctx, pool, p)
			if err != nil {
				return r, err
			}
			r.DroppedRows += rows - waiting
			r.KeptWaiting += waiting
			log.Info("would drop partition", "partition", p.Name, "rows", rows-waiting, "waiting_kept", waiting)
			continue
		}
		dropped, kept, err := store.DropPartition(ctx, pool, p)
		if err != nil {
			return r, err
		}
		r.DroppedRows += dropped
		r.KeptWaiting += kept
		log.Info("dropped partition", "partition", p.Name, "rows", dropped, "waiting_kept", kept)
	}
	if !cfg.DryRun {
		for {
			n, err := store.DeleteExpiredDefault(ctx, pool, cutoff, cfg.DedupBatch)
			if err != nil {
				return r, err
			}
			r.DefaultDeleted += n
			if n < int64(cfg.DedupBatch) {
				break
			}
		}
	}

	dedupCutoff := now.Add(-cfg.DedupRetention)
	keep, err := store.WaitingDeliveryIDs(ctx, pool)
	if err != nil {
		return r, err
	}
	if cfg.DryRun {
		n, err := store.CountExpiredDedupKeys(ctx, pool, dedupCutoff, keep)
		if err != nil {
			return r, err
		}
		r.DedupDeleted = n
		log.Info("would delete expired dedup keys", "keys", n, "before", dedupCutoff)
		return r, nil
	}
	for {
		n, err := store.DeleteExpiredDedupKeys(ctx, pool, dedupCutoff, keep, cfg.DedupBatch)
		if err != nil {
			return r, err
		}
		r.DedupDeleted += n
		if n < int64(cfg.DedupBatch) {
			break
		}
		log.Debug("deleting expired dedup keys", "deleted", r.DedupDeleted)
	}
	log.Info("deleted expired dedup keys", "keys", r.DedupDeleted, "before", dedupCutoff)
	return r, nil
}

// retentionLoop runs Retention at start and every RetentionInterval until
// ctx ends. Failures are logged: a missing partition only sends rows to
// the default partition, never stops a batch.
func (p *Processor) retentionLoop(ctx context.Context) {
	if p.cfg.RetentionInterval < 0 {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := Retention(ctx, p.pool, RetentionConfig{
			DeliveryRetention: p.cfg.DeliveryRetention, DedupRetention: p.cfg.DedupRetention,
			Now: p.cfg.Now, Logger: p.log.With("component", "retention"),
		})
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrRetentionBusy):
			p.log.Debug("retention runs in another replica")
		case err != nil:
			p.log.Warn("retention failed; retrying at the next interval", "error", err)
		}
		t.Reset(p.cfg.RetentionInterval)
	}
}
