// Package metric declares paystream's Prometheus metrics: each one a single
// call naming it, its help and its labels, registered as it is declared.
// Ingest, the processor, the sink and the console each declared a dozen
// metrics as option literals followed by a registration loop; with this
// package a component's metrics read as a list of names.
//
// deploy/metrics_test.go reads the calls of this package's constructors
// from the source, to check that alert rules and dashboards name only
// metrics the code declares: pass names, helps and labels as string
// literals.
package metric

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Registrar registers one component's metrics on a registry. It keeps the
// first registration error, so a constructor declares all its metrics and
// checks once, with Err.
type Registrar struct {
	reg       prometheus.Registerer
	component string
	err       error
}

// New returns a Registrar registering on reg the metrics of component, the
// name Err gives in its error.
func New(reg prometheus.Registerer, component string) *Registrar {
	return &Registrar{reg: reg, component: component}
}

// Err reports the first metric that could not be registered (after which
// no other was), as "register <component> metrics: <cause>".
func (r *Registrar) Err() error {
	if r.err != nil {
		return fmt.Errorf("register %s metrics: %w", r.component, r.err)
	}
	return nil
}

// Registered returns m, the metrics a constructor declared with r, or
// nil and Err if one of them could not be registered.
func Registered[M any](r *Registrar, m *M) (*M, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c unless an earlier registration failed, and returns c.
func register[C prometheus.Collector](r *Registrar, c C) C {
	if r.err == nil {
		r.err = r.reg.Register(c)
	}
	return c
}

// Counter declares a counter without labels.
func Counter(r *Registrar, name, help string) prometheus.Counter {
	return register(r, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

// CounterVec declares a counter with the given labels.
func CounterVec(r *Registrar, name, help string, labels ...string) *prometheus.CounterVec {
	return register(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

// Gauge declares a gauge without labels.
func Gauge(r *Registrar, name, help string) prometheus.Gauge {
	return register(r, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

// GaugeVec declares a gauge with the given labels.
func GaugeVec(r *Registrar, name, help string, labels ...string) *prometheus.GaugeVec {
	return register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

// GaugeFunc declares a gauge without labels whose value is read from
// value at each scrape.
func GaugeFunc(r *Registrar, name, help string, value func() float64) prometheus.GaugeFunc {
	return register(r, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, value))
}

// Histogram declares a histogram without labels.
func Histogram(r *Registrar, name, help string, buckets []float64) prometheus.Histogram {
	return register(r, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

// HistogramVec declares a histogram with the given labels.
func HistogramVec(r *Registrar, name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
}
