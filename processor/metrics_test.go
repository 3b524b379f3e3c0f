package processor

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paystream/paystream/internal/testenv"
)

// TestObserveCountsWaitingWork: the gauges an SRE alerts on (deferred,
// overdue, quarantined, held) come from Postgres and count what is there.
func TestObserveCountsWaitingWork(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO deliveries (id, recorded_at, source, dedup_key, payment_key, status, reason, topic, partition, kafka_offset, received_at) VALUES
		  (1, now(), 's', 'a', 's:1', 'deferred', 'needs_predecessor', 't', 0, 0, now() - interval '2 hours'),
		  (2, now(), 's', 'b', 's:1', 'deferred', 'needs_predecessor', 't', 0, 1, now()),
		  (3, now(), 's', 'c', 's:2', 'quarantined', 'poison', 't', 0, 2, now());
		INSERT INTO payments (payment_key, source, payment_id, status, version, state, held) VALUES ('s:2', 's', '2', '', 0, '{}', true);`)
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	m.observe(ctx, db.Pool, time.Hour)
	for name, c := range map[string]struct {
		g    prometheus.Gauge
		want float64
	}{"deferred": {m.deferred, 2}, "overdue": {m.overdue, 1}, "quarantined": {m.quarantined, 1}, "held": {m.held, 1}} {
		if got := testutil.ToFloat64(c.g); got != c.want {
			t.Errorf("%s = %v, want %v", name, got, c.want)
		}
	}
}
