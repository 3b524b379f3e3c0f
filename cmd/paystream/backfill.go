package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/paystream/paystream/sink"
)

type backfillCmd struct {
	relayToolFlags
	TakeOverFor time.Duration `help:"How long to try taking the replication slot from the active relay." default:"30s"`
}

func (c *backfillCmd) Help() string {
	return `Rebuilds the compacted latest-state topic (--latest-topic) from Postgres: for every payment, its
newest state event, as the sink publishes it. Run it once when the topic is new on an installation
that already has state events, or after losing the topic; new consumers then start from it
(docs/consumers.md, "Starting a new consumer").

It must not race the sink: it takes the sink's replication slot for its duration (the active relay
stands by meanwhile, and nothing is lost: the slot keeps the events), publishes with the sink's
transactional id, and lets go. Progress goes to stderr. Example:

  paystream backfill --database-url postgres://... --kafka-brokers ...`
}

func (c *backfillCmd) Run(ctx context.Context, e *env) error {
	r, err := c.open(ctx, e)
	if err != nil {
		return err
	}
	defer r.pool.Close()
	if c.LatestTopic == "" {
		return fmt.Errorf("backfill: --latest-topic is empty: nothing to rebuild")
	}
	rep, err := sink.Backfill(ctx, r.pool, sink.BackfillConfig{
		Brokers:         r.brokers,
		KafkaOpts:       r.kafkaOpts,
		Topic:           c.StateTopic,
		LatestTopic:     c.LatestTopic,
		CheckpointTopic: c.CheckpointTopic,
		Deployment:      c.Deployment,
		StateFormat:     r.format,
		SchemaRegistry:  r.registry,
		TakeOverFor:     c.TakeOverFor,
		Logger:          e.log,
		Progress: throttled(500*time.Millisecond, func(done, total int64) {
			fmt.Fprintf(os.Stderr, "\rbackfill: %d of %d payments (%d%%)", done, total, 100*done/max(total, 1))
		}),
	})
	if rep.Payments > 0 {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	fmt.Printf("%s: %d payments' newest state events in %s (slot %s held meanwhile; active relay taken over: %v)\n",
		c.LatestTopic, rep.Payments, rep.Took.Round(time.Millisecond), rep.Slot, rep.TookOver)
	return nil
}
