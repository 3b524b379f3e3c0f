// Package sink relays committed outbox rows to the normalized payment-state
// topic. One Relay is active at a time (it holds a Postgres advisory lock);
// others wait as standbys. Rows are produced in id order, which per payment
// is commit order, keyed by payment so each payment's events stay in order
// on one partition, with the stable event id "{payment key}:{version}" in a
// header. A row is marked published only after the broker acknowledged it,
// so a crash in between re-publishes it: consumers see a repeated event id,
// never a lost or reordered event.
package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
)

// relayLockClass is the first key of the advisory lock the active relay
// holds ("psnk"); the second is the outbox table's OID, so the lock is one
// per outbox — per schema — not one per database, and relays of different
// schemas in one database (tests, shards) do not wait on each other.
const relayLockClass = 0x70736e6b

// The relay lock's statements; 'outbox' resolves through the search_path.
const (
	tryLockSQL = "SELECT pg_try_advisory_lock($1, 'outbox'::regclass::oid::int4)"
	unlockSQL  = "SELECT pg_advisory_unlock($1, 'outbox'::regclass::oid::int4)"
)

// Config configures a Relay.
type Config struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// Topic is the normalized topic. Defaults to paystream.payments.state.v1.
	Topic string
	// BatchSize caps the rows relayed per round. Defaults to 1000.
	BatchSize int
	// PollInterval is how long the relay sleeps when the outbox is empty.
	// Defaults to 50ms.
	PollInterval time.Duration
	// ProduceTimeout bounds waiting for the broker's acknowledgement.
	// Defaults to 10s.
	ProduceTimeout time.Duration
	// KafkaOpts are extra franz-go options.
	KafkaOpts []kgo.Opt
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics. Defaults to a private registry.
	Registerer prometheus.Registerer
}

// Relay copies the outbox to Kafka.
type Relay struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *metrics
}

// New validates cfg and returns a Relay reading from pool.
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("sink: pool is required")
	}
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("sink config: Brokers is required")
	}
	if cfg.Topic == "" {
		cfg.Topic = envelope.TopicState
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 1000
	}
	if cfg.BatchSize < 0 {
		return nil, fmt.Errorf("sink config: BatchSize %d must be positive", cfg.BatchSize)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if cfg.ProduceTimeout == 0 {
		cfg.ProduceTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, pool: pool, log: cfg.Logger, metrics: m}, nil
}

// Run relays until ctx is canceled. It retries failures (database or
// broker down) with backoff and returns nil on cancellation.
func (r *Relay) Run(ctx context.Context) error {
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.DefaultProduceTopic(r.cfg.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	}, r.cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()

	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := r.lead(ctx, cl)
		if err == nil || ctx.Err() != nil {
			continue
		}
		r.metrics.errors.Inc()
		r.log.Warn("relay failed, retrying", "error", err, "backoff", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	return nil
}

// lead takes the relay lock (waiting as a standby while another relay holds
// it) and relays until ctx ends or something fails.
func (r *Relay) lead(ctx context.Context, cl *kgo.Client) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	for {
		var got bool
		if err := conn.QueryRow(ctx, tryLockSQL, relayLockClass).Scan(&got); err != nil {
			return fmt.Errorf("take relay lock: %w", err)
		}
		if got {
			break
		}
		r.metrics.active.Set(0)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	r.metrics.active.Set(1)
	r.log.Info("relay active")
	defer func() {
		r.metrics.active.Set(0)
		// Unlock on a live connection; on a dead one the lock died with it.
		_, _ = conn.Exec(context.Background(), unlockSQL, relayLockClass)
	}()
	for ctx.Err() == nil {
		n, err := r.relayOnce(ctx, conn.Conn(), cl)
		if err != nil {
			return err
		}
		if n == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(r.cfg.PollInterval):
			}
		}
	}
	return nil
}

type outboxRow struct {
	ID         int64
	PaymentKey string
	EventID    string
	Payload    []byte
	CreatedAt  time.Time
}

// relayOnce produces the oldest unpublished rows and marks them published.
func (r *Relay) relayOnce(ctx context.Context, conn *pgx.Conn, cl *kgo.Client) (int, error) {
	rows, err := conn.Query(ctx, `
		SELECT id, payment_key, event_id, payload, created_at FROM outbox
		 WHERE published_at IS NULL ORDER BY id LIMIT $1`, r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	batch, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil
	}
	recs := make([]*kgo.Record, len(batch))
	ids := make([]int64, len(batch))
	for i, row := range batch {
		recs[i] = &kgo.Record{
			Key:   []byte(row.PaymentKey),
			Value: row.Payload,
			Headers: []kgo.RecordHeader{
				{Key: envelope.HeaderEventID, Value: []byte(row.EventID)},
			},
		}
		ids[i] = row.ID
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout)
	defer cancel()
	if err := cl.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("produce state events: %w", err)
	}
	if _, err := conn.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id = ANY($1)`, ids); err != nil {
		return 0, fmt.Errorf("mark published: %w", err)
	}
	r.metrics.published.Add(float64(len(batch)))
	r.metrics.delay.Observe(time.Since(batch[len(batch)-1].CreatedAt).Seconds())
	return len(batch), nil
}
