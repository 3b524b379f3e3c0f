package standardwebhooks

import (
	"context"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/provider/providertest"
)

func refetchDriver(t testing.TB, refetch bool) *Driver {
	t.Helper()
	d, err := New(provider.Config{Secrets: []string{specSecret}, Refetch: refetch})
	if err != nil {
		t.Fatal(err)
	}
	return d.(*Driver)
}

func TestRefetchMarksEvents(t *testing.T) {
	t.Parallel()
	body := []byte(`{"type":"payment.paid","timestamp":"2024-06-12T19:45:00Z","data":{"payment_id":"pay_8Jd2kQ","amount":25990,"currency":"BRL"}}`)
	ts := time.Unix(1718221503, 0)
	for _, refetch := range []bool{false, true} {
		d := refetchDriver(t, refetch)
		r, err := SignedRequest(specSecret, "msg_1", ts, body)
		if err != nil {
			t.Fatal(err)
		}
		ev := providertest.Accept(t, d, r)
		if ev.NeedsRefetch != refetch {
			t.Fatalf("Config.Refetch = %v: NeedsRefetch = %v", refetch, ev.NeedsRefetch)
		}
		// The webhook's own fact is kept either way.
		if ev.Fact.Status != payment.StatusPaid || ev.Fact.AmountMinor != 25990 {
			t.Fatalf("fact %+v", ev.Fact)
		}
	}
}

var (
	ts = providertest.At
	rf = providertest.Refund
	st = providertest.Fact
)

const (
	paidAt    = "2024-06-12T19:45:00Z"
	updatedAt = "2024-06-20T12:00:00Z"
)

