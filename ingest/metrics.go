package ingest

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/internal/metric"
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
	r := metric.New(reg, "ingest")
	m := &metrics{
		requests: metric.CounterVec(r, "paystream_ingest_requests_total",
			"Webhook requests by source and outcome (accepted, dead_lettered, irrelevant, unauthorized, unknown_source, too_large, bad_request, unavailable, overloaded, client_gone, timeout).",
			"source", "outcome"),
		signatureFailures: metric.CounterVec(r, "paystream_ingest_signature_failures_total",
			"Webhooks rejected as not authentic, by source and reason.",
			"source", "reason"),
		produceSeconds: metric.Histogram(r, "paystream_ingest_produce_seconds",
			"Time from produce to the broker's acknowledgement.",
			prometheus.ExponentialBuckets(0.0005, 2, 16)),
		bodyBytes: metric.Histogram(r, "paystream_ingest_body_bytes",
			"Webhook body sizes.",
			prometheus.ExponentialBuckets(64, 4, 9)),
		inFlight: metric.Gauge(r, "paystream_ingest_in_flight_requests",
			"Webhook requests whose body is in, being verified or waiting for the broker (at most --max-in-flight)."),
		overloaded: metric.CounterVec(r, "paystream_ingest_overload_rejections_total",
			"Webhook requests answered 503 because a cap was reached, by cap: in_flight (once the body was in), body_bytes (as it arrived).",
			"limit"),
		connsOpen: metric.Gauge(r, "paystream_ingest_connections_open",
			"Connections open on the webhook listener (at most --max-conns)."),
		reading: metric.Gauge(r, "paystream_ingest_reading_requests",
			"Webhook requests whose body is arriving (on fasthttp: past its first 8 KiB)."),
	}
	metric.GaugeFunc(r, "paystream_ingest_buffered_body_bytes",
		"Body bytes the requests in flight hold, charged against --max-buffered-body-bytes as they arrive.",
		buffered)
	atLimit := metric.CounterVec(r, "paystream_ingest_connections_at_limit_total",
		"New connections that found --max-conns open, by action: closed_idle (the longest-waiting connection was closed to make room), refused (every connection was serving a request: answered 503 and closed).",
		"action")
	if err := r.Err(); err != nil {
		return nil, err
	}
	for a, name := range connActionNames {
		m.connsAtLimit[a] = atLimit.WithLabelValues(name)
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
