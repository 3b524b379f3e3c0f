package console

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/internal/metric"
)

// metrics are the console's: how often each page is asked for, how it was
// answered and how long it took.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	r := metric.New(reg, "console")
	m := &metrics{
		requests: metric.CounterVec(r, "paystream_console_requests_total",
			"Console requests by page (search, payment, stuck, health, ...) and HTTP status code; 401 counts refused credentials.",
			"page", "code"),
		duration: metric.HistogramVec(r, "paystream_console_request_duration_seconds",
			"Time to answer a console page, its database and Kafka reads included.",
			[]float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}, "page"),
	}
	return metric.Registered(r, m)
}

func (m *metrics) observe(page string, code int, seconds float64) {
	m.requests.WithLabelValues(page, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(page).Observe(seconds)
}