var refetchCases = []providertest.RefetchCase{
	{Name: "pending", Body: `{"payment_id":"pay_1","status":"pending","amount":25990,"currency":"BRL","updated_at":"2024-06-12T19:40:00Z"}`,
		Want: []payment.Fact{st(payment.StatusPending, 25990, "2024-06-12T19:40:00Z")}, Final: payment.StatusPending},
	{Name: "pending without amount", Body: `{"payment_id":"pay_1","status":"pending","updated_at":"2024-06-12T19:40:00Z"}`,
		Want: []payment.Fact{{Status: payment.StatusPending, OccurredAt: ts("2024-06-12T19:40:00Z")}}, Final: payment.StatusPending},
	{Name: "authorized", Body: `{"payment_id":"pay_1","status":"authorized","amount":25990,"currency":"brl","updated_at":"2024-06-12T19:41:00Z","refunds":[]}`,
		Want: []payment.Fact{st(payment.StatusAuthorized, 25990, "2024-06-12T19:41:00Z")}, Final: payment.StatusAuthorized},
	{Name: "failed", Body: `{"payment_id":"pay_1","status":"failed","amount":25990,"currency":"BRL","updated_at":"2024-06-12T19:41:00Z"}`,
		Want: []payment.Fact{st(payment.StatusFailed, 25990, "2024-06-12T19:41:00Z")}, Final: payment.StatusFailed},
	{Name: "canceled", Body: `{"payment_id":"pay_1","status":"canceled","amount":25990,"currency":"BRL","updated_at":"2024-06-12T19:41:00Z"}`,
		Want: []payment.Fact{st(payment.StatusCanceled, 25990, "2024-06-12T19:41:00Z")}, Final: payment.StatusCanceled},
	{Name: "paid", Body: `{"payment_id":"pay_1","status":"paid","amount":25990,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`,
		Want: []payment.Fact{st(payment.StatusPaid, 25990, paidAt)}, Final: payment.StatusPaid},
	{Name: "partially refunded, refunds sorted by created_at", Body: `{"payment_id":"pay_1","status":"partially_refunded","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z",
		"refunds":[{"id":"rf_2","amount":1000,"created_at":"2024-06-20T12:00:00Z"},{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"}]}`,
		Want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
			rf(payment.StatusPartiallyRefunded, "rf_2", 1000, "2024-06-20T12:00:00Z"),
		}, Final: payment.StatusPartiallyRefunded},
	{Name: "refunded, refunds add up to the amount", Body: `{"payment_id":"pay_1","status":"refunded","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z",
		"refunds":[{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"},{"id":"rf_2","amount":25000,"created_at":"2024-06-20T12:00:00Z"}]}`,
		Want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
			rf(payment.StatusRefunded, "rf_2", 25000, "2024-06-20T12:00:00Z"),
		}, Final: payment.StatusRefunded},
	{Name: "refunded, refunds short of the amount: the rest in full", Body: `{"payment_id":"pay_1","status":"refunded","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z",
		"refunds":[{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"}]}`,
		Want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
			{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: ts(updatedAt)},
		}, Final: payment.StatusRefunded},
	{Name: "refunded without refunds listed", Body: `{"payment_id":"pay_1","status":"refunded","amount":25990,"currency":"BRL","updated_at":"2024-06-20T12:00:00Z"}`,
		Want: []payment.Fact{
			st(payment.StatusPaid, 25990, updatedAt),
			{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: ts(updatedAt)},
		}, Final: payment.StatusRefunded},
	{Name: "paid with a refund listed", Body: `{"payment_id":"pay_1","status":"paid","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z","refunds":[{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"}]}`,
		Want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
		}, Final: payment.StatusPartiallyRefunded},
	{Name: "disputed", Body: `{"payment_id":"pay_1","status":"disputed","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z"}`,
		Want: []payment.Fact{st(payment.StatusPaid, 25990, paidAt), st(payment.StatusDisputed, 25990, updatedAt)}, Final: payment.StatusDisputed},
	{Name: "dispute won", Body: `{"payment_id":"pay_1","status":"dispute_won","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z"}`,
		Want: []payment.Fact{st(payment.StatusPaid, 25990, paidAt), st(payment.StatusDisputed, 25990, updatedAt), st(payment.StatusDisputeWon, 25990, updatedAt)}, Final: payment.StatusDisputeWon},
	{Name: "dispute lost after a refund, in time order", Body: `{"payment_id":"pay_1","status":"dispute_lost","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z",
		"refunds":[{"id":"rf_9","amount":500,"created_at":"2024-06-25T00:00:00Z"},{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"}]}`,
		Want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
			st(payment.StatusDisputed, 25990, updatedAt),
			st(payment.StatusDisputeLost, 25990, updatedAt),
			rf(payment.StatusPartiallyRefunded, "rf_9", 500, "2024-06-25T00:00:00Z"),
		}, Final: payment.StatusDisputeLost},
	{Name: "zero-decimal currency, zone offset", Body: `{"payment_id":"pi_1","status":"paid","amount":1500,"currency":"JPY","updated_at":"2024-06-13T04:45:00+09:00"}`,
		Want: []payment.Fact{{Status: payment.StatusPaid, AmountMinor: 1500, Currency: "JPY", OccurredAt: ts("2024-06-12T19:45:00Z")}}, Final: payment.StatusPaid},

	{Name: "missing payment_id", Body: `{"status":"paid","amount":1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "unknown status", Body: `{"payment_id":"pay_1","status":"succeeded","amount":1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "missing status", Body: `{"payment_id":"pay_1","amount":1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "missing updated_at", Body: `{"payment_id":"pay_1","status":"paid","amount":1,"currency":"BRL"}`},
	{Name: "updated_at not RFC 3339", Body: `{"payment_id":"pay_1","status":"paid","amount":1,"currency":"BRL","updated_at":"2024-06-12 19:45:00"}`},
	{Name: "year 10000", Body: `{"payment_id":"pay_1","status":"paid","amount":1,"currency":"BRL","updated_at":"10000-01-01T00:00:00Z"}`},
	{Name: "paid without amount", Body: `{"payment_id":"pay_1","status":"paid","currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "paid with zero amount", Body: `{"payment_id":"pay_1","status":"paid","amount":0,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "amount without currency", Body: `{"payment_id":"pay_1","status":"pending","amount":1,"updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "unknown currency", Body: `{"payment_id":"pay_1","status":"paid","amount":1,"currency":"XBT","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "float amount", Body: `{"payment_id":"pay_1","status":"paid","amount":259.9,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "negative amount", Body: `{"payment_id":"pay_1","status":"paid","amount":-1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "amount above 2^53-1", Body: `{"payment_id":"pay_1","status":"paid","amount":9007199254740992,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "refunds on a pending payment", Body: `{"payment_id":"pay_1","status":"pending","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":1,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{Name: "partially_refunded without refunds", Body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "duplicate refund id", Body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":1,"created_at":"2024-06-12T19:45:00Z"},{"id":"rf_1","amount":1,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{Name: "refund without id", Body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"amount":1,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{Name: "refund without amount", Body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","created_at":"2024-06-12T19:45:00Z"}]}`},
	{Name: "zero refund", Body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":0,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{Name: "refund without created_at", Body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":1}]}`},
	{Name: "refunds over the amount", Body: `{"payment_id":"pay_1","status":"refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":600,"created_at":"2024-06-12T19:45:00Z"},{"id":"rf_2","amount":401,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{Name: "duplicate key", Body: `{"payment_id":"pay_1","status":"pending","status":"paid","amount":1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{Name: "not an object", Body: `[{"payment_id":"pay_1"}]`},
	{Name: "error body", Body: `{"error":"not_found","status":404}`},
}

// refetchSuite describes the driver to the refetch conformance suite.
func refetchSuite(t testing.TB) providertest.RefetchSuite {
	return providertest.RefetchSuite{
		Driver:   refetchDriver(t, true),
		Cases:    refetchCases,
		IDOf:     providertest.StringMember("payment_id"),
		OtherIDs: func(id string) []string { return []string{"pay_2", id + "0", strings.ToUpper(id), " " + id} },
		Request: providertest.RefetchRequestCase{
			Token: "sk_live_abc", ID: "pay_8Jd2kQ", Auth: "Bearer sk_live_abc",
			URLs: map[string]string{
				"https://api.gateway.example":     "https://api.gateway.example/payments/pay_8Jd2kQ",
				"https://api.gateway.example/v2/": "https://api.gateway.example/v2/payments/pay_8Jd2kQ",
			},
			BadIDs: []string{".", strings.Repeat("p", 256)},
		},
	}
}

// TestRefetchConformance runs the refetch conformance suite.
func TestRefetchConformance(t *testing.T) {
	t.Parallel()
	refetchSuite(t).Run(t)
}

// TestRefetchRequestEscapesIDs: an id is one path segment, escaped;
// without a base URL (no default gateway) there is no request.
func TestRefetchRequestEscapesIDs(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t, true)
	for id, want := range map[string]string{"a/b?c#d": "http://127.0.0.1:9999/payments/a%2Fb%3Fc%23d", "...": "http://127.0.0.1:9999/payments/..."} {
		req, err := d.RefetchRequest(context.Background(), "http://127.0.0.1:9999", "sk_live_abc", id)
		if err != nil || req.URL.String() != want {
			t.Errorf("RefetchRequest(%q) = %v, %v; want %s", id, req, err, want)
		}
	}
	if _, err := d.RefetchRequest(context.Background(), "", "sk_live_abc", "pay_1"); err == nil {
		t.Error("RefetchRequest without a base URL: no error")
	}
}

// TestRefetchResolvesThinWebhooks checks the point of refetching: webhook
// facts that wait (a partial refund without id) are settled by the facts of
// the refetch, and webhook plus refetch facts converge in any order.
func TestRefetchResolvesThinWebhooks(t *testing.T) {
	t.Parallel()
	webhooks := []payment.Fact{
		{Status: payment.StatusPartiallyRefunded, OccurredAt: ts("2024-06-14T10:00:00Z")},
		st(payment.StatusPaid, 25990, paidAt),
		rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
	}
	var body string
	for _, tc := range refetchCases {
		if strings.HasPrefix(tc.Name, "partially refunded") {
			body = tc.Body
		}
	}
	facts, err := refetchDriver(t, true).ParseRefetch([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var m payment.Machine
	want := m.Replay(payment.State{}, facts).State
	all := append(append([]payment.Fact(nil), webhooks...), facts...)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		r := m.Replay(payment.State{}, all)
		if !r.State.Equivalent(want) {
			t.Fatalf("state %+v, want %+v", r.State, want)
		}
		for i, d := range r.Decisions {
			if d.Outcome == payment.OutcomeDeferred {
				t.Fatalf("fact %+v left deferred (%s)", all[i], d.Reason)
			}
		}
	}
}

func TestRefetchAgainstGateway(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	paid := ts(paidAt)
	gw.SetPayment("pay/8Jd2kQ", gatewaytest.Payment{
		PaymentID: "pay/8Jd2kQ", Status: "partially_refunded", Amount: 25990, Currency: "BRL",
		PaidAt: &paid, UpdatedAt: ts(updatedAt),
		Refunds: []gatewaytest.Refund{{ID: "rf_1", Amount: 990, CreatedAt: ts("2024-06-14T10:00:00Z")}},
	})
	d := refetchDriver(t, true)
	req, err := d.RefetchRequest(context.Background(), gw.URL()+"/", gw.Token(), "pay/8Jd2kQ")
	if err != nil {
		t.Fatal(err)
	}
	facts := providertest.RefetchFacts(t, gw.Client(), req, d)
	want := []payment.Fact{st(payment.StatusPaid, 25990, paidAt), rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z")}
	if !reflect.DeepEqual(facts, want) {
		t.Fatalf("facts %+v, want %+v", facts, want)
	}
	if gw.RequestsFor("pay/8Jd2kQ") != 1 {
		// The escaped slash is one path segment: the server saw the id whole.
		t.Fatalf("RequestsFor = %d", gw.RequestsFor("pay/8Jd2kQ"))
	}
}

// FuzzParseRefetch runs the suite's fuzz properties (RefetchSuite.Fuzz).
func FuzzParseRefetch(f *testing.F) {
	refetchSuite(f).Fuzz(f)
}
