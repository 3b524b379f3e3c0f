// Command consumer is a complete consumer of paystream's payment-state
// topic, written the way docs/consumers.md recommends: a consumer group
// reading with isolation.level=read_committed (the sink publishes in Kafka
// transactions, so nothing of an aborted one is ever seen), offsets
// committed only after an event was handled, and events deduplicated by
// their event id, "{payment key}:{version}", so a redelivery changes
// nothing. It prints each payment transition:
//
//	go run ./examples/consumer --brokers 127.0.0.1:9092
//	2026-11-29T18:00:01Z acme:pay_123 v2 pending -> paid (capture 1050 BRL)
//
// With --bootstrap-from paystream.payments.latest.v1, a new group starts
// from each payment's newest state (the compacted latest-state topic) and
// then follows the state topic from where that snapshot ends (Bootstrap).
//
// It depends on franz-go only, not on paystream's packages: copy it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// StateEvent is one payment transition: the value of a record on
// paystream.payments.state.v1, as schemas/payment-state.v1.json describes
// it. Fields added to the schema later are optional, and encoding/json
// ignores the ones this struct does not name: an old consumer keeps working.
type StateEvent struct {
	EventID        string    `json:"event_id"` // "{payment_key}:{version}", also the event-id header
	PaymentKey     string    `json:"payment_key"`
	Source         string    `json:"source"`
	PaymentID      string    `json:"payment_id"`
	Version        int64     `json:"version"` // 1, 2, 3, ... per payment, no gaps
	Status         string    `json:"status"`
	PreviousStatus string    `json:"previous_status"` // "" for version 1
	Kind           string    `json:"kind"`
	AmountMinor    int64     `json:"amount_minor"` // integer minor units: never a float
	Currency       string    `json:"currency"`
	RefundID       string    `json:"refund_id,omitempty"`
	Payment        Payment   `json:"payment"`
	SourceEventID  string    `json:"source_event_id,omitempty"`
	OccurredAt     time.Time `json:"occurred_at"`
	RecordedAt     time.Time `json:"recorded_at"`
}

// Payment is the payment after the transition.
type Payment struct {
	Status      string `json:"status"`
	Version     int64  `json:"version"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

// HeaderEventID is the record header carrying the event id.
const HeaderEventID = "event-id"

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "Kafka seed brokers, comma-separated")
	topic := flag.String("topic", "paystream.payments.state.v1", "payment-state topic")
	group := flag.String("group", "paystream-example-consumer", "consumer group")
	latest := flag.String("bootstrap-from", "", "a new group starts from this latest-state topic (paystream.payments.latest.v1) instead of the state topic's history")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := NewDeduper()
	show := func(ev StateEvent) error { return PrintTransition(os.Stdout, ev) }
	if *latest != "" {
		// Before the group's client exists: a new group gets its offsets
		// from Bootstrap, and a member joining first would refuse them.
		if err := bootstrapNewGroup(ctx, strings.Split(*brokers, ","), *topic, *latest, *group, d, show); err != nil {
			log.Fatal(err)
		}
	}
	cl, err := NewClient(strings.Split(*brokers, ","), *topic, *group)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	err = Consume(ctx, cl, d, show)
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// bootstrapNewGroup runs Bootstrap unless group has committed offsets.
func bootstrapNewGroup(ctx context.Context, brokers []string, topic, latest, group string, d *Deduper, handle func(StateEvent) error) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	committed, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		return fmt.Errorf("fetch group %s's offsets: %w", group, err)
	}
	if len(committed) > 0 {
		return nil // not new: go on from its offsets
	}
	return Bootstrap(ctx, brokers, topic, latest, group, d, handle)
}

// NewClient returns a group consumer of topic that reads only committed
// transactions and commits offsets only when Consume says so.
func NewClient(brokers []string, topic, group string) (*kgo.Client, error) {
	return kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		// The sink writes in Kafka transactions: read_committed never
		// returns a record of a transaction that was aborted.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A new group starts with the oldest event kept.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Commit after handling, never before: at least once.
		kgo.DisableAutoCommit(),
	)
}

// Consume hands each new event to handle, in order per payment (a
// payment's events share its key, hence one partition), skipping the
// events d has seen, and commits the offsets of each handled batch. It
// returns when ctx ends or handle fails; the failed batch is not
// committed, so it is read again after a restart.
func Consume(ctx context.Context, cl *kgo.Client, d *Deduper, handle func(StateEvent) error) error {
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fetches.Err0(); err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		var herr error
		fetches.EachRecord(func(r *kgo.Record) {
			if herr != nil {
				return
			}
			var ev StateEvent
			if err := json.Unmarshal(r.Value, &ev); err != nil {
				herr = fmt.Errorf("record %s/%d/%d: %w", r.Topic, r.Partition, r.Offset, err)
				return
			}
			if id := header(r, HeaderEventID); id != ev.EventID {
				herr = fmt.Errorf("record %s/%d/%d: header event-id %q differs from event_id %q", r.Topic, r.Partition, r.Offset, id, ev.EventID)
				return
			}
			if d.Seen(ev) {
				return // a redelivery: already handled
			}
			if herr = handle(ev); herr == nil {
				d.Done(ev)
			}
		})
		if herr != nil {
			return herr
		}
		// Commit what was handled even when ctx ended meanwhile (Ctrl-C):
		// a restart then resumes after it.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := cl.CommitUncommittedOffsets(cctx)
		cancel()
		if err != nil {
			return fmt.Errorf("commit offsets: %w", err)
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Deduper remembers, per payment, the last version handled. A payment's
// versions are gapless and increasing and arrive in order, so an event at
// or below that version is a redelivery (a relay that crashed after
// publishing, a consumer that restarts before committing). This one lives
// in memory; a real consumer stores the last version, or a unique key on
// event_id, in the same transaction as its own effect.
type Deduper struct {
	last map[string]int64
}

// NewDeduper returns an empty Deduper.
func NewDeduper() *Deduper { return &Deduper{last: map[string]int64{}} }

// Seen reports whether ev was handled already.
func (d *Deduper) Seen(ev StateEvent) bool { return ev.Version <= d.last[ev.PaymentKey] }

// Done records ev as handled.
func (d *Deduper) Done(ev StateEvent) { d.last[ev.PaymentKey] = ev.Version }

// PrintTransition writes one line per transition.
func PrintTransition(w io.Writer, ev StateEvent) error {
	from := ev.PreviousStatus
	if from == "" {
		from = "(new)"
	}
	_, err := fmt.Fprintf(w, "%s %s v%d %s -> %s (%s %d %s)\n", ev.OccurredAt.UTC().Format(time.RFC3339),
		ev.PaymentKey, ev.Version, from, ev.Status, ev.Kind, ev.AmountMinor, ev.Currency)
	return err
}
