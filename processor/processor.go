// Package processor is paystream's consumer group: it applies raw webhook
// records to payments with exactly-once effects.
//
// Each assigned partition gets one Worker that applies its records in
// order, in batches. A batch is one Postgres transaction that writes the
// inbox rows, payment transitions, ledger postings and outbox events of its
// records and advances the partition's stored offset. Postgres, not Kafka,
// holds the offsets that count: on assignment a worker bumps the partition's
// owner epoch and resumes from the stored offset, and every batch checks the
// epoch, so a worker that lost its partition (a zombie) fails its commit
// instead of writing. Offsets are copied to Kafka after commit only so that
// lag tools and autoscalers can read them.
package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/source"
)

// Config configures a Processor.
type Config struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// Topic is the raw webhook topic. Defaults to paystream.webhooks.raw.v1.
	Topic string
	// Group is the consumer group. Defaults to paystream-processor.
	Group string
	// BatchMaxRecords caps the records applied in one transaction. Defaults to 500.
	BatchMaxRecords int
	// BatchMaxWait is how long a worker waits to fill a batch once it has
	// at least one record. Defaults to 20ms.
	BatchMaxWait time.Duration
	// MaxBufferedBatches bounds the fetched-but-unapplied record batches per
	// partition; when it is full, polling waits, so memory does not grow
	// with the backlog. Defaults to 4.
	MaxBufferedBatches int
	// OffsetCopyInterval is how often stored offsets are copied to Kafka.
	// Defaults to 1s.
	OffsetCopyInterval time.Duration
	// RetryBackoffMax caps the backoff between retries of a failed batch.
	// Defaults to 5s.
	RetryBackoffMax time.Duration
	// DeferredWindow is how long an event may wait for its predecessor
	// before it is overdue: refetched where the source supports it, and
	// counted in paystream_processor_deferred_overdue_events for review.
	// Defaults to 1h.
	DeferredWindow time.Duration
	// Refetch configures, by source name, the sources whose payments are
	// read back from the gateway's API (their events are thin or unsigned).
	// Defaults to none: such events wait as deferred:awaiting_refetch.
	Refetch map[string]*source.RefetchConfig
	// RefetchRetry is how long a failed refetch waits before the next try.
	// Defaults to 30s.
	RefetchRetry time.Duration
	// HTTPClient makes refetch requests. Defaults to a client with no
	// timeout of its own (each request has the source's refetch_timeout).
	HTTPClient *http.Client
	// SessionTimeout is how long the group waits for a silent member (a
	// crashed processor) before giving its partitions to others. Defaults
	// to 45s.
	SessionTimeout time.Duration
	// KafkaOpts are extra franz-go options (TLS, SASL, metrics hooks).
	KafkaOpts []kgo.Opt
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the processor's metrics. Defaults to a private registry.
	Registerer prometheus.Registerer
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

func (c *Config) withDefaults() error {
	if len(c.Brokers) == 0 {
		return errors.New("processor config: Brokers is required")
	}
	if c.Topic == "" {
		c.Topic = envelope.TopicRaw
	}
	if c.Group == "" {
		c.Group = "paystream-processor"
	}
	if c.BatchMaxRecords == 0 {
		c.BatchMaxRecords = 500
	}
	if c.BatchMaxRecords < 0 {
		return fmt.Errorf("processor config: BatchMaxRecords %d must be positive", c.BatchMaxRecords)
	}
	if c.BatchMaxWait == 0 {
		c.BatchMaxWait = 20 * time.Millisecond
	}
	if c.MaxBufferedBatches == 0 {
		c.MaxBufferedBatches = 4
	}
	if c.OffsetCopyInterval == 0 {
		c.OffsetCopyInterval = time.Second
	}
	if c.RetryBackoffMax == 0 {
		c.RetryBackoffMax = 5 * time.Second
	}
	if c.DeferredWindow == 0 {
		c.DeferredWindow = time.Hour
	}
	if c.RefetchRetry == 0 {
		c.RefetchRetry = 30 * time.Second
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 45 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Processor consumes the raw topic as a member of a consumer group.
type Processor struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *metrics
	applier *applier
	refetch *refetcher // nil when no source refetches

	mu      sync.Mutex
	workers map[int32]*Worker // by partition of cfg.Topic
	copied  map[int32]int64   // offsets already copied to Kafka
}

// New validates cfg and returns a Processor writing to pool.
func New(pool *pgxpool.Pool, cfg Config) (*Processor, error) {
	if pool == nil {
		return nil, errors.New("processor: pool is required")
	}
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	p := &Processor{
		cfg:     cfg,
		pool:    pool,
		log:     cfg.Logger,
		metrics: m,
		applier: &applier{now: cfg.Now},
		workers: map[int32]*Worker{},
		copied:  map[int32]int64{},
	}
	if len(cfg.Refetch) > 0 {
		p.refetch = newRefetcher(cfg.Refetch, cfg.HTTPClient, cfg.Logger, m)
	}
	return p, nil
}

// Run joins the group and processes until ctx is canceled, then finishes
// in-flight batches, leaves the group and returns nil. It returns an error
// only if it cannot run at all.
func (p *Processor) Run(ctx context.Context) error {
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.ConsumerGroup(p.cfg.Group),
		kgo.ConsumeTopics(p.cfg.Topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.SessionTimeout(p.cfg.SessionTimeout),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		// Offsets come from Postgres; a stored offset Kafka no longer has
		// must fail loudly, never silently skip or replay.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.AdjustFetchOffsetsFn(p.assign),
		kgo.OnPartitionsRevoked(p.revoke),
		kgo.OnPartitionsLost(p.revoke),
		// Bounded buffering: one fetch in flight, a few MiB each, so memory
		// does not grow with the backlog (see MaxBufferedBatches).
		kgo.FetchMaxBytes(4 << 20),
		kgo.FetchMaxPartitionBytes(1 << 20),
		kgo.MaxConcurrentFetches(1),
	}, p.cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	p.log.Info("processor started", "topic", p.cfg.Topic, "group", p.cfg.Group)

	copyCtx, stopCopy := context.WithCancel(context.Background())
	copyDone := make(chan struct{})
	go func() {
		defer close(copyDone)
		p.copyOffsetsLoop(copyCtx, cl)
	}()
	go p.metrics.observeLoop(copyCtx, p.pool, p.cfg.DeferredWindow)
	go p.sweepLoop(copyCtx)

	for {
		fetches := cl.PollRecords(ctx, p.cfg.BatchMaxRecords*p.cfg.MaxBufferedBatches)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			p.log.Error("fetch failed", "topic", topic, "partition", partition, "error", err)
			p.metrics.fetchErrors.Inc()
		})
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
			if len(ftp.Records) == 0 {
				return
			}
			p.mu.Lock()
			w := p.workers[ftp.Partition]
			p.mu.Unlock()
			if w == nil {
				return // not ours any more; the new owner resumes from Postgres
			}
			w.highWatermark.Store(ftp.HighWatermark)
			w.enqueue(ctx, ftp.Records)
		})
		cl.AllowRebalance()
	}

	p.stopWorkers(p.allPartitions())
	stopCopy()
	<-copyDone
	p.copyOffsets(context.Background(), cl)
	// Leaving the group revokes our partitions, which BlockRebalanceOnPoll
	// holds back until the poll loop allows it.
	cl.AllowRebalance()
	cl.Close()
	p.log.Info("processor stopped")
	return nil
}

