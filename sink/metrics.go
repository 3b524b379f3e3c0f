package sink

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	published prometheus.Counter
	errors    prometheus.Counter
	active    prometheus.Gauge
	delay     prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paystream_sink_published_total",
			Help: "State events produced to the normalized topic and marked published.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paystream_sink_errors_total",
			Help: "Relay rounds that failed (database or broker) and were retried.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paystream_sink_active",
			Help: "1 while this relay holds the relay lock, 0 while it is a standby.",
		}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "paystream_sink_relay_delay_seconds",
			Help:    "Time from outbox commit to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
	}
	for _, c := range []prometheus.Collector{m.published, m.errors, m.active, m.delay} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register sink metrics: %w", err)
		}
	}
	return m, nil
}
