package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config configures a Tool.
type Config struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// DLQTopic defaults to envelope.TopicDLQ.
	DLQTopic string
	// RawTopic, where Replay produces, defaults to envelope.TopicRaw.
	RawTopic string
	// ReplaysTopic, where Replay records what it replayed, defaults to
	// DefaultReplaysTopic. Replay creates it (compacted, one partition)
	// when it does not exist.
	ReplaysTopic string
	// MaxRecordBytes is the producer's batch limit: envelope.MaxRecordBytes
	// of the sources' largest max_body_bytes, as ingest's. Defaults to
	// Kafka's default message size.
	MaxRecordBytes int32
	// KafkaOpts are extra franz-go options (TLS, SASL); they override the
	// Tool's own.
	KafkaOpts []kgo.Opt
}

// Tool reads the DLQ topic and replays its records.
type Tool struct {
	cfg Config
	// cl produces replays (acks=all, idempotent, ingest's partitioner)
	// and serves the admin requests.
	cl  *kgo.Client
	adm *kadm.Client
}

// Open validates cfg and connects a Tool; Close it.
func Open(cfg Config) (*Tool, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("dlq: no Kafka brokers")
	}
	cfg.DLQTopic = cmpOr(cfg.DLQTopic, "paystream.webhooks.dlq.v1")
	cfg.RawTopic = cmpOr(cfg.RawTopic, "paystream.webhooks.raw.v1")
	cfg.ReplaysTopic = cmpOr(cfg.ReplaysTopic, DefaultReplaysTopic)
	if cfg.MaxRecordBytes <= 0 {
		cfg.MaxRecordBytes = 1048588
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		// As ingest's producer: every replica acknowledges, the
		// idempotent producer (franz-go's default) never writes a retried
		// batch twice, and a payment key lands on the partition ingest
		// would have chosen.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerBatchMaxBytes(cfg.MaxRecordBytes),
	}, cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &Tool{cfg: cfg, cl: cl, adm: kadm.NewClient(cl)}, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Close releases the Tool's connections.
func (t *Tool) Close() { t.cl.Close() }

// Progress is how far a scan got, in offsets.
type Progress struct {
	Scanned int64 // offsets read so far
	Total   int64 // offsets to read
	Matched int   // records that passed the filter
}

// ErrNoTopic is returned when a topic does not exist.
var ErrNoTopic = errors.New("topic does not exist")

// Scan reads the DLQ topic from its start (from f.Since, when set) up to its
// end at the time of the call, calling fn with each record f matches, in
// offset order within each partition. progress, if not nil, is called as
// the scan goes on and once at the end.
func (t *Tool) Scan(ctx context.Context, f Filter, progress func(Progress), fn func(*Record) error) error {
	starts, ends, err := t.bounds(ctx, t.cfg.DLQTopic, f.Since)
	if err != nil {
		return err
	}
	var p Progress
	return t.read(ctx, t.cfg.DLQTopic, starts, ends, func(r *kgo.Record, scanned int64, total int64) error {
		p.Scanned, p.Total = scanned, total
		if r != nil {
			rec := decode(r)
			if f.Match(rec) {
				p.Matched++
				if err := fn(rec); err != nil {
					return err
				}
			}
		}
		if progress != nil {
			progress(p)
		}
		return nil
	})
}

// ErrNotFound is Get's error for a position that holds no record.
var ErrNotFound = errors.New("no record at this position")

