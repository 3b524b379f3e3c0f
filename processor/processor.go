// Package processor is paystream's consumer group: it applies raw webhook
// records to payments with exactly-once effects.
//
// Each assigned partition gets one Worker that applies its records in
// order, in batches. A batch is committed in one Postgres transaction that
// writes the inbox rows, payment transitions, ledger postings and outbox
// events of its records and advances the partition's stored offset;
// batches of several partitions that are ready at once share a transaction
// (see committer). Postgres, not Kafka,
// holds the offsets that count: on assignment a worker bumps the partition's
// owner epoch and resumes from the stored offset, and every batch checks the
// epoch, so a worker that lost its partition (a zombie) fails its commit
// instead of writing. Offsets are copied to Kafka after commit only so that
// lag tools and autoscalers can read them.
//
// The poll loop never waits long for a worker: one that stays behind (the
// database is slow or down) has its partition's fetching paused, so the
// processor keeps polling, takes part in rebalances and stays in the group.
package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/trace"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/topics"
	"github.com/paystream/paystream/internal/tracing"
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
	// BatchMaxWait is how long a record may wait in its worker's queue for
	// a batch to fill: a batch starts once BatchMaxRecords are queued or
	// its oldest record has waited this long since it was fetched (fetches
	// themselves wait up to half as long for 64 KiB).
	// Records fetched while the previous batch was committing have waited
	// all that time, so under load each transaction takes, at once,
	// everything queued during the one before: batches grow with the load
	// and a slow commit is not followed by a wait. Defaults to 20ms.
	//
	// Each transaction has a fixed cost in Postgres (BEGIN, the offset row
	// lock, a dozen statements, COMMIT's WAL flush), so a longer wait
	// means larger batches and less database CPU per delivery, paid in
	// latency. Measured at 5,000 deliveries/s over 6 partitions on a
	// shared 2-core machine (BenchmarkProcessorWALPaced), with a
	// transaction per partition's batch: 20ms gave ≈26 deliveries per
	// transaction, ≈109 µs Postgres CPU per delivery and a p99 of ≈120 ms
	// from production to the write; 50ms gave ≈63, ≈69 µs and a p99 of
	// ≈630 ms. With partitions sharing transactions (Transactions), 20ms
	// gives ≈56–61, ≈71–79 µs and a p99 of ≈54–58 ms. The default keeps
	// the latency goal (accepted→published p99 ≤ 250 ms); raise it where
	// the database's CPU costs more than the latency.
	BatchMaxWait time.Duration
	// Transactions is how many batch transactions the processor runs at
	// once. A partition's batch that is ready while all of them are busy
	// waits for the next one, which takes every batch waiting then: under
	// load, transactions carry several partitions' batches, which costs
	// Postgres far less per delivery than a transaction per batch (each
	// transaction has a fixed cost: BEGIN, the offset row locks, a dozen
	// statements, COMMIT's WAL flush). More transactions at once means
	// fewer batches in each. Defaults to 1.
	Transactions int
	// MaxBufferedBatches bounds the fetched-but-unapplied records per
	// partition, in batches of BatchMaxRecords; when it is full, polling
	// waits for the worker (for at most 2 s; then fetching that partition
	// pauses until the worker catches up), so memory does not grow with the
	// backlog. Defaults to 4.
	MaxBufferedBatches int
	// OffsetCopyInterval is how often stored offsets are copied to the
	// group's Kafka offsets (for lag tools and autoscalers) and the lag
	// gauge is refreshed from the broker's end offsets, whose partition
	// count is checked against the recorded one. Defaults to 1s.
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
	// InstanceID makes the processor a static group member (KIP-345): a
	// member that restarts with the same InstanceID within SessionTimeout
	// gets its partitions back without a rebalance of the others. Each
	// replica needs its own, stable ID (a StatefulSet pod name). Defaults
	// to none: a dynamic member, whose restart rebalances the group.
	InstanceID string
	// IdleInTransactionTimeout is how long Postgres keeps a batch
	// transaction open while its processor sends nothing (frozen, paused,
	// cut off): then it ends the session, so the partition's next owner
	// can claim it, and the frozen processor's commit fails when it wakes.
	// A claim that waits longer than this for the previous owner ends that
	// owner's session itself. Keep it well above a batch's longest pause
	// between statements (a refetch happens before the transaction, not
	// inside it). Negative disables both. Defaults to 5s.
	IdleInTransactionTimeout time.Duration
	// KafkaOpts are extra franz-go options (TLS, SASL, metrics hooks).
	KafkaOpts []kgo.Opt
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the processor's metrics. Defaults to a private registry.
	Registerer prometheus.Registerer
	// DeliveryRetention is how long deliveries are kept (see
	// RetentionConfig). Defaults to 14 days.
	DeliveryRetention time.Duration
	// DedupRetention is how long dedup keys are kept (see
	// RetentionConfig). Defaults to 35 days.
	DedupRetention time.Duration
	// RetentionInterval is how often the processor runs Retention (one
	// replica at a time, under an advisory lock); negative: never.
	// Defaults to 1h.
	RetentionInterval time.Duration
	// Now is the clock: delivery and dedup-key times, retention. Defaults
	// to time.Now.
	Now func() time.Time
	// TracerProvider traces each batch transaction: a span linked to the
	// trace context of each of its records (their W3C traceparent header),
	// whose own context the batch's state events carry as their
	// traceparent header. Nil or a no-op provider turns tracing off, at
	// no cost.
	TracerProvider trace.TracerProvider
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
	if c.Transactions == 0 {
		c.Transactions = 1
	}
	if c.Transactions < 0 {
		return fmt.Errorf("processor config: Transactions %d must be positive", c.Transactions)
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
	if c.IdleInTransactionTimeout == 0 {
		c.IdleInTransactionTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = time.Hour
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

const (
	// maxPollWait bounds one poll, so the poll loop lets the group
	// rebalance at least this often (BlockRebalanceOnPoll) however idle or
	// paused the partitions are.
	maxPollWait = 500 * time.Millisecond
	// stuckAfter is how long the poll loop waits for a worker whose queue
	// is full before it pauses that worker's partition instead; see Worker.
	stuckAfter = 2 * time.Second
	// offsetCopyTimeout bounds one copy of offsets to Kafka and one read of
	// end offsets.
	offsetCopyTimeout = 5 * time.Second
)

// MaxConns is the Postgres pool size a processor needs to own every one
// of partitions partitions at once (the other replicas may be down): a
// connection per partition for its worker's batch transactions and one for
// its sweeper, plus three for claims, the metrics queries and headroom.
func MaxConns(partitions int) int32 {
	return int32(2*max(partitions, 1) + 3)
}

// Processor consumes the raw topic as a member of a consumer group.
type Processor struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *metrics
	applier *applier
	commits *committer
	refetch *refetcher   // nil when no source refetches
	tracer  trace.Tracer // nil: tracing off
	kcl     atomic.Pointer[kgo.Client]

	mu      sync.Mutex
	workers map[int32]*Worker           // by partition of cfg.Topic
	offsets map[int32]*partitionOffsets // by partition, while assigned

	// copyMu serializes copies to Kafka, so a revoke's final copy is never
	// overtaken by an older periodic one.
	copyMu  sync.Mutex
	copyNow chan struct{} // asks the copy loop for a copy now (capacity 1)
	room    chan struct{} // a full worker's queue has room (capacity 1)

	// stopRun ends Run with an error (ErrOffsetRolledBack,
	// topics.ErrPartitionsChanged); set by Run before any worker starts.
	stopRun context.CancelCauseFunc
	// recordedPartitions is the raw topic's partition count paystream
	// migrate recorded (see partitions.go).
	recordedPartitions atomic.Int32

	// retention gets the outcome of retentionLoop's runs.
	retention *RetentionMetrics
}

// partitionOffsets is what the processor knows of an assigned partition's
// offsets. It outlives the partition's worker: a stopped or fenced worker's
// last stored offset is still copied to Kafka.
type partitionOffsets struct {
	stored int64 // next offset stored in Postgres; -1 before the first
	copied int64 // last offset copied to Kafka; -1 before the first
	end    int64 // the broker's high watermark as last seen; -1 unknown
}

// New validates cfg and returns a Processor writing to pool.
func New(pool *pgxpool.Pool, cfg Config) (*Processor, error) {
	if pool == nil {
		return nil, errors.New("processor: pool is required")
	}
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	rc := RetentionConfig{DeliveryRetention: cfg.DeliveryRetention, DedupRetention: cfg.DedupRetention}
	if err := rc.defaults(); err != nil {
		return nil, fmt.Errorf("processor config: %w", err)
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
		applier: &applier{now: cfg.Now, idleTimeout: max(cfg.IdleInTransactionTimeout, 0)},
		workers: map[int32]*Worker{},
		offsets: map[int32]*partitionOffsets{},
		copyNow: make(chan struct{}, 1),
		room:    make(chan struct{}, 1),
		tracer:  tracing.Tracer(cfg.TracerProvider, tracerName),
	}
	if p.retention, err = NewRetentionMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	p.commits = newCommitter(p, cfg.Transactions)
	if len(cfg.Refetch) > 0 {
		p.refetch = newRefetcher(cfg.Refetch, cfg.HTTPClient, cfg.Logger, m)
	}
	return p, nil
}

// Run joins the group and processes until ctx is canceled, then finishes
// in-flight batches, leaves the group and returns nil. It returns an error
// if it cannot run at all, or, after the same orderly stop, when a
// partition's stored offset went back (ErrOffsetRolledBack): restarting it
// then resumes every partition from Postgres.
func (p *Processor) Run(ctx context.Context) error {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	p.stopRun = stop
	p.loadRecordedPartitions(ctx, true)
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
		kgo.OnPartitionsRevoked(p.revoked),
		kgo.OnPartitionsLost(p.lost),
		// Bounded buffering: one fetch in flight, a few MiB each, so memory
		// does not grow with the backlog (see MaxBufferedBatches).
		kgo.FetchMaxBytes(4 << 20),
		kgo.FetchMaxPartitionBytes(1 << 20),
		kgo.MaxConcurrentFetches(1),
		// Fewer, fuller fetches: the broker answers once 64 KiB are ready
		// or half the batch wait has passed, instead of at once with the
		// few records that arrived since the last answer. Under load that
		// is a fetch per ~40 records instead of one per few (bench-e2e:
		// processor CPU per delivery ≈ 85 → ≈ 70 µs); when quiet it adds
		// at most half of --batch-max-wait (but 10 ms, franz-go's least)
		// to a record's latency, and an idle processor fetches that often
		// instead of every 5 s. (Counting the batch wait from the
		// record's Kafka timestamp instead, so the two waits overlap, was
		// measured and not kept: batches halved, Postgres's CPU per
		// delivery rose by a quarter, p99 did not improve.)
		kgo.FetchMinBytes(64 << 10),
		kgo.FetchMaxWait(max(p.cfg.BatchMaxWait/2, 10*time.Millisecond)),
	}, p.cfg.KafkaOpts...)
	if p.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(p.cfg.InstanceID))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	p.kcl.Store(cl)
	p.log.Info("processor started", "topic", p.cfg.Topic, "group", p.cfg.Group)

	copyCtx, stopCopy := context.WithCancel(context.Background())
	copyDone := make(chan struct{})
	go func() {
		defer close(copyDone)
		p.copyOffsetsLoop(copyCtx, cl)
	}()
	go p.metrics.observeLoop(copyCtx, p.pool, p.cfg.DeferredWindow)
	retentionDone := make(chan struct{})
	go func() {
		defer close(retentionDone)
		p.retentionLoop(copyCtx)
	}()

	for {
		if p.waitForRoom(ctx) {
			cl.AllowRebalance()
			continue
		}
		// A bounded wait, so that AllowRebalance runs at least every
		// maxPollWait even when every partition is paused or idle.
		pollCtx, cancelPoll := context.WithTimeout(ctx, maxPollWait)
		fetches := cl.PollRecords(pollCtx, p.cfg.BatchMaxRecords*p.cfg.MaxBufferedBatches)
		cancelPoll()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) {
				return // the bounded wait ended
			}
			p.log.Error("fetch failed", "topic", topic, "partition", partition, "error", err)
			p.metrics.fetchErrors.Inc()
		})
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
			if len(ftp.Records) == 0 {
				return
			}
			p.mu.Lock()
			w := p.workers[ftp.Partition]
			if o := p.offsets[ftp.Partition]; o != nil {
				o.end = max(o.end, ftp.HighWatermark)
			}
			p.mu.Unlock()
			if w == nil {
				return // not ours any more; the new owner resumes from Postgres
			}
			w.enqueue(ftp.Records) // never waits; see waitForRoom
		})
		cl.AllowRebalance()
	}

	stopCopy()
	<-copyDone
	<-retentionDone
	p.stopWorkers(p.allPartitions())
	// The last copy happens before leaving the group, while the group still
	// accepts our commits.
	copyCtx, cancelCopy := context.WithTimeout(context.Background(), offsetCopyTimeout)
	p.copyOffsets(copyCtx, cl, nil)
	cancelCopy()
	// Leaving the group revokes our partitions, which BlockRebalanceOnPoll
	// holds back until the poll loop allows it.
	cl.AllowRebalance()
	cl.Close()
	if err := context.Cause(ctx); errors.Is(err, ErrOffsetRolledBack) {
		p.log.Error("processor stopped: restart it to resume from Postgres's offsets", "error", err)
		return err
	} else if errors.Is(err, topics.ErrPartitionsChanged) {
		return err
	}
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
			if p.beyondRecorded(partition) {
				continue // the processor stops; a partition added since is never claimed
			}
			c, err := p.claimPartition(ctx, topic, partition)
			if err != nil {
				return nil, err
			}
			epoch, next, fresh := c.epoch, c.next, c.fresh
			if fresh {
				parts[partition] = kgo.NewOffset().AtStart()
			} else {
				parts[partition] = kgo.NewOffset().At(next).WithEpoch(-1)
			}
			w := newWorker(p, topic, partition, epoch, next)
			p.mu.Lock()
			if old := p.workers[partition]; old != nil {
				p.mu.Unlock()
				old.stop()
				p.mu.Lock()
			}
			p.workers[partition] = w
			// Seeded from the claim: after a restart with nothing new to
			// consume, the stored offset is still copied to Kafka.
			stored := next
			if fresh {
				stored = -1
			}
			p.offsets[partition] = &partitionOffsets{stored: stored, copied: -1, end: -1}
			p.mu.Unlock()
			go w.run()
			p.metrics.partitionEvents.WithLabelValues("assigned").Inc()
			p.log.Info("partition assigned", "partition", partition, "epoch", epoch, "resume_offset", next, "fresh", fresh)
		}
	}
	select {
	case p.copyNow <- struct{}{}:
	default:
	}
	return offsets, nil
}

