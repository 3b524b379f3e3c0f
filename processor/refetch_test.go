package processor

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
)

// TestRefetchAppliesWhatTheGatewaySays: thin events (NeedsRefetch) move no
// money on their own body. The worker records them as
// deferred:awaiting_refetch and kicks its partition's sweeper, which asks a
// real HTTP server playing the gateway for the payment, outside any
// transaction, and applies its answer; when the gateway fails, the events
// keep waiting and the sweeper retries after RefetchRetry.
func TestRefetchAppliesWhatTheGatewaySays(t *testing.T) {
	f := setup(t, 2)
	gw := gatewaytest.New(t)
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	gw.SetPayment("pay_a", gatewaytest.Payment{PaymentID: "pay_a", Status: "partially_refunded", Amount: 5000, Currency: "BRL",
		PaidAt: &at, UpdatedAt: at.Add(time.Hour), Refunds: []gatewaytest.Refund{{ID: "re_1", Amount: 1500, CreatedAt: at.Add(time.Hour)}}})

	reg := prometheus.NewRegistry()
	p, err := New(f.db.Pool, Config{
		Brokers: f.brokers, Topic: f.topic, Group: testenv.Group(t), Registerer: reg,
		Refetch: map[string]*source.RefetchConfig{"acme": {
			Refetcher: webhookRefetcher(t), BaseURL: gw.URL(), Token: gw.Token(), Rate: 100, Burst: 10, Timeout: 2 * time.Second,
		}},
		RefetchRetry: 300 * time.Millisecond,
		HTTPClient:   gw.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "processor", p.Run)
	ctx := t.Context()

	produce := func(paymentID, eventID string) {
		t.Helper()
		testenv.Produce(t, f.brokers, thinRecord(t, "acme", f.topic, 0, paymentID, eventID))
	}
	paymentState := func(key string) (status string, version int64) {
		err := f.db.Pool.QueryRow(ctx, `SELECT status, version FROM payments WHERE payment_key = $1`, key).Scan(&status, &version)
		if err != nil {
			return "", 0
		}
		return status, version
	}

	produce("pay_a", "evt_a1")
	produce("pay_a", "evt_a2") // a second thin event for the same payment
	testenv.Eventually(t, 30*time.Second, func() bool {
		s, _ := paymentState("acme:pay_a")
		return s == "partially_refunded"
	}, "pay_a to reach the refetched state")
	var captured, refunded int64
	if err := f.db.Pool.QueryRow(ctx, `
		SELECT COALESCE(sum(amount_minor) FILTER (WHERE account = 'merchant_payable' AND amount_minor < 0), 0),
		       COALESCE(sum(amount_minor) FILTER (WHERE account = 'merchant_payable' AND amount_minor > 0), 0)
		  FROM ledger_postings WHERE payment_key = 'acme:pay_a'`).Scan(&captured, &refunded); err != nil {
		t.Fatal(err)
	}
	if captured != -5000 || refunded != 1500 {
		t.Errorf("pay_a ledger: captured %d refunded %d, want -5000 and 1500", captured, refunded)
	}

	// The gateway is down: the event waits, nothing moves, the sweeper
	// retries and applies it once the gateway is back.
	gw.SetPayment("pay_b", gatewaytest.Payment{PaymentID: "pay_b", Status: "paid", Amount: 700, Currency: "BRL", PaidAt: &at, UpdatedAt: at})
	gw.FailNext(3, 503)
	produce("pay_b", "evt_b1")
	testenv.Eventually(t, 30*time.Second, func() bool {
		var reason string
		_ = f.db.Pool.QueryRow(ctx, `SELECT COALESCE(reason, '') FROM deliveries WHERE event_id = 'evt_b1' AND status = 'deferred'`).Scan(&reason)
		s, _ := paymentState("acme:pay_b")
		return reason == reasonAwaitingRefetch || s == "paid"
	}, "evt_b1 to wait for its refetch")
	testenv.Eventually(t, 30*time.Second, func() bool {
		s, _ := paymentState("acme:pay_b")
		return s == "paid"
	}, "the sweeper to apply pay_b once the gateway answers")
	status, reason := deliveryOutcome(t, f.db.Pool, `event_id = 'evt_b1'`)
	if status != "processed" {
		t.Errorf("evt_b1 = %s/%s, want processed", status, reason)
	}
	if n := gw.RequestsFor("pay_b"); n < 2 {
		t.Errorf("gateway saw %d requests for pay_b, want the failed one and a retry", n)
	}
	var transitions int
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM payment_transitions WHERE payment_key = 'acme:pay_b'`).Scan(&transitions); err != nil {
		t.Fatal(err)
	}
	if transitions != 1 {
		t.Errorf("pay_b transitions = %d, want 1", transitions)
	}
}

// TestRefetchCircuitBreakerAndTimeout: a gateway that keeps failing is left
// alone once the breaker opens (it sees no more requests), and a gateway
// slower than the source's timeout fails the refetch instead of stalling
// the partition.
func TestRefetchCircuitBreakerAndTimeout(t *testing.T) {
	gw := gatewaytest.New(t)
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	gw.SetPayment("pay_c", gatewaytest.Payment{PaymentID: "pay_c", Status: "paid", Amount: 100, Currency: "BRL", PaidAt: &at, UpdatedAt: at})
	refetcher := webhookRefetcher(t)
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cfg := &source.RefetchConfig{Refetcher: refetcher, BaseURL: gw.URL(), Token: gw.Token(), Rate: 1000, Burst: 100, Timeout: 2 * time.Second}
	r := newRefetcher(map[string]*source.RefetchConfig{"acme": cfg}, gw.Client(), slogDiscard(), m)
	ctx := context.Background()

	if facts, err := r.fetch(ctx, "acme", "pay_c"); err != nil || len(facts) != 1 || facts[0].Status != payment.StatusPaid {
		t.Fatalf("healthy gateway: %v, %v", facts, err)
	}
	gw.FailNext(100, 500)
	for i := 0; i < 8; i++ {
		if _, err := r.fetch(ctx, "acme", "pay_c"); err == nil {
			t.Fatalf("fetch %d succeeded against a failing gateway", i)
		}
	}
	if got := gw.RequestsFor("pay_c"); got != 1+5 {
		t.Errorf("gateway saw %d requests, want 6: one healthy, then five failures before the breaker opened", got)
	}
	if got := testutil.ToFloat64(m.refetches.WithLabelValues("acme", "breaker_open")); got != 3 {
		t.Errorf("breaker_open refetches = %v, want 3", got)
	}

	// A slow gateway: the request is abandoned at the source's timeout.
	slow := gatewaytest.New(t)
	slow.SetPayment("pay_d", gatewaytest.Payment{PaymentID: "pay_d", Status: "paid", Amount: 100, Currency: "BRL", PaidAt: &at, UpdatedAt: at})
	slow.Delay(3 * time.Second)
	slowCfg := &source.RefetchConfig{Refetcher: refetcher, BaseURL: slow.URL(), Token: slow.Token(), Rate: 1000, Burst: 100, Timeout: 100 * time.Millisecond}
	rs := newRefetcher(map[string]*source.RefetchConfig{"slow": slowCfg}, slow.Client(), slogDiscard(), m)
	if _, err := rs.fetch(ctx, "slow", "pay_d"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("slow gateway: err = %v, want a deadline exceeded", err)
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }
