package metric

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestDeclare: each helper registers a metric of its type with the name,
// help, labels and buckets given, as prometheus' own constructors would.
func TestDeclare(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	r := New(reg, "test")
	Counter(r, "t_plain_total", "A counter.").Inc()
	CounterVec(r, "t_vec_total", "A labelled counter.", "a", "b").WithLabelValues("x", "y").Add(2)
	Gauge(r, "t_gauge", "A gauge.").Set(3)
	GaugeVec(r, "t_gauge_vec", "A labelled gauge.", "p").WithLabelValues("0").Set(4)
	GaugeFunc(r, "t_gauge_func", "A gauge read at scrape.", func() float64 { return 5 })
	Histogram(r, "t_seconds", "A histogram.", []float64{1, 2}).Observe(1.5)
	HistogramVec(r, "t_vec_seconds", "A labelled histogram.", []float64{1}, "page").WithLabelValues("home").Observe(0.5)
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP t_gauge A gauge.
# TYPE t_gauge gauge
t_gauge 3
# HELP t_gauge_func A gauge read at scrape.
# TYPE t_gauge_func gauge
t_gauge_func 5
# HELP t_gauge_vec A labelled gauge.
# TYPE t_gauge_vec gauge
t_gauge_vec{p="0"} 4
# HELP t_plain_total A counter.
# TYPE t_plain_total counter
t_plain_total 1
# HELP t_seconds A histogram.
# TYPE t_seconds histogram
t_seconds_bucket{le="1"} 0
t_seconds_bucket{le="2"} 1
t_seconds_bucket{le="+Inf"} 1
t_seconds_sum 1.5
t_seconds_count 1
# HELP t_vec_seconds A labelled histogram.
# TYPE t_vec_seconds histogram
t_vec_seconds_bucket{page="home",le="1"} 1
t_vec_seconds_bucket{page="home",le="+Inf"} 1
t_vec_seconds_sum{page="home"} 0.5
t_vec_seconds_count{page="home"} 1
# HELP t_vec_total A labelled counter.
# TYPE t_vec_total counter
t_vec_total{a="x",b="y"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestFirstErrorStops: a metric that cannot be registered makes Err and
// Registered report it, named by component, and the metrics declared after
// it are not registered.
func TestFirstErrorStops(t *testing.T) {
	reg := prometheus.NewRegistry()
	Counter(New(reg, "first"), "t_dup_total", "Taken.")
	r := New(reg, "second")
	m := &struct{ c prometheus.Counter }{Counter(r, "t_dup_total", "Taken.")}
	Gauge(r, "t_after", "Declared after the failure.")
	got, err := Registered(r, m)
	var already prometheus.AlreadyRegisteredError
	if got != nil || !errors.As(err, &already) || !strings.HasPrefix(err.Error(), "register second metrics: ") {
		t.Fatalf("Registered = %v, %v; want nil and an AlreadyRegisteredError under \"register second metrics: \"", got, err)
	}
	if n, err := testutil.GatherAndCount(reg, "t_after"); err != nil || n != 0 {
		t.Errorf("t_after: %d series, %v; want not registered", n, err)
	}
}
