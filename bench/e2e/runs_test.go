package main

import (
	"math"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/lab/loadgen"
)

// TestMergeResults: rounds merge as one run would measure them: rates over
// the summed times, figures per delivery weighted by each round's
// deliveries, transaction sizes weighted by transactions, latency
// percentiles over every sample, pacing summed and its worst kept.
func TestMergeResults(t *testing.T) {
	t.Parallel()
	round := func(deliveries int, e2e float64, cpu float64, wal int64, txns int64, perTxn float64, lat ...time.Duration) *result {
		h := &loadgen.Histogram{}
		for range deliveries {
			h.Record(time.Millisecond)
		}
		return &result{Name: "paystream", Deliveries: deliveries, EndToEnd: e2e, CPU: map[string]float64{"ingest": cpu},
			Load:     &loadgen.Result{Elapsed: time.Duration(e2e * float64(time.Second)), Sent: int64(deliveries), Status: map[int]int64{200: int64(deliveries)}, Latency: h},
			WALBytes: wal, ProcessorTransactions: txns, DeliveriesPerTransaction: perTxn, Published: len(lat), publishLat: lat,
			Check: "OK", Pacing: &pacing{Rate: 5000, Late: 3, MaxLateMS: float64(deliveries)}}
	}
	ms := func(n int) []time.Duration {
		var d []time.Duration
		for i := range n {
			d = append(d, time.Duration(i+1)*time.Millisecond)
		}
		return d
	}
	a := round(1000, 1, 40, 2_000_000, 10, 100, ms(100)...)
	b := round(3000, 2, 80, 6_000_000, 20, 150, ms(300)...)
	m := mergeResults([]*result{a, b})

	approx := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if m.Deliveries != 4000 || m.Accepted != 4000 || m.Published != 400 {
		t.Errorf("deliveries %d, accepted %d, published %d; want 4000, 4000, 400", m.Deliveries, m.Accepted, m.Published)
	}
	approx("end-to-end/s", m.EndToEndPerSec, 4000.0/3)
	approx("accepted/s", m.AcceptedPerSec, 4000.0/3)
	approx("ingest µs/delivery", m.CPU["ingest"], (1000*40+3000*80)/4000.0)
	approx("WAL/delivery", m.WALBytesPerDelivery, 8_000_000/4000.0)
	approx("deliveries/transaction", m.DeliveriesPerTransaction, (10*100+20*150)/30.0)
	approx("published p99 (ms)", m.PublishP99, 296) // rank 396 of 1..100 twice and 101..300 once
	if m.ProcessorTransactions != 30 || m.Pacing.Late != 6 || m.Pacing.MaxLateMS != 3000 {
		t.Errorf("transactions %d, late %d, latest %v; want 30, 6, 3000", m.ProcessorTransactions, m.Pacing.Late, m.Pacing.MaxLateMS)
	}
	if m.Check != "round 1 OK; round 2 OK" {
		t.Errorf("check %q", m.Check)
	}
	if one := mergeResults([]*result{a}); one != a {
		t.Error("one round is not its own result")
	}
}
