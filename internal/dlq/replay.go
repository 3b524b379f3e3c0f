package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/source"
)

// Marker is the value of a record on the replays topic: one DLQ record
// replayed. Its key is MarkerKey of the DLQ record.
type Marker struct {
	DLQTopic   string    `json:"dlq_topic"`
	DLQTopicID string    `json:"dlq_topic_id"`
	DLQ        Position  `json:"dlq"`
	RawTopic   string    `json:"raw_topic"`
	Raw        Position  `json:"raw"`
	PaymentKey string    `json:"payment_key"`
	DedupKey   string    `json:"dedup_key"`
	ReplayedAt time.Time `json:"replayed_at"`
}

// MarkerKey keys the replays topic: the DLQ topic, its Kafka topic id (a
// recreated topic reuses offsets, not ids) and the record's position.
func MarkerKey(topic, topicID string, pos Position) string {
	return fmt.Sprintf("%s/%s/%d/%d", topic, topicID, pos.Partition, pos.Offset)
}

// Replays returns the replays recorded for the DLQ topic, by position.
// A missing replays topic means none.
func (t *Tool) Replays(ctx context.Context) (map[Position]Marker, error) {
	topicID, err := t.topicID(ctx, t.cfg.DLQTopic)
	if err != nil {
		return nil, err
	}
	starts, ends, err := t.bounds(ctx, t.cfg.ReplaysTopic, time.Time{})
	if errors.Is(err, ErrNoTopic) {
		return map[Position]Marker{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[Position]Marker{}
	err = t.read(ctx, t.cfg.ReplaysTopic, starts, ends, func(r *kgo.Record, _, _ int64) error {
		if r == nil {
			return nil
		}
		var m Marker
		if json.Unmarshal(r.Value, &m) != nil || m.DLQTopic != t.cfg.DLQTopic || m.DLQTopicID != topicID {
			return nil // another DLQ topic's, or one since recreated
		}
		if string(r.Key) == MarkerKey(m.DLQTopic, m.DLQTopicID, m.DLQ) {
			out[m.DLQ] = m
		}
		return nil
	})
	return out, err
}

// topicID returns topic's Kafka topic id.
func (t *Tool) topicID(ctx context.Context, topic string) (string, error) {
	tds, err := t.adm.ListTopics(ctx, topic)
	if err != nil {
		return "", fmt.Errorf("describe topic %s: %w", topic, err)
	}
	td, ok := tds[topic]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		return "", fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	if td.Err != nil {
		return "", fmt.Errorf("describe topic %s: %w", topic, td.Err)
	}
	return td.ID.String(), nil
}

// Errors of Replay.
var (
	// ErrAlreadyReplayed: the replays topic records this DLQ record.
	ErrAlreadyReplayed = errors.New("already replayed")
	// ErrStillUnprocessable: the source's driver still cannot parse the body.
	ErrStillUnprocessable = errors.New("still unprocessable")
	// ErrIrrelevant: the driver now parses the body but finds no payment
	// fact in it; there is nothing to replay.
	ErrIrrelevant = errors.New("no payment fact")
)

// Reparse runs the record's source's driver on its stored body and kept
// headers and returns the raw envelope ingest would have produced: the same
// source, driver, receipt time, kept headers and body, with the event and
// the payment key the driver now finds. It does not verify the signature:
// ingest did when the webhook arrived, and the signature headers are not
// kept. The query string is not kept either: a driver that reads ids from
// it (Mercado Pago's data.id) falls back to the body's.
func Reparse(rec *Record, sources map[string]*source.Source) (envelope.Raw, error) {
	if rec.DecodeError != "" {
		return envelope.Raw{}, fmt.Errorf("dlq record %s: %s", rec.Position, rec.DecodeError)
	}
	env := rec.Envelope
	src, ok := sources[env.Source]
	if !ok {
		return envelope.Raw{}, fmt.Errorf("dlq record %s: source %q is not in the sources file", rec.Position, env.Source)
	}
	if src.DriverName != env.Driver {
		return envelope.Raw{}, fmt.Errorf("dlq record %s: source %q was received by driver %q, the sources file now says %q: refusing to re-parse with another driver",
			rec.Position, env.Source, env.Driver, src.DriverName)
	}
	req := &provider.Request{Header: http.Header{}, Body: env.Body, Now: env.ReceivedAt}
	for k, v := range env.Headers {
		req.Header.Set(k, v)
	}
	ev, err := src.Driver.Parse(req)
	switch {
	case errors.Is(err, provider.ErrIrrelevant):
		return envelope.Raw{}, fmt.Errorf("dlq record %s: %w: the driver now finds no payment fact in it (%v)", rec.Position, ErrIrrelevant, err)
	case err != nil:
		return envelope.Raw{}, fmt.Errorf("dlq record %s: %w: %v", rec.Position, ErrStillUnprocessable, err)
	}
	return envelope.Raw{
		V: envelope.RawVersion, Source: env.Source, Driver: env.Driver, PaymentKey: src.PaymentKey(ev.PaymentID),
		Event: ev, ReceivedAt: env.ReceivedAt, Headers: env.Headers, Body: env.Body,
	}, nil
}

// ReplayResult says what Replay did or, on a dry run, would do.
type ReplayResult struct {
	DLQ      Position     `json:"dlq"`
	Envelope envelope.Raw `json:"-"`
	// RawTopic and Raw: where the event was produced; on a dry run, Raw's
	// partition is where it would go and its offset is -1.
	RawTopic string   `json:"raw_topic"`
	Raw      Position `json:"raw"`
	DryRun   bool     `json:"dry_run"`
	// Previous is the earlier replay, when ErrAlreadyReplayed.
	Previous *Marker `json:"previous,omitempty"`
}

// Replay re-parses the DLQ record at pos with its source's driver (see
// Reparse) and produces the resulting raw envelope to the raw topic, keyed
// by payment, then records the replay on the replays topic. A record
// already recorded there is refused with ErrAlreadyReplayed. With dryRun it
// does everything but the two writes.
//
// The raw record is produced before the replay is recorded: a crash between
// the two, or two operators replaying the same record at once, can put a
// second copy on the raw topic, never none. The processor deduplicates on
// (source, dedup key), so a second copy is stored as ignored:
// duplicate_event and changes nothing.
func (t *Tool) Replay(ctx context.Context, pos Position, sources map[string]*source.Source, dryRun bool) (*ReplayResult, error) {
	rec, err := t.Get(ctx, pos)
	if err != nil {
		return nil, err
	}
	res := &ReplayResult{DLQ: pos, RawTopic: t.cfg.RawTopic, DryRun: dryRun}
	done, err := t.Replays(ctx)
	if err != nil {
		return nil, err
	}
	if m, ok := done[pos]; ok {
		res.Previous = &m
		return res, fmt.Errorf("dlq record %s: %w at %s to %s %s", pos, ErrAlreadyReplayed, m.ReplayedAt.Format(time.RFC3339), m.RawTopic, m.Raw)
	}
	env, err := Reparse(rec, sources)
	if err != nil {
		return nil, err
	}
	res.Envelope = env
	value, err := env.Marshal()
	if err != nil {
		return nil, fmt.Errorf("encode envelope: %w", err)
	}
	raw := &kgo.Record{
		Topic: t.cfg.RawTopic, Key: []byte(env.PaymentKey), Value: value,
		Headers: []kgo.RecordHeader{{Key: HeaderReplayedFrom, Value: fmt.Appendf(nil, "%s/%s", t.cfg.DLQTopic, pos)}},
	}
	if dryRun {
		n, err := t.partitions(ctx, t.cfg.RawTopic)
		if err != nil {
			return nil, err
		}
		res.Raw = Position{Partition: int32(kgo.StickyKeyPartitioner(nil).ForTopic(t.cfg.RawTopic).Partition(raw, n)), Offset: -1}
		return res, nil
	}
	topicID, err := t.topicID(ctx, t.cfg.DLQTopic)
	if err != nil {
		return nil, err
	}
	if err := t.ensureReplaysTopic(ctx); err != nil {
		return nil, err
	}
	if err := t.cl.ProduceSync(ctx, raw).FirstErr(); err != nil {
		return nil, fmt.Errorf("produce to %s: %w", t.cfg.RawTopic, err)
	}
	res.Raw = Position{Partition: raw.Partition, Offset: raw.Offset}
	m := Marker{
		DLQTopic: t.cfg.DLQTopic, DLQTopicID: topicID, DLQ: pos, RawTopic: t.cfg.RawTopic, Raw: res.Raw,
		PaymentKey: env.PaymentKey, DedupKey: env.Event.DedupKey, ReplayedAt: time.Now().UTC(),
	}
	mv, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode replay marker: %w", err)
	}
	marker := &kgo.Record{Topic: t.cfg.ReplaysTopic, Key: []byte(MarkerKey(m.DLQTopic, topicID, pos)), Value: mv}
	if err := t.cl.ProduceSync(ctx, marker).FirstErr(); err != nil {
		return res, fmt.Errorf("replayed to %s %s, but recording the replay on %s failed (a second replay would be a duplicate_event): %w",
			t.cfg.RawTopic, res.Raw, t.cfg.ReplaysTopic, err)
	}
	return res, nil
}

// partitions returns topic's partition count.
func (t *Tool) partitions(ctx context.Context, topic string) (int, error) {
	tds, err := t.adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	td := tds[topic]
	if td.Err != nil || len(td.Partitions) == 0 {
		return 0, fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	return len(td.Partitions), nil
}

// ensureReplaysTopic creates the replays topic when it does not exist:
// compacted (one marker per DLQ record, forever; markers are a few hundred
// bytes) and one partition (read whole before each replay), with the
// broker's default replication factor.
func (t *Tool) ensureReplaysTopic(ctx context.Context) error {
	compact := "compact"
	resp, err := t.adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, t.cfg.ReplaysTopic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", t.cfg.ReplaysTopic, err)
	}
	return nil
}
