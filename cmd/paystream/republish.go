package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/paystream/paystream/sink"
)

type republishCmd struct {
	relayToolFlags
	Since  time.Time     `help:"Publish again the transitions recorded since this time (RFC 3339), instead of since the relay's newest checkpoint minus --margin. Needed when no checkpoint of the server's WAL history has a commit time." placeholder:"TIME"`
	Margin time.Duration `help:"How long before the newest checkpoint's commit time to start: transactions commit in another order than they start." default:"5m"`
	DryRun bool          `help:"Count what would be published again; change nothing (no slot, no record, no relay fenced)."`
}

func (c *republishCmd) Help() string {
	return `After a Postgres failover (or a restore, or a slot invalidated past max_slot_wal_keep_size) the
sink's logical replication slot is gone: Postgres 15 keeps no logical slot on a standby. The sink then
relays nothing and reports paystream_sink_slot_lost 1, and migrate refuses to run, rather than
create a new slot and silently skip the state events committed since the relay's last checkpoint.

republish recovers: it creates the slot again, reads payment_transitions in the slot's own snapshot
from the relay's newest checkpoint (of the server's WAL history, minus --margin), and publishes every
state event the state topic does not hold, with its usual event id and the header
paystream-republished: 1, in the relay's Kafka transactions; the relay then resumes where the slot
starts. A republished event's transition is exact; its "payment" object is the payment's state now.
Consumers that deduplicate by event id see every version once (docs/consumers.md).

Run it once the processors and the sink point at the new primary; they may run meanwhile. If it
stops half way, run it again. Example:

  paystream republish --database-url postgres://new-primary/... --kafka-brokers ... --dry-run
  paystream republish --database-url postgres://new-primary/... --kafka-brokers ...`
}

func (c *republishCmd) Run(ctx context.Context, e *env) error {
	r, err := c.open(ctx, e)
	if err != nil {
		return err
	}
	defer r.pool.Close()
	rep, err := sink.Republish(ctx, r.pool, sink.RepublishConfig{
		Brokers:         r.brokers,
		KafkaOpts:       r.kafkaOpts,
		Topic:           c.StateTopic,
		CheckpointTopic: c.CheckpointTopic,
		LatestTopic:     c.LatestTopic,
		Deployment:      c.Deployment,
		StateFormat:     r.format,
		SchemaRegistry:  r.registry,
		Since:           c.Since,
		Margin:          c.Margin,
		DryRun:          c.DryRun,
		Logger:          e.log,
		Progress: throttled(time.Second, func(done, total int) {
			fmt.Fprintf(os.Stderr, "\rrepublished %d of %d state events", done, total)
			if done == total {
				fmt.Fprintln(os.Stderr)
			}
		}),
	})
	if err != nil {
		return fmt.Errorf("republish: %w", err)
	}
	verb := "published again"
	if c.DryRun {
		verb = "would publish again"
	}
	fmt.Printf("slot %s of %s\n", rep.Slot, rep.Identity)
	fmt.Printf("checkpoint: lsn %s timeline %d committed %s\n", rep.CheckpointLSN, rep.CheckpointTimeline, rep.CheckpointCommitTime.Format(time.RFC3339))
	fmt.Printf("transitions since %s: %d; already on the state topic: %d; %s: %d\n",
		rep.Since.Format(time.RFC3339), rep.Transitions, rep.OnTopic, verb, rep.Published)
	if !c.DryRun {
		fmt.Printf("slot recreated at %s; the relay resumes there\n", rep.SlotLSN)
	}
	return nil
}
