package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/processor"
)

// retentionFlags are shared by the retention command and the processor,
// which runs retention once an hour.
type retentionFlags struct {
	DeliveryRetention time.Duration `help:"How long deliveries (payloads and outcomes) are kept; whole days, by dropping daily partitions. Deferred and quarantined deliveries are kept until decided." default:"336h" env:"PAYSTREAM_DELIVERY_RETENTION"`
	DedupRetention    time.Duration `help:"How long dedup keys are kept: a redelivery within it is ignored as duplicate_event. At least 24h." default:"840h" env:"PAYSTREAM_DEDUP_RETENTION"`
}

type retentionCmd struct {
	dbFlags
	retentionFlags
	DryRun      bool   `help:"Report what would be created, dropped and deleted; change nothing."`
	MetricsFile string `help:"After a successful run, write the retention metrics (paystream_retention_last_success_timestamp_seconds: now) to this file in Prometheus text format, for node_exporter's textfile collector (when a scheduler runs retention instead of the processors)." type:"path" placeholder:"FILE"`
}

func (c *retentionCmd) Help() string {
	return `Deliveries live in daily partitions of the deliveries table; dedup keys in the narrow dedup_keys
table. retention creates the coming days' partitions, drops the partitions older than
--delivery-retention (their deferred and quarantined deliveries are moved out first, never
dropped), and deletes dedup keys older than --dedup-retention in small batches. Rows that landed in
the default partition because their day had no partition are moved into one. The processor does
the same once an hour; an advisory lock makes one session do it at a time. Safe to run any time.

Example:

  paystream retention --database-url postgres://... --delivery-retention 168h --dry-run`
}

func (c *retentionCmd) Run(ctx context.Context, e *env) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	m, err := processor.NewRetentionMetrics(reg)
	if err != nil {
		return err
	}
	r, err := processor.Retention(ctx, pool, processor.RetentionConfig{
		DeliveryRetention: c.DeliveryRetention, DedupRetention: c.DedupRetention,
		DryRun: c.DryRun, Logger: e.log, Metrics: m,
	})
	if errors.Is(err, processor.ErrRetentionBusy) {
		return fmt.Errorf("another processor or retention command is running retention; try again later: %w", err)
	}
	// Written only after a success: the file keeps the last success's
	// time, which a failed run must not erase.
	if err == nil && c.MetricsFile != "" && !c.DryRun {
		if err := prometheus.WriteToTextfile(c.MetricsFile, reg); err != nil {
			return fmt.Errorf("write metrics file: %w", err)
		}
	}
	// A failed step does not stop the others: what they did is printed too.
	if err != nil && len(r.Created) == 0 && len(r.Dropped) == 0 && r.DefaultDeleted == 0 && r.DedupDeleted == 0 {
		return err
	}
	verb := map[bool]string{true: "would ", false: ""}[c.DryRun]
	fmt.Printf("%screate %d partitions %v (%d rows moved from the default partition)\n", verb, len(r.Created), r.Created, r.MovedFromDefault)
	fmt.Printf("%sdrop %d partitions %v: %d deliveries (%d deferred or quarantined kept)\n", verb, len(r.Dropped), r.Dropped, r.DroppedRows, r.KeptWaiting)
	if !c.DryRun {
		fmt.Printf("deleted %d expired deliveries from the default partition\n", r.DefaultDeleted)
	}
	fmt.Printf("%sdelete %d expired dedup keys\n", verb, r.DedupDeleted)
	return err
}