// revoked stops the workers of partitions the group is taking away: each
// goes on committing the full batches it has queued (its queue is bounded,
// so this is bounded too), abandons a commit that is fenced, and drops a
// last partial batch; the next owner resumes from the stored offset. Their stored offsets are copied to Kafka one last time
// before the partitions are given up.
func (p *Processor) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	partitions := revoked[p.cfg.Topic]
	p.stopWorkers(partitions)
	ctx, cancel := context.WithTimeout(ctx, offsetCopyTimeout)
	p.copyOffsets(ctx, cl, partitions)
	cancel()
	p.release(cl, partitions, "revoked")
}

// lost stops the workers of partitions the group gave to others without a
// revoke (this member was evicted): no offset is copied, the group no
// longer takes our commits.
func (p *Processor) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	partitions := lost[p.cfg.Topic]
	p.stopWorkers(partitions)
	p.copyMu.Lock() // no periodic copy of these partitions is in flight after this
	p.release(cl, partitions, "lost")
	p.copyMu.Unlock()
}

// release forgets partitions whose workers are stopped and resumes their
// fetching, in case a full or fenced worker paused it: pausing outlives an
// assignment, and the partition may come back.
func (p *Processor) release(cl *kgo.Client, partitions []int32, event string) {
	p.mu.Lock()
	for _, partition := range partitions {
		delete(p.offsets, partition)
		p.metrics.lag.DeleteLabelValues(partitionLabel(partition))
	}
	p.mu.Unlock()
	if len(partitions) > 0 {
		cl.ResumeFetchPartitions(map[string][]int32{p.cfg.Topic: partitions})
		p.metrics.partitionEvents.WithLabelValues(event).Add(float64(len(partitions)))
	}
}