// Get reads the DLQ record at pos.
func (t *Tool) Get(ctx context.Context, pos Position) (*Record, error) {
	starts, ends, err := t.bounds(ctx, t.cfg.DLQTopic, time.Time{})
	if err != nil {
		return nil, err
	}
	start, ok := starts[pos.Partition]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: topic %s has no partition %d", ErrNotFound, t.cfg.DLQTopic, pos.Partition)
	case pos.Offset < start:
		return nil, fmt.Errorf("%w: offset %d of partition %d is gone (retention; the partition starts at %d)", ErrNotFound, pos.Offset, pos.Partition, start)
	case pos.Offset >= ends[pos.Partition]:
		return nil, fmt.Errorf("%w: partition %d ends at offset %d", ErrNotFound, pos.Partition, ends[pos.Partition])
	}
	var found *Record
	err = t.read(ctx, t.cfg.DLQTopic, map[int32]int64{pos.Partition: pos.Offset}, map[int32]int64{pos.Partition: pos.Offset + 1},
		func(r *kgo.Record, _, _ int64) error {
			if r != nil && r.Offset == pos.Offset {
				found = decode(r)
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("%w: %s of %s", ErrNotFound, pos, t.cfg.DLQTopic)
	}
	return found, nil
}

// bounds returns, for each partition of topic, the first offset to read (at
// or after since, when set) and the end offset.
func (t *Tool) bounds(ctx context.Context, topic string, since time.Time) (starts, ends map[int32]int64, err error) {
	listed := func(what string, l kadm.ListedOffsets, err error) (map[int32]int64, error) {
		if err != nil {
			return nil, fmt.Errorf("list %s offsets of %s: %w", what, topic, err)
		}
		if err := l.Error(); err != nil {
			if errors.Is(err, kerr.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("%w: %s", ErrNoTopic, topic)
			}
			return nil, fmt.Errorf("list %s offsets of %s: %w", what, topic, err)
		}
		out := map[int32]int64{}
		l.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
		return out, nil
	}
	l, err := t.adm.ListStartOffsets(ctx, topic)
	if starts, err = listed("start", l, err); err != nil {
		return nil, nil, err
	}
	l, err = t.adm.ListEndOffsets(ctx, topic)
	if ends, err = listed("end", l, err); err != nil {
		return nil, nil, err
	}
	if !since.IsZero() {
		l, err = t.adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topic)
		after, err := listed("time", l, err)
		if err != nil {
			return nil, nil, err
		}
		for p, o := range after {
			if o < 0 { // nothing at or after since
				o = ends[p]
			}
			starts[p] = max(starts[p], o)
		}
	}
	return starts, ends, nil
}

// read consumes topic's partitions from starts up to ends with a client of
// its own (no group), calling fn with each record and the offsets read so
// far, and with a nil record after each fetch. A partition is done once its
// record at end-1 was read: the topics it reads (the DLQ, the replays
// topic) are written without transactions, so the last offset below the
// end is a record, never a transaction marker.
func (t *Tool) read(ctx context.Context, topic string, starts, ends map[int32]int64, fn func(r *kgo.Record, scanned, total int64) error) error {
	assign := map[int32]kgo.Offset{}
	next := map[int32]int64{}
	var total int64
	for p, start := range starts {
		if end := ends[p]; start < end {
			assign[p] = kgo.NewOffset().At(start)
			next[p] = start
			total += end - start
		}
	}
	if len(assign) == 0 {
		return fn(nil, 0, 0)
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(t.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: assign}),
		// Records deleted by retention while we read: go on from the
		// partition's new start.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}, t.cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	var scanned int64
	for len(next) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fetches.EachError(func(_ string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("fetch %s partition %d: %w", topic, p, err))
		})
		if ferr != nil {
			return ferr
		}
		var cbErr error
		fetches.EachRecord(func(r *kgo.Record) {
			n, ok := next[r.Partition]
			if !ok || cbErr != nil {
				return
			}
			scanned += r.Offset + 1 - n
			next[r.Partition] = r.Offset + 1
			if r.Offset+1 >= ends[r.Partition] {
				delete(next, r.Partition)
			}
			cbErr = fn(r, scanned, total)
		})
		if cbErr != nil {
			return cbErr
		}
		if err := fn(nil, scanned, total); err != nil {
			return err
		}
	}
	return nil
}
