package console

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the console's: how often each page is asked for, how it was
// answered and how long it took.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paystream_console_requests_total",
			Help: "Console requests by page (search, payment, stuck, health, ...) and HTTP status code; 401 counts refused credentials.",
		}, []string{"page", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "paystream_console_request_duration_seconds",
			Help:    "Time to answer a console page, its database and Kafka reads included.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"page"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register console metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(page string, code int, seconds float64) {
	m.requests.WithLabelValues(page, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(page).Observe(seconds)
}
