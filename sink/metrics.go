package sink

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
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
	m := &metrics{
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paystream_sink_slot_lag_bytes",
			Help: "WAL the relay's replication slot holds back: the server's current WAL position minus the slot's confirmed position. Postgres keeps this WAL until the relay confirms it.",
		}),
		lagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paystream_sink_slot_lag_seconds",
			Help: "Age, when the relay last confirmed a position to the slot, of the last Postgres transaction that position covers (heartbeats refresh it on a quiet database).",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paystream_sink_events_published_total",
			Help: "State events published in committed Kafka transactions.",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paystream_sink_replayed_transactions_skipped_total",
			Help: "Postgres transactions the slot sent again that the Kafka checkpoint showed already published (a relay stopped between its Kafka commit and confirming the slot).",
		}),
		txnSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "paystream_sink_kafka_transaction_seconds",
			Help:    "Duration of a Kafka transaction, from begin to the end of its commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		aborted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paystream_sink_kafka_transactions_aborted_total",
			Help: "Kafka transactions aborted (or of unknown outcome) after a produce or commit failure; their events are published again by a later transaction.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paystream_sink_errors_total",
			Help: "Times the relay failed (database or broker) and restarted from its checkpoint.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paystream_sink_active",
			Help: "1 while this relay holds the replication slot, 0 while it is a standby.",
		}),
		slotLost: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paystream_sink_slot_lost",
			Help: "1 while the relay's replication slot is lost (a Postgres failover or restore, or invalidated) and the relay waits for `paystream republish`; state events are not relayed meanwhile.",
		}),
	}
	for _, c := range []prometheus.Collector{m.lagBytes, m.lagSeconds, m.published, m.skipped, m.txnSeconds, m.aborted, m.errors, m.active, m.slotLost} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register sink metrics: %w", err)
		}
	}
	return m, nil
}
