package reconcile

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/dlq"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/store"
)

// clockMargin is how much earlier than the window the state topic is read
// from: a state record's timestamp is the sink's clock when it produced
// the event, after the transition committed, but the sink's and
// Postgres's clocks may differ a little.
const clockMargin = 5 * time.Minute

// StateEventsCheck is the result of the state-event check.
type StateEventsCheck struct {
	// Transitions is how many transitions were judged: recorded in the
	// window and older than Settle.
	Transitions int `json:"transitions_checked"`
	// TooRecent is how many transitions were left out as younger than
	// Settle.
	TooRecent int `json:"too_recent"`
	// EventsRead is how many state events a read_committed consumer sees
	// from the start of the window (less the clock margin).
	EventsRead int `json:"events_read"`
	// Missing is how many judged transitions have no state event;
	// MissingEvents lists their event ids (at most maxListed).
	Missing       int      `json:"missing"`
	MissingEvents []string `json:"missing_events"`
	// Duplicated lists the event ids a read_committed consumer sees more
	// than once (at most maxListed).
	Duplicated []string `json:"duplicated"`
}

// checkStateEvents compares the transitions recorded in [since, settled)
// with the event ids on the state topic.
func checkStateEvents(ctx context.Context, cfg Config, kcl *kgo.Client, since, settled time.Time, p *progress) (StateEventsCheck, error) {
	out := StateEventsCheck{MissingEvents: []string{}, Duplicated: []string{}}
	// The transitions are listed before the topic is read: every event of a
	// transition listed here that the sink relayed is then on the topic.
	ts, err := store.TransitionsBetween(ctx, cfg.DB, since, cfg.Now().Add(time.Minute))
	if err != nil {
		return out, err
	}
	seen, err := readEventIDs(ctx, kcl, cfg.StateTopic, since.Add(-clockMargin), p)
	if err != nil {
		return out, err
	}
	for id, n := range seen {
		out.EventsRead += n
		if n > 1 && len(out.Duplicated) < maxListed {
			out.Duplicated = append(out.Duplicated, id)
		}
	}
	slices.Sort(out.Duplicated)
	for _, t := range ts {
		if !t.At.Before(settled) {
			out.TooRecent++
			continue
		}
		out.Transitions++
		id := envelope.StateEventID(t.PaymentKey, t.Version)
		if seen[id] == 0 {
			out.Missing++
			if len(out.MissingEvents) < maxListed {
				out.MissingEvents = append(out.MissingEvents, id)
			}
		}
	}
	return out, nil
}

// readEventIDs counts the event-id headers a read_committed consumer sees
// on topic from the first offset at or after from up to each partition's
// last stable offset at the time of the call.
func readEventIDs(ctx context.Context, kcl *kgo.Client, topic string, from time.Time, p *progress) (map[string]int, error) {
	adm := kadm.NewClient(kcl)
	starts, err := adm.ListOffsetsAfterMilli(ctx, from.UnixMilli(), topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("state topic %s: offsets since %s: %w", topic, from.Format(time.RFC3339), err)
	}
	stable, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = stable.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("state topic %s: last stable offsets: %w", topic, err)
	}
	consume := map[int32]kgo.Offset{}
	ends := map[int32]int64{}
	stable.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(topic, o.Partition); ok && s.Offset < o.Offset {
			consume[o.Partition] = kgo.NewOffset().At(s.Offset)
			ends[o.Partition] = o.Offset
		}
	})
	seen := map[string]int{}
	if len(consume) == 0 {
		return seen, nil
	}
	cl, err := kgo.NewClient(append(kcl.Opts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: consume}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Control records too: the last offsets below a partition's last
		// stable offset may be transaction markers, and the read must see
		// it got there.
		kgo.KeepControlRecords())...)
	if err != nil {
		return nil, fmt.Errorf("kafka consumer: %w", err)
	}
	defer cl.Close()
	read := 0
	for len(ends) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read state topic %s: %w", topic, err)
		}
		if err := fs.Err(); err != nil {
			return nil, fmt.Errorf("read state topic %s: %w", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := ends[r.Partition]; ok && r.Offset+1 >= end {
				delete(ends, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			read++
			for _, h := range r.Headers {
				if h.Key == envelope.HeaderEventID {
					seen[string(h.Value)]++
					break
				}
			}
		})
		p.tick("state events: %d read, %d partitions to go", read, len(ends))
	}
	return seen, nil
}

// DLQCheck is the result of the DLQ check.
type DLQCheck struct {
	// Records is how many records were dead-lettered in the window.
	Records int `json:"records"`
	// Replayed is how many of them `paystream dlq replay` replayed (it
	// records each replay on the replays topic).
	Replayed int `json:"replayed"`
	// NotReplayed counts the others, and Unreplayed lists their positions
	// ("partition/offset", at most maxListed). NotReplayed > 0 is drift:
	// authentic webhooks whose events were never applied.
	NotReplayed int      `json:"not_replayed"`
	Unreplayed  []string `json:"unreplayed"`
}

// checkDLQ lists the DLQ records of the window and the replays recorded
// for them, through package dlq (the tool behind `paystream dlq`).
func checkDLQ(ctx context.Context, cfg Config, since time.Time, p *progress) (DLQCheck, error) {
	out := DLQCheck{Unreplayed: []string{}}
	tool, err := dlq.Open(dlq.Config{Brokers: cfg.Brokers, DLQTopic: cfg.DLQTopic, ReplaysTopic: cfg.ReplaysTopic, KafkaOpts: cfg.KafkaOpts})
	if err != nil {
		return out, err
	}
	defer tool.Close()
	replays, err := tool.Replays(ctx)
	if err != nil {
		return out, fmt.Errorf("dlq replays: %w", err)
	}
	err = tool.Scan(ctx, dlq.Filter{Since: since}, func(pr dlq.Progress) {
		p.tick("dlq: %d of %d records read", pr.Scanned, pr.Total)
	}, func(rec *dlq.Record) error {
		out.Records++
		if _, ok := replays[rec.Position]; ok {
			out.Replayed++
			return nil
		}
		out.NotReplayed++
		if len(out.Unreplayed) < maxListed {
			out.Unreplayed = append(out.Unreplayed, rec.Position.String())
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("dlq topic %s: %w", cfg.DLQTopic, err)
	}
	return out, nil
}