// fenced takes a fenced worker out of the worker set at once: a newer owner
// claimed its partition in Postgres, so fetching it stops (records already
// fetched are dropped; a later assignment resumes from the stored offset)
// and its offsets are no longer copied. Kafka revokes the partition later.
func (p *Processor) fenced(w *Worker) {
	p.mu.Lock()
	if p.workers[w.partition] != w {
		p.mu.Unlock()
		return
	}
	delete(p.workers, w.partition)
	delete(p.offsets, w.partition)
	p.metrics.lag.DeleteLabelValues(partitionLabel(w.partition))
	p.mu.Unlock()
	p.pauseFetch(w.partition)
}

// stored records the offset a worker's commit stored in Postgres and
// updates the partition's lag.
func (p *Processor) stored(partition int32, next int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.offsets[partition]
	if o == nil {
		return
	}
	o.stored = max(o.stored, next)
	p.setLag(partition, o)
}

// setLag sets the lag gauge of an assigned partition: the records between
// the offset stored in Postgres, the one that counts, and the high
// watermark. p.mu must be held.
func (p *Processor) setLag(partition int32, o *partitionOffsets) {
	if o.end < 0 {
		return
	}
	p.metrics.lag.WithLabelValues(partitionLabel(partition)).Set(float64(max(o.end-max(o.stored, 0), 0)))
}

