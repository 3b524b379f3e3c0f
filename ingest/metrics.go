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
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paystream_ingest_requests_total",
			Help: "Webhook requests by source and outcome (accepted, dead_lettered, irrelevant, unauthorized, unknown_source, too_large, bad_request, unavailable, overloaded, client_gone).",
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
			Help: "Webhook requests being handled.",
		}),
		overloaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paystream_ingest_overload_rejections_total",
			Help: "Webhook requests answered 503 at once because a cap was reached, by cap (in_flight, body_bytes).",
		}, []string{"limit"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.signatureFailures, m.produceSeconds, m.bodyBytes, m.inFlight, m.overloaded} {
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
