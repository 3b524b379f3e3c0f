package processor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/internal/metric"
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
	// Metrics, when set, receive the time of each run that succeeded
	// (every step) and count those that failed; dry runs and runs that
	// found the lock taken count as neither. Defaults to none.
	Metrics *RetentionMetrics
}

// RetentionMetrics tell when retention last succeeded: a run that fails
// every hour leaves the deliveries table and the dedup keys to grow.
type RetentionMetrics struct {
	lastSuccess prometheus.Gauge
	failures    prometheus.Counter
}

// NewRetentionMetrics registers retention's metrics on reg.
func NewRetentionMetrics(reg prometheus.Registerer) (*RetentionMetrics, error) {
	r := metric.New(reg, "retention")
	m := &RetentionMetrics{
		lastSuccess: metric.Gauge(r, "paystream_retention_last_success_timestamp_seconds",
			"When this process last ran retention to the end without an error (Unix seconds); 0 until it has."),
		failures: metric.Counter(r, "paystream_retention_failures_total",
			"Retention runs that failed in a step (partition creation, drop, expired rows); the other steps still ran."),
	}
	return metric.Registered(r, m)
}

// withDefaults returns c with each field left at its zero value set to
// the default its comment states.
func (c RetentionConfig) withDefaults() RetentionConfig {
	c.DeliveryRetention = cmp.Or(c.DeliveryRetention, DefaultDeliveryRetention)
	c.DedupRetention = cmp.Or(c.DedupRetention, DefaultDedupRetention)
	c.PartitionsAhead = cmp.Or(c.PartitionsAhead, defaultPartitionsAhead)
	c.DedupBatch = cmp.Or(c.DedupBatch, defaultDedupBatch)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports the first field of c (defaults applied) whose value
// cannot work, by name.
func (c *RetentionConfig) validate() error {
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

// ddlAttempts is how many times one run tries a partition's creation or
// drop that timed out waiting for a lock (a long transaction holds
// deliveries); retryBackoff is the first wait between tries, doubled
// after each.
const (
	ddlAttempts  = 5
	retryBackoff = 500 * time.Millisecond
)

// Retention keeps the deliveries table's partitions and the dedup keys in
// shape, under an advisory lock so one session does it at a time: it
// creates the daily partitions of the coming days, and of the days whose
// rows landed in the default partition (moving them in), drops the
// partitions older than DeliveryRetention (moving their waiting
// deliveries out first), deletes expired decided rows from the default
// partition and expired dedup keys, in small batches. Each step commits
// on its own, and a failed step does not stop the others: the error
// returned joins every step's. A run cut short is finished by the next.
func Retention(ctx context.Context, pool *pgxpool.Pool, cfg RetentionConfig) (RetentionReport, error) {
	var r RetentionReport
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
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
	cutoff := now.Add(-cfg.DeliveryRetention)
	var errs []error
	if err := createPartitions(ctx, pool, cfg, now, cutoff, &r); err != nil {
		errs = append(errs, err)
	}
	if ctx.Err() != nil {
		return r, errors.Join(append(errs, ctx.Err())...)
	}
	if err := dropPartitions(ctx, pool, cfg, cutoff, &r); err != nil {
		errs = append(errs, err)
	}
	if ctx.Err() != nil {
		return r, errors.Join(append(errs, ctx.Err())...)
	}
	if err := deleteExpired(ctx, pool, cfg, now, cutoff, &r); err != nil {
		errs = append(errs, err)
	}
	err = errors.Join(errs...)
	if cfg.Metrics != nil && !cfg.DryRun {
		if err != nil {
			cfg.Metrics.failures.Inc()
		} else {
			cfg.Metrics.lastSuccess.Set(float64(cfg.Now().UnixNano()) / 1e9)
		}
	}
	return r, err
}

// createPartitions creates the partitions of today and the coming days,
// and of the days still within the delivery retention whose rows wait in
// the default partition (their day had no partition, e.g. no processor
// ran retention for longer than PartitionsAhead days), moving those rows
// in.
func createPartitions(ctx context.Context, pool *pgxpool.Pool, cfg RetentionConfig, now, cutoff time.Time, r *RetentionReport) error {
	parts, err := store.ListPartitions(ctx, pool)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, p := range parts {
		have[p.Name] = true
	}
	var want []store.Partition
	for day := range cfg.PartitionsAhead + 1 {
		want = append(want, store.PartitionOf(now.Add(time.Duration(day)*24*time.Hour)))
	}
	days, err := store.DefaultDays(ctx, pool, cutoff.Add(-24*time.Hour))
	if err != nil {
		return err
	}
	for _, d := range days {
		if p := store.PartitionOf(d); p.Day.Add(24 * time.Hour).After(cutoff) {
			want = append(want, p)
		}
	}
	slices.SortFunc(want, func(a, b store.Partition) int { return a.Day.Compare(b.Day) })
	want = slices.Compact(want)

	log := cfg.Logger
	var errs []error
	for _, p := range want {
		if have[p.Name] {
			continue
		}
		if cfg.DryRun {
			r.Created = append(r.Created, p.Name)
			log.Info("would create partition", "partition", p.Name)
			continue
		}
		var moved int64
		err := retryDDL(ctx, log, p.Name, func() (err error) {
			moved, err = store.CreatePartition(ctx, pool, p)
			return err
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.Created = append(r.Created, p.Name)
		r.MovedFromDefault += moved
		log.Info("created partition", "partition", p.Name, "moved_from_default", moved)
	}
	return errors.Join(errs...)
}

// dropPartitions drops the partitions whose whole day is older than
// cutoff, their waiting deliveries moved to the default partition.
func dropPartitions(ctx context.Context, pool *pgxpool.Pool, cfg RetentionConfig, cutoff time.Time, r *RetentionReport) error {
	parts, err := store.ListPartitions(ctx, pool)
	if err != nil {
		return err
	}
	log := cfg.Logger
	var errs []error
	for _, p := range parts {
		if p.Day.Add(24 * time.Hour).After(cutoff) {
			break // parts are oldest first
		}
		if cfg.DryRun {
			rows, waiting, err := store.PartitionRows(ctx, pool, p)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			r.Dropped = append(r.Dropped, p.Name)
			r.DroppedRows += rows - waiting
			r.KeptWaiting += waiting
			log.Info("would drop partition", "partition", p.Name, "rows", rows-waiting, "waiting_kept", waiting)
			continue
		}
		var dropped, kept int64
		err := retryDDL(ctx, log, p.Name, func() (err error) {
			dropped, kept, err = store.DropPartition(ctx, pool, p)
			return err
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.Dropped = append(r.Dropped, p.Name)
		r.DroppedRows += dropped
		r.KeptWaiting += kept
		log.Info("dropped partition", "partition", p.Name, "rows", dropped, "waiting_kept", kept)
	}
	return errors.Join(errs...)
}

// deleteExpired deletes the expired decided deliveries of the default
// partition and the expired dedup keys (except those of waiting
// deliveries), in batches.
func deleteExpired(ctx context.Context, pool *pgxpool.Pool, cfg RetentionConfig, now, cutoff time.Time, r *RetentionReport) error {
	log := cfg.Logger
	if !cfg.DryRun {
		for {
			n, err := store.DeleteExpiredDefault(ctx, pool, cutoff, cfg.DedupBatch)
			if err != nil {
				return err
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
		return err
	}
	if cfg.DryRun {
		n, err := store.CountExpiredDedupKeys(ctx, pool, dedupCutoff, keep)
		if err != nil {
			return err
		}
		r.DedupDeleted = n
		log.Info("would delete expired dedup keys", "keys", n, "before", dedupCutoff)
		return nil
	}
	for {
		n, err := store.DeleteExpiredDedupKeys(ctx, pool, dedupCutoff, keep, cfg.DedupBatch)
		if err != nil {
			return err
		}
		r.DedupDeleted += n
		if n < int64(cfg.DedupBatch) {
			break
		}
		log.Debug("deleting expired dedup keys", "deleted", r.DedupDeleted)
	}
	log.Info("deleted expired dedup keys", "keys", r.DedupDeleted, "before", dedupCutoff)
	return nil
}

// retryDDL runs step until it succeeds, fails with anything but a lock
// timeout, or has been tried ddlAttempts times.
func retryDDL(ctx context.Context, log *slog.Logger, partition string, step func() error) error {
	wait := retryBackoff
	for attempt := 1; ; attempt++ {
		err := step()
		if err == nil || !store.IsLockTimeout(err) || attempt == ddlAttempts {
			return err
		}
		log.Info("partition step timed out waiting for a lock; retrying", "partition", partition, "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
	}
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
			Now: p.cfg.Now, Logger: p.log.With("component", "retention"), Metrics: p.retention,
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