// waitForRoom is the poll loop's backpressure: while a worker's queue is
// full (and not yet stuck, see Worker.full) it waits, for at most
// maxPollWait, for room, and reports true; otherwise it reports false at
// once and the loop polls.
func (p *Processor) waitForRoom(ctx context.Context) bool {
	p.mu.Lock()
	workers := slices.Collect(maps.Values(p.workers))
	p.mu.Unlock()
	full := false
	for _, w := range workers {
		full = w.full(stuckAfter) || full
	}
	if !full {
		return false
	}
	t := time.NewTimer(maxPollWait)
	defer t.Stop()
	select {
	case <-p.room:
	case <-t.C:
	case <-ctx.Done():
	}
	return true
}

// roomMade wakes the poll loop waiting in waitForRoom.
func (p *Processor) roomMade() {
	select {
	case p.room <- struct{}{}:
	default:
	}
}

// pauseFetch stops fetching partition; see Worker.
func (p *Processor) pauseFetch(partition int32) {
	if cl := p.kcl.Load(); cl != nil {
		cl.PauseFetchPartitions(map[string][]int32{p.cfg.Topic: {partition}})
	}
}

// resumeFetch undoes pauseFetch.
func (p *Processor) resumeFetch(partition int32) {
	if cl := p.kcl.Load(); cl != nil {
		cl.ResumeFetchPartitions(map[string][]int32{p.cfg.Topic: {partition}})
	}
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

// copyOffsetsLoop copies stored offsets to Kafka and refreshes the lag
// gauge every OffsetCopyInterval, and copies right after an assignment.
func (p *Processor) copyOffsetsLoop(ctx context.Context, cl *kgo.Client) {
	adm := kadm.NewClient(cl)
	t := time.NewTicker(p.cfg.OffsetCopyInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.refreshLag(ctx, adm)
		case <-p.copyNow:
		}
		cctx, cancel := context.WithTimeout(ctx, offsetCopyTimeout)
		p.copyOffsets(cctx, cl, nil)
		cancel()
	}
}

