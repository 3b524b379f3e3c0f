package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

func (p *pipeline) waitIngestReady(ctx context.Context) error {
	readyz := "http://" + p.ingestAddr + "/readyz"
	return poll(ctx, 50*time.Millisecond, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, readyz, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("ingest /readyz: %s", resp.Status)
		}
		return nil
	}, p.ingest)
}

// groupOwnsAll checks that the processor group is stable with every raw
// partition assigned.
func (p *pipeline) groupOwnsAll(ctx context.Context) error {
	groups, err := p.adm.DescribeGroups(ctx, p.group)
	if err != nil {
		return err
	}
	g, ok := groups[p.group]
	if !ok || g.State != "Stable" {
		return fmt.Errorf("group state %q", g.State)
	}
	assigned := 0
	for _, m := range g.Members {
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range c.Topics {
				assigned += len(t.Partitions)
			}
		}
	}
	if assigned != p.partitions {
		return fmt.Errorf("%d of %d partitions assigned", assigned, p.partitions)
	}
	return nil
}

// sinkActive checks that a relay streams the schema's slot.
func (p *pipeline) sinkActive(ctx context.Context) error {
	var active bool
	err := p.pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, p.slot).Scan(&active)
	if err != nil {
		return fmt.Errorf("slot %s: %w", p.slot, err)
	}
	if !active {
		return fmt.Errorf("slot %s not streamed", p.slot)
	}
	return nil
}

// rawEnds returns the raw topic's end offset per partition.
func (p *pipeline) rawEnds(ctx context.Context) (map[int32]int64, error) {
	ends, err := p.adm.ListEndOffsets(ctx, p.raw)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	var perr error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			perr = o.Err
		}
		out[o.Partition] = o.Offset
	})
	return out, perr
}

// storedOffsets returns the processor group's next offsets, as stored in
// Postgres in the batches' transactions.
func (p *pipeline) storedOffsets(ctx context.Context) (map[int32]int64, error) {
	rows, err := p.pool.Query(ctx, `SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2`, p.group, p.raw)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for rows.Next() {
		var part int32
		var off int64
		if err := rows.Scan(&part, &off); err != nil {
			return nil, err
		}
		out[part] = off
	}
	return out, rows.Err()
}

// processedUpTo checks that the processors have committed every raw
// record below ends.
func (p *pipeline) processedUpTo(ctx context.Context, ends map[int32]int64) error {
	stored, err := p.storedOffsets(ctx)
	if err != nil {
		return err
	}
	for part, end := range ends {
		if stored[part] < end {
			return fmt.Errorf("raw partition %d: processed up to %d of %d", part, stored[part], end)
		}
	}
	return nil
}

// transitions counts the payment transitions committed so far: each has
// exactly one state event.
func (p *pipeline) transitions(ctx context.Context) (int, error) {
	var n int
	err := p.pool.QueryRow(ctx, `SELECT count(*) FROM payment_transitions`).Scan(&n)
	return n, err
}

// caughtUp waits until everything the raw topic held at from has been
// processed and its state events published: the processors' stored
// offsets reach the raw topic's end offsets of that moment, then the state
// topic (read_committed) holds as many distinct event ids as there were
// transitions at that point.
func (p *pipeline) caughtUp(ctx context.Context, ends map[int32]int64) error {
	if err := poll(ctx, 50*time.Millisecond, func(ctx context.Context) error {
		return p.processedUpTo(ctx, ends)
	}); err != nil {
		return err
	}
	var want int
	if err := poll(ctx, 50*time.Millisecond, func(ctx context.Context) (err error) {
		want, err = p.transitions(ctx)
		return err
	}); err != nil {
		return err
	}
	return poll(ctx, 50*time.Millisecond, func(context.Context) error {
		if got := p.watch.distinct(); got < want {
			return fmt.Errorf("state topic: %d of %d state events", got, want)
		}
		return nil
	})
}

// everyComponentUp checks that ingest, at least one processor and the
// relay run.
func (p *pipeline) everyComponentUp() error {
	if !p.ingest.alive() {
		return p.ingest.exitedEarly()
	}
	if len(p.liveProcessors()) == 0 {
		return errors.New("no processor running")
	}
	if p.sink != nil && !p.sink.alive() {
		return p.sink.exitedEarly()
	}
	if p.relayDone != nil {
		select {
		case err := <-p.relayDone:
			p.relayDone <- err
			return fmt.Errorf("relay stopped: %v", err)
		default:
		}
	}
	return nil
}
