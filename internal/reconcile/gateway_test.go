package reconcile

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
)

// TestGatewaySweep: on a real Postgres and a local gateway, the sweep reads
// back only the open payments of the sources that refetch, reports the one
// the gateway knows to be paid while paystream has it pending (a capture
// never received), leaves the one the gateway agrees with, and lists the
// one the gateway does not know as unanswered, not as drift.
func TestGatewaySweep(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	insert := func(key, src, id string, facts ...payment.Fact) {
		t.Helper()
		st := payment.Machine{}.Replay(payment.State{}, facts).State
		js, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `
			INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, key, src, id, st.Status, st.Version, st.AmountMinor, st.Currency, string(js)); err != nil {
			t.Fatal(err)
		}
	}
	pending := payment.Fact{Status: payment.StatusPending, AmountMinor: 100, Currency: "BRL", OccurredAt: at}
	paid := payment.Fact{Status: payment.StatusPaid, AmountMinor: 100, Currency: "BRL", OccurredAt: at}
	refunded := payment.Fact{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: at}
	insert("mp:pay_behind", "mp", "pay_behind", pending)
	insert("mp:pay_same", "mp", "pay_same", paid)
	insert("mp:pay_gone", "mp", "pay_gone", pending)
	insert("mp:pay_final", "mp", "pay_final", paid, refunded) // refunded: final, not swept
	insert("acme:pay_other", "acme", "pay_other", pending)    // acme does not refetch

	gw := gatewaytest.New(t)
	gw.SetPayment("pay_behind", gatewaytest.Payment{PaymentID: "pay_behind", Status: "paid", Amount: 100, Currency: "BRL", PaidAt: &at, UpdatedAt: at})
	gw.SetPayment("pay_same", gatewaytest.Payment{PaymentID: "pay_same", Status: "paid", Amount: 100, Currency: "BRL", PaidAt: &at, UpdatedAt: at})
	drv, err := standardwebhooks.New(provider.Config{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{DB: db.Pool, Since: time.Hour, GatewayLimit: 100, HTTPClient: gw.Client(), Now: time.Now,
		Gateway: map[string]*source.RefetchConfig{"mp": {
			Refetcher: drv.(provider.Refetcher), BaseURL: gw.URL(), Token: gw.Token(), Rate: 1000, Burst: 10, Timeout: 5 * time.Second,
		}}}
	got, err := sweepGateway(ctx, cfg, time.Now().Add(-time.Hour), &progress{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Payments != 3 || gw.Requests() != 3 {
		t.Errorf("read back %d payments with %d requests, want 3 (the open mp ones)", got.Payments, gw.Requests())
	}
	if len(got.Drift) != 1 || got.Drift[0].PaymentKey != "mp:pay_behind" || got.Drift[0].GatewayStatus != "paid" ||
		len(got.Drift[0].Missing) != 1 || got.Drift[0].Missing[0] != payment.KindCapture {
		t.Errorf("drift = %+v, want mp:pay_behind, paid at the gateway, a capture missing", got.Drift)
	}
	if len(got.Failed) != 1 || got.Failed[0].PaymentKey != "mp:pay_gone" {
		t.Errorf("failed = %+v, want mp:pay_gone (unknown to the gateway)", got.Failed)
	}
}
