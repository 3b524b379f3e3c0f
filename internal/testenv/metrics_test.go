package testenv

import (
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestMetricsSum(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"kind", "source"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("a", "x").Add(2)
	c.WithLabelValues("a", "y").Add(3)
	c.WithLabelValues("b", "x").Add(5)
	g.Set(-4)
	h.Observe(1)
	h.Observe(2)

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for name, m := range map[string]Metrics{"Gather": Gather(t, reg), "Scrape": Scrape(t, srv.URL)} {
		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"c_total", nil, 10},
			{"c_total", map[string]string{"kind": "a"}, 5},
			{"c_total", map[string]string{"kind": "a", "source": "y"}, 3},
			{"c_total", map[string]string{"kind": "c"}, 0},
			{"g", nil, -4},
			{"h_seconds", nil, 2},
			{"absent", nil, 0},
		} {
			if got := m.Sum(tc.name, tc.labels); got != tc.want {
				t.Errorf("%s: Sum(%s, %v) = %v, want %v", name, tc.name, tc.labels, got, tc.want)
			}
		}
		if n := len(m.Series("c_total", map[string]string{"source": "x"})); n != 2 {
			t.Errorf("%s: %d series with source x, want 2", name, n)
		}
	}
}
