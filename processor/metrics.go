package processor

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/internal/metric"
	"github.com/paystream/paystream/internal/store"
)

type metrics struct {
	events       *prometheus.CounterVec
	batchRecords prometheus.Histogram
	txSeconds    prometheus.Histogram
	// transactionBatches counts the batches (each one partition's) per
	// committed batch transaction.
	transactionBatches prometheus.Histogram
	batchRetries       prometheus.Counter
	batchFailures      *prometheus.CounterVec
	fenced             prometheus.Counter
	slowBatches        prometheus.Counter
	fetchErrors        prometheus.Counter
	// offsetCopyFailures counts partitions whose offset copy to Kafka failed.
	offsetCopyFailures prometheus.Counter
	// partitionEvents counts partitions assigned, revoked and lost.
	partitionEvents *prometheus.CounterVec
	refetches       *prometheus.CounterVec
	refetchSeconds  prometheus.Histogram
	lag             *prometheus.GaugeVec
	deferred        prometheus.Gauge
	overdue         prometheus.Gauge
	held            prometheus.Gauge
	quarantined     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	r := metric.New(reg, "processor")
	m := &metrics{
		events: metric.CounterVec(r, "paystream_processor_events_total",
			"Inbox outcomes by source, outcome (processed, ignored, deferred, quarantined) and reason.",
			"source", "outcome", "reason"),
		batchRecords: metric.Histogram(r, "paystream_processor_batch_records",
			"Records per committed batch: one partition's records, in a transaction alone or shared with other partitions' batches.",
			prometheus.ExponentialBuckets(1, 2, 12)),
		transactionBatches: metric.Histogram(r, "paystream_processor_transaction_batches",
			"Batches, each one partition's, per committed batch transaction (batches ready while every transaction is busy share the next one; see --transactions).",
			[]float64{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64}),
		txSeconds: metric.Histogram(r, "paystream_processor_transaction_seconds",
			"Time from a batch's start to its commit, including any wait for a transaction to share.",
			prometheus.ExponentialBuckets(0.001, 2, 14)),
		batchRetries: metric.Counter(r, "paystream_processor_batch_retries_total",
			"Batch transactions that failed transiently and were retried."),
		batchFailures: metric.CounterVec(r, "paystream_processor_batch_failures_total",
			"Failed batch transactions, by class (contention, connection, timeout, permission, missing_object, resources, poison, other). Anything but poison stalls the partition until the batch commits.",
			"class"),
		fenced: metric.Counter(r, "paystream_processor_fenced_total",
			"Batch commits refused because a newer owner claimed the partition."),
		slowBatches: metric.Counter(r, "paystream_processor_poison_batches_total",
			"Batches that held a poisonous record and were re-applied record by record."),
		fetchErrors: metric.Counter(r, "paystream_processor_fetch_errors_total",
			"Kafka fetch errors."),
		offsetCopyFailures: metric.Counter(r, "paystream_processor_offset_copy_failures_total",
			"Partitions whose stored offset could not be copied to the group's Kafka offsets (lag tools then see stale offsets until the next copy)."),
		partitionEvents: metric.CounterVec(r, "paystream_processor_partition_events_total",
			"Partitions assigned to this processor, revoked from it in a rebalance, and lost (this member was evicted from the group).",
			"event"),
		refetches: metric.CounterVec(r, "paystream_processor_refetches_total",
			"Payments read back from a gateway API, by source and outcome (ok, error, breaker_open, rate_limited).",
			"source", "outcome"),
		refetchSeconds: metric.Histogram(r, "paystream_processor_refetch_seconds",
			"Latency of gateway API refetches.",
			prometheus.ExponentialBuckets(0.005, 2, 12)),
		lag: metric.GaugeVec(r, "paystream_processor_lag_records",
			"Records between the partition's offset stored in Postgres and the broker's high watermark (refreshed every offset copy interval, also while the database is down).",
			"partition"),
		deferred: metric.Gauge(r, "paystream_processor_deferred_events",
			"Inbox events waiting for a predecessor or a held payment's replay."),
		overdue: metric.Gauge(r, "paystream_processor_deferred_overdue_events",
			"Deferred events older than the deferred window: their predecessor never came; review or refetch them."),
		held: metric.Gauge(r, "paystream_processor_held_payments",
			"Payments held after a quarantined event, waiting for paystream replay."),
		quarantined: metric.Gauge(r, "paystream_processor_quarantined_events",
			"Inbox events quarantined and not yet replayed."),
	}
	return metric.Registered(r, m)
}

// observeLoop refreshes the gauges that come from Postgres every 15 s.
func (m *metrics) observeLoop(ctx context.Context, pool *pgxpool.Pool, window time.Duration) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		m.observe(ctx, pool, window)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *metrics) observe(ctx context.Context, pool *pgxpool.Pool, window time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	g, err := store.ReadGauges(ctx, pool, window)
	if err != nil {
		return
	}
	m.deferred.Set(float64(g.Deferred))
	m.overdue.Set(float64(g.Overdue))
	m.quarantined.Set(float64(g.Quarantined))
	m.held.Set(float64(g.Held))
}

func partitionLabel(p int32) string { return strconv.Itoa(int(p)) }
