package simulate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// SamplerConfig configures a Sampler.
type SamplerConfig struct {
	// Pool reads the target's consumer_offsets (its search_path the
	// target's schema). Required.
	Pool *pgxpool.Pool
	// Group and Topic are the processor's group and raw topic. Required.
	Group, Topic string
	// Brokers, when set, let the sampler read the raw topic's end offsets
	// too, to tell a stall (a backlog and no progress) from an idle
	// pipeline. Without them every pause counts as a stall.
	Brokers []string
	// KafkaOpts are extra franz-go options for the client reading the end
	// offsets, e.g. TLS and SASL from internal/kafkaconn. Defaults to none.
	KafkaOpts []kgo.Opt
	// Interval is the time between polls. Defaults to 100ms.
	Interval time.Duration
}

// Sampler polls the stored offsets while a simulation runs: each
// partition's next_offset and owner_epoch must never decrease (I4, I5),
// and the pipeline must progress while it has a backlog (I9).
type Sampler struct {
	cfg SamplerConfig

	startOnce, stopOnce sync.Once
	stop                chan struct{}
	done                chan struct{}

	mu      sync.Mutex
	summary SampleSummary
}

// SampleSummary is what a Sampler saw.
type SampleSummary struct {
	Polls int `json:"polls"`
	// Failed counts polls that could not read (a database outage is a
	// fault the simulation may be injecting).
	Failed int `json:"failed"`
	// OffsetRegressions and EpochRegressions describe every decrease seen.
	OffsetRegressions []string `json:"offset_regressions,omitempty"`
	EpochRegressions  []string `json:"epoch_regressions,omitempty"`
	// LongestStall is the longest time with a backlog (or, without
	// brokers, any time) during which no stored offset advanced.
	LongestStall time.Duration `json:"longest_stall_ns"`
	// Advanced is how many records the stored offsets moved over in all.
	Advanced int64         `json:"advanced"`
	Span     time.Duration `json:"span_ns"`
}

// NewSampler validates cfg and returns a stopped Sampler.
func NewSampler(cfg SamplerConfig) (*Sampler, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("sampler config: Pool is required")
	case cfg.Group == "" || cfg.Topic == "":
		return nil, errors.New("sampler config: Group and Topic are required")
	}
	cfg.Interval = cmp.Or(cfg.Interval, 100*time.Millisecond)
	return &Sampler{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start starts polling; calling it again does nothing.
func (s *Sampler) Start() {
	s.startOnce.Do(func() { go s.run() })
}

// Stop stops polling and returns what the sampler saw; calling it again
// returns the same. A sampler never started returns an empty summary.
func (s *Sampler) Stop() SampleSummary {
	s.stopOnce.Do(func() {
		close(s.stop)
		started := true
		s.startOnce.Do(func() { started = false })
		if started {
			<-s.done
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.summary
}

// Summary returns what the sampler saw so far.
func (s *Sampler) Summary() SampleSummary {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := s.summary
	sum.OffsetRegressions = slices.Clone(sum.OffsetRegressions)
	sum.EpochRegressions = slices.Clone(sum.EpochRegressions)
	return sum
}

func (s *Sampler) run() {
	defer close(s.done)
	var adm *kadm.Client
	if len(s.cfg.Brokers) > 0 {
		if cl, err := kgo.NewClient(kafkaClientOpts(s.cfg.Brokers, s.cfg.KafkaOpts)...); err == nil {
			defer cl.Close()
			adm = kadm.NewClient(cl)
		}
	}
	lastOff, lastEpoch := map[int32]int64{}, map[int32]int64{}
	begin := time.Now()
	progressAt := begin
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*s.cfg.Interval+time.Second)
		offs, epochs, err := storedOffsets(ctx, s.cfg.Pool, s.cfg.Group, s.cfg.Topic)
		backlog := true
		if err == nil && adm != nil {
			if ends, lerr := adm.ListEndOffsets(ctx, s.cfg.Topic); lerr == nil {
				backlog = false
				ends.Each(func(o kadm.ListedOffset) {
					if o.Err == nil && o.Offset > offs[o.Partition] {
						backlog = true
					}
				})
			}
		}
		cancel()
		now := time.Now()
		s.mu.Lock()
		s.summary.Polls++
		s.summary.Span = now.Sub(begin)
		if err != nil {
			s.summary.Failed++
		} else {
			advanced := false
			for p, off := range offs {
				prev, seen := lastOff[p]
				switch {
				case seen && off < prev:
					s.summary.OffsetRegressions = append(s.summary.OffsetRegressions, fmt.Sprintf("partition %d: stored offset %d after %d", p, off, prev))
				case seen && off > prev:
					s.summary.Advanced += off - prev
					advanced = true
				}
				if e, ok := lastEpoch[p]; ok && epochs[p] < e {
					s.summary.EpochRegressions = append(s.summary.EpochRegressions, fmt.Sprintf("partition %d: owner epoch %d after %d", p, epochs[p], e))
				}
				lastOff[p], lastEpoch[p] = off, epochs[p]
			}
			if advanced || !backlog {
				progressAt = now
			}
		}
		s.summary.LongestStall = max(s.summary.LongestStall, now.Sub(progressAt))
		s.mu.Unlock()
	}
}

// storedOffsets reads a group's stored next offsets and owner epochs.
func storedOffsets(ctx context.Context, pool *pgxpool.Pool, group, topic string) (offs, epochs map[int32]int64, err error) {
	rows, err := pool.Query(ctx, `SELECT partition, next_offset, owner_epoch FROM consumer_offsets WHERE group_id = $1 AND topic = $2`, group, topic)
	if err != nil {
		return nil, nil, fmt.Errorf("read stored offsets: %w", err)
	}
	defer rows.Close()
	offs, epochs = map[int32]int64{}, map[int32]int64{}
	for rows.Next() {
		var p int32
		var off, epoch int64
		if err := rows.Scan(&p, &off, &epoch); err != nil {
			return nil, nil, fmt.Errorf("read stored offsets: %w", err)
		}
		offs[p], epochs[p] = off, epoch
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read stored offsets: %w", err)
	}
	return offs, epochs, nil
}

// kafkaClientOpts are the options of every Kafka client here: the seed
// brokers, then the caller's (TLS, SASL).
func kafkaClientOpts(brokers []string, extra []kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, extra...)
}

// endOffsets returns each partition of topic's end offset, read by a
// client with opts.
func endOffsets(ctx context.Context, opts []kgo.Opt, topic string) (map[int32]int64, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, nil
}
