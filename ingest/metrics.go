package ingest

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// outcome is a request's outcome, the "outcome" label of
// paystream_ingest_requests_total.
type outcome int

const (
	outcomeAccepted outcome = iota
	outcomeDLQ
	outcomeIrrelevant
	outcomeUnauthorized
	outcomeTooLarge
	outcomeBadRequest
	outcomeUnavailable
	outcomeOverloaded
	outcomeClientGone
	outcomeTimeout
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	outcomeAccepted:     "accepted",
	outcomeDLQ:          "dead_lettered",
	outcomeIrrelevant:   "irrelevant",
	outcomeUnauthorized: "unauthorized",
	outcomeTooLarge:     "too_large",
	outcomeBadRequest:   "bad_request",
	outcomeUnavailable:  "unavailable",
	outcomeOverloaded:   "overloaded",
	outcomeClientGone:   "client_gone",
	outcomeTimeout:      "timeout",
}

// The "limit" label of paystream_ingest_overload_rejections_total: which
// cap a request answered 503 at admission hit.
const (
	limitInFlight  = "in_flight"
	limitBodyBytes = "body_bytes"
)

// The "action" label of paystream_ingest_connections_at_limit_total: what
// a new connection that found MaxConns open did.
const (
	connClosedIdle = iota // closed the longest-waiting connection to take its place
	connRefused           // found every connection busy: answered 503 and closed
	numConnActions
)

var connActionNames = [numConnActions]string{connClosedIdle: "closed_idle", connRefused: "refused"}

// outcomeUnknownSource is counted with source "unknown", so a scan of
// random URLs cannot create label values.
const outcomeUnknownSource = "unknown_source"

// outcomeCounters are one source's request counters, by outcome.
type outcomeCounters [numOutcomes]prometheus.Counter

type metrics struct {
	requests          *prometheus.CounterVec
	signatureFailures *prometheus.CounterVec
	produceSeconds    prometheus.Histogram
	bodyBytes         prometheus.Histogram
	inFlight          prometheus.Gauge
	overloaded        *prometheus.CounterVec
	connsOpen         prometheus.Gauge
	connsAtLimit      [numConnActions]prometheus.Counter
	reading           prometheus.Gauge
}

// newMetrics registers ingest's metrics on reg; buffered reports the body
// bytes held (paystream_ingest_buffered_body_bytes).
func newMetrics(reg prometheus.Registerer, buffered func() float64) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paystream_ingest_requests_total",
			Help: "Webhook requests by source and outcome (accepted, dead_lettered, irrelevant, unauthorized, unknown_source, too_large, bad_request, unavailable, overloaded, client_gone, timeout).",
		}, []string{"source", "outcome"}),
		signatureFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paystream_ingest_signature_failures_total",
			Help: "Webhooks rejected as not authentic, by source and reason.",
		}, []string{"source", "reason"}),
		produceSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "paystream_ingest_produce_seconds",
			Help:    "Time from produce to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		bodyBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "paystream_ingest_body_bytes",
			Help:    "Webhook body sizes.",
			Buckets: prometheus.ExponentialBuckets(64, 4, 9),
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paystream_ingest_in_flight_requests",
			Help: "Webhook requests whose body is in, being verified or waiting for the broker (at most --max-in-flight).",
		}),
		reading: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paystream_ingest_reading_requests",
			Help: "Webhook requests whose body is arriving (on fasthttp: past its first 8 KiB).",
		}),
		overloaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paystream_ingest_overload_rejections_total",
			Help: "Webhook requests answered 503 because a cap was reached, by cap: in_flight (once the body was in), body_bytes (as it arrived).",
		}, []string{"limit"}),
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paystream_ingest_connections_open",
			Help: "Connections open on the webhook listener (at most --max-conns).",
		}),
	}
	bufferedBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "paystream_ingest_buffered_body_bytes",
		Help: "Body bytes the requests in flight hold, charged against --max-buffered-body-bytes as they arrive.",
	}, buffered)
	atLimit := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paystream_ingest_connections_at_limit_total",
		Help: "New connections that found --max-conns open, by action: closed_idle (the longest-waiting connection was closed to make room), refused (every connection was serving a request: answered 503 and closed).",
	}, []string{"action"})
	for a, name := range connActionNames {
		m.connsAtLimit[a] = atLimit.WithLabelValues(name)
	}
	for _, c := range []prometheus.Collector{m.requests, m.signatureFailures, m.produceSeconds, m.bodyBytes, m.inFlight, m.overloaded,
		m.connsOpen, m.reading, bufferedBytes, atLimit} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register ingest metrics: %w", err)
		}
	}
	m.requests.WithLabelValues("unknown", outcomeUnknownSource)
	m.overloaded.WithLabelValues(limitInFlight)
	m.overloaded.WithLabelValues(limitBodyBytes)
	return m, nil
}

// forSource returns the request counters of a source, every outcome
// declared, so rates and alerts start from zero.
func (m *metrics) forSource(name string) outcomeCounters {
	var c outcomeCounters
	for o, label := range outcomeNames {
		c[o] = m.requests.WithLabelValues(name, label)
	}
	return c
}