// refreshLag reads the topic's end offsets from the broker, so the lag
// gauge keeps moving while nothing commits (the database is down) and
// nothing is fetched (the partition is paused), and checks the topic's
// partition count against the recorded one (checkPartitions).
func (p *Processor) refreshLag(ctx context.Context, adm *kadm.Client) {
	ctx, cancel := context.WithTimeout(ctx, offsetCopyTimeout)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, p.cfg.Topic)
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("list end offsets for lag failed", "topic", p.cfg.Topic, "error", err)
		}
		return
	}
	var live int32
	for partition := range ends[p.cfg.Topic] {
		if partition >= 0 {
			live++
		}
	}
	p.mu.Lock()
	ends.Each(func(lo kadm.ListedOffset) {
		if o := p.offsets[lo.Partition]; o != nil && lo.Err == nil {
			o.end = max(o.end, lo.Offset)
			p.setLag(lo.Partition, o)
		}
	})
	p.mu.Unlock()
	p.checkPartitions(ctx, live)
}

// copyOffsets copies the stored offsets of partitions (nil: every assigned
// partition) that changed since their last copy to the group's Kafka
// offsets, and waits for the broker's answer. A partition whose copy failed
// (the request, or its own error code in the response) is retried at the
// next copy.
func (p *Processor) copyOffsets(ctx context.Context, cl *kgo.Client, partitions []int32) {
	p.copyMu.Lock()
	defer p.copyMu.Unlock()
	todo := map[int32]kgo.EpochOffset{}
	p.mu.Lock()
	for partition, o := range p.offsets {
		if partitions != nil && !slices.Contains(partitions, partition) {
			continue
		}
		if o.stored >= 0 && o.stored != o.copied {
			todo[partition] = kgo.EpochOffset{Epoch: -1, Offset: o.stored}
		}
	}
	p.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	var failed int
	var firstErr error
	fail := func(n int, err error) {
		failed += n
		if firstErr == nil {
			firstErr = err
		}
	}
	cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: todo},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				fail(len(todo), err)
				return
			}
			answered := 0
			p.mu.Lock()
			defer p.mu.Unlock()
			for _, t := range resp.Topics {
				for _, rp := range t.Partitions {
					eo, asked := todo[rp.Partition]
					if t.Topic != p.cfg.Topic || !asked {
						continue
					}
					answered++
					if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
						fail(1, fmt.Errorf("partition %d: %w", rp.Partition, err))
						continue
					}
					if o := p.offsets[rp.Partition]; o != nil {
						o.copied = eo.Offset
					}
				}
			}
			if answered < len(todo) {
				fail(len(todo)-answered, errors.New("partitions missing from the response"))
			}
		})
	if failed > 0 {
		p.metrics.offsetCopyFailures.Add(float64(failed))
		p.log.Warn("copy offsets to kafka failed; lag tools see stale offsets until the next copy",
			"partitions", failed, "error", firstErr)
	}
}
