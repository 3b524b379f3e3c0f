package sink

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/internal/metric"
)

// metrics are the Relay's metrics.
type metrics struct {
	lagBytes   prometheus.Gauge
	lagSeconds prometheus.Gauge
	published  prometheus.Counter
	skipped    prometheus.Counter
	txnSeconds prometheus.Histogram
	aborted    prometheus.Counter
	errors     prometheus.Counter
	active     prometheus.Gauge
	slotLost   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	r := metric.New(reg, "sink")
	m := &metrics{
		lagBytes: metric.Gauge(r, "paystream_sink_slot_lag_bytes",
			"WAL the relay's replication slot holds back: the server's current WAL position minus the slot's confirmed position. Postgres keeps this WAL until the relay confirms it."),
		lagSeconds: metric.Gauge(r, "paystream_sink_slot_lag_seconds",
			"Age, when the relay last confirmed a position to the slot, of the last Postgres transaction that position covers (heartbeats refresh it on a quiet database)."),
		published: metric.Counter(r, "paystream_sink_events_published_total",
			"State events published in committed Kafka transactions."),
		skipped: metric.Counter(r, "paystream_sink_replayed_transactions_skipped_total",
			"Postgres transactions the slot sent again that the Kafka checkpoint showed already published (a relay stopped between its Kafka commit and confirming the slot)."),
		txnSeconds: metric.Histogram(r, "paystream_sink_kafka_transaction_seconds",
			"Duration of a Kafka transaction, from begin to the end of its commit.",
			prometheus.ExponentialBuckets(0.001, 2, 16)),
		aborted: metric.Counter(r, "paystream_sink_kafka_transactions_aborted_total",
			"Kafka transactions aborted (or of unknown outcome) after a produce or commit failure; their events are published again by a later transaction."),
		errors: metric.Counter(r, "paystream_sink_errors_total",
			"Times the relay failed (database or broker) and restarted from its checkpoint."),
		active: metric.Gauge(r, "paystream_sink_active",
			"1 while this relay holds the replication slot, 0 while it is a standby."),
		slotLost: metric.Gauge(r, "paystream_sink_slot_lost",
			"1 while the relay's replication slot is lost (a Postgres failover or restore, or invalidated) and the relay waits for `paystream republish`; state events are not relayed meanwhile."),
	}
	return metric.Registered(r, m)
}
