package processor

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

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

// withDefaults returns c with each field left at its zero value set to
// the default its comment states.
func (c Config) withDefaults() Config {
	c.Topic = cmp.Or(c.Topic, envelope.TopicRaw)
	c.Group = cmp.Or(c.Group, "paystream-processor")
	c.BatchMaxRecords = cmp.Or(c.BatchMaxRecords, 500)
	c.BatchMaxWait = cmp.Or(c.BatchMaxWait, 20*time.Millisecond)
	c.Transactions = cmp.Or(c.Transactions, 1)
	c.MaxBufferedBatches = cmp.Or(c.MaxBufferedBatches, 4)
	c.OffsetCopyInterval = cmp.Or(c.OffsetCopyInterval, time.Second)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, 5*time.Second)
	c.DeferredWindow = cmp.Or(c.DeferredWindow, time.Hour)
	c.RefetchRetry = cmp.Or(c.RefetchRetry, 30*time.Second)
	c.HTTPClient = cmp.Or(c.HTTPClient, &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }})
	c.SessionTimeout = cmp.Or(c.SessionTimeout, 45*time.Second)
	c.IdleInTransactionTimeout = cmp.Or(c.IdleInTransactionTimeout, 5*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.Registerer = cmp.Or[prometheus.Registerer](c.Registerer, prometheus.NewRegistry())
	c.DeliveryRetention = cmp.Or(c.DeliveryRetention, DefaultDeliveryRetention)
	c.DedupRetention = cmp.Or(c.DedupRetention, DefaultDedupRetention)
	c.RetentionInterval = cmp.Or(c.RetentionInterval, time.Hour)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports the first field of c (defaults applied) whose value
// cannot work, by name.
func (c *Config) validate() error {
	positive := []struct {
		name string
		v    time.Duration
	}{
		{"BatchMaxWait", c.BatchMaxWait},
		{"OffsetCopyInterval", c.OffsetCopyInterval},
		{"RetryBackoffMax", c.RetryBackoffMax},
		{"DeferredWindow", c.DeferredWindow},
		{"RefetchRetry", c.RefetchRetry},
		{"SessionTimeout", c.SessionTimeout},
	}
	for _, d := range positive {
		if d.v < 0 {
			return fmt.Errorf("processor config: %s %s must be positive", d.name, d.v)
		}
	}
	switch {
	case len(c.Brokers) == 0:
		return errors.New("processor config: Brokers is required")
	case c.BatchMaxRecords < 0:
		return fmt.Errorf("processor config: BatchMaxRecords %d must be positive", c.BatchMaxRecords)
	case c.Transactions < 0:
		return fmt.Errorf("processor config: Transactions %d must be positive", c.Transactions)
	case c.MaxBufferedBatches < 0:
		return fmt.Errorf("processor config: MaxBufferedBatches %d must be positive", c.MaxBufferedBatches)
	}
	rc := RetentionConfig{DeliveryRetention: c.DeliveryRetention, DedupRetention: c.DedupRetention}.withDefaults()
	if err := rc.validate(); err != nil {
		return fmt.Errorf("processor config: %w", err)
	}
	return nil
}