// assign is called after the group assigned partitions and before fetching
// starts: it claims each partition in Postgres (bumping its epoch), starts a
// worker for it and points fetching at the stored offset.
func (p *Processor) assign(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	for topic, parts := range offsets {
		if topic != p.cfg.Topic {
			continue
		}
		for partition := range parts {
			var epoch, next int64
			var fresh bool
			err := retry(ctx, p.cfg.RetryBackoffMax, func() error {
				var err error
				epoch, next, fresh, err = claim(ctx, p.pool, p.cfg.Group, topic, partition)
				if err != nil {
					p.log.Warn("claim partition failed, retrying", "partition", partition, "error", err)
				}
				return err
			})
			if err != nil {
				return nil, err
			}
			if fresh {
				parts[partition] = kgo.NewOffset().AtStart()
			} else {
				parts[partition] = kgo.NewOffset().At(next).WithEpoch(-1)
			}
			w := newWorker(p, topic, partition, epoch)
			p.mu.Lock()
			if old := p.workers[partition]; old != nil {
				p.mu.Unlock()
				old.stop()
				p.mu.Lock()
			}
			p.workers[partition] = w
			p.mu.Unlock()
			go w.run()
			p.log.Info("partition assigned", "partition", partition, "epoch", epoch, "resume_offset", next, "fresh", fresh)
		}
	}
	return offsets, nil
}

// revoke stops the workers of revoked or lost partitions: each finishes the
// batch it is committing (or abandons it, if the commit is fenced) and drops
// what it had buffered; the next owner resumes from the stored offset.
func (p *Processor) revoke(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	p.stopWorkers(revoked[p.cfg.Topic])
}

func (p *Processor) stopWorkers(partitions []int32) {
	var wg sync.WaitGroup
	for _, partition := range partitions {
		p.mu.Lock()
		w := p.workers[partition]
		delete(p.workers, partition)
		p.mu.Unlock()
		if w == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.stop()
			p.log.Info("partition released", "partition", partition)
		}()
	}
	wg.Wait()
}

func (p *Processor) allPartitions() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int32, 0, len(p.workers))
	for partition := range p.workers {
		out = append(out, partition)
	}
	return out
}

// copyOffsetsLoop copies stored offsets to Kafka every OffsetCopyInterval.
func (p *Processor) copyOffsetsLoop(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(p.cfg.OffsetCopyInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.copyOffsets(ctx, cl)
		}
	}
}

func (p *Processor) copyOffsets(ctx context.Context, cl *kgo.Client) {
	p.mu.Lock()
	todo := map[int32]kgo.EpochOffset{}
	for partition, w := range p.workers {
		if next := w.next.Load(); next > 0 && next != p.copied[partition] {
			todo[partition] = kgo.EpochOffset{Epoch: -1, Offset: next}
		}
	}
	p.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cl.CommitOffsets(ctx, map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: todo}, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			p.log.Debug("copy offsets to kafka failed", "error", err)
			return
		}
		p.mu.Lock()
		for partition, eo := range todo {
			p.copied[partition] = eo.Offset
		}
		p.mu.Unlock()
	})
}

// retry runs fn until it succeeds or ctx ends, backing off exponentially up
// to maxBackoff.
func retry(ctx context.Context, maxBackoff time.Duration, fn func() error) error {
	backoff := 50 * time.Millisecond
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
	}
}
