// Package processor is paystream's consumer group: it applies raw webhook
// records to payments with exactly-once effects.
//
// Each assigned partition gets one Worker that applies its records in
// order, in batches. A batch is committed in one Postgres transaction that
// writes the deliveries, payment transitions, ledger movements and state
// events of its records and advances the partition's stored offset
// (batch.go); batches of several partitions that are ready at once share
// a transaction (group.go). Postgres, not Kafka, holds the offsets that
// count (rebalance.go): on assignment a worker bumps the partition's
// owner epoch and resumes from the stored offset, and every batch checks the
// epoch, so a worker that lost its partition (a zombie) fails its commit
// instead of writing. Offsets are copied to Kafka after commit only so that
// lag tools and autoscalers can read them (offsetcopy.go).
//
// The poll loop (run.go) never waits long for a worker: one that stays
// behind (the database is slow or down) has its partition's fetching
// paused, so the processor keeps polling, takes part in rebalances and
// stays in the group (backpressure.go). The processor decides; package
// store makes the round trips (apply.go is decisions only, no I/O).
package processor

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/paystream/paystream/internal/tracing"
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

// New validates cfg and returns a Processor writing to pool.
func New(pool *pgxpool.Pool, cfg Config) (*Processor, error) {
	if pool == nil {
		return nil, errors.New("processor: pool is required")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
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
