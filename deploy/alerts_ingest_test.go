package deploy_test

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestIngestConnectionsRefusedFires evaluates PaystreamIngestConnectionsRefused's
// expression with Prometheus's own engine: it fires for the instance whose
// refused-connection counter grows, not for one that only closed idle
// connections to make room, nor once the refusals stopped.
func TestIngestConnectionsRefusedFires(t *testing.T) {
	t.Parallel()
	// a refuses 3 connections a minute from 10m to 20m; b only closes idle ones.
	refused := make([]float64, 40)
	for i := 10; i < 40; i++ {
		refused[i] = 3 * float64(min(i, 20)-9)
	}
	idle := make([]float64, 40)
	for i := range idle {
		idle[i] = 100 * float64(i)
	}
	db := queryable(t, map[string][]float64{
		`paystream_ingest_connections_at_limit_total{instance="a", action="refused"}`:     refused,
		`paystream_ingest_connections_at_limit_total{instance="a", action="closed_idle"}`: idle,
		`paystream_ingest_connections_at_limit_total{instance="b", action="refused"}`:     slices.Repeat([]float64{0}, 40),
		`paystream_ingest_connections_at_limit_total{instance="b", action="closed_idle"}`: idle,
	})
	for _, c := range []struct {
		at   time.Duration
		want map[string]float64
	}{
		{8 * time.Minute, nil},
		{15 * time.Minute, map[string]float64{`{instance="a"}`: 3.0 / 60}},
		{30 * time.Minute, nil}, // 10 minutes without a refusal
	} {
		got := eval(t, db, alertRule(t, "PaystreamIngestConnectionsRefused").Expr, c.at)
		t.Logf("at %v: %v", c.at, got)
		if len(got) != len(c.want) {
			t.Errorf("at %v: %v, want %v", c.at, got, c.want)
			continue
		}
		for k, v := range c.want {
			if g, ok := got[k]; !ok || math.Abs(g-v) > 1e-9 {
				t.Errorf("at %v: %v, want %v", c.at, got, c.want)
			}
		}
	}
}
