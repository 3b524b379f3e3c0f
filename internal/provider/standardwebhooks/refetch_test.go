package standardwebhooks

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
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
		sig, err := Sign(specSecret, "msg_1", ts, body)
		if err != nil {
			t.Fatal(err)
		}
		r := &provider.Request{Header: http.Header{}, Body: body, Now: ts}
		r.Header.Set(HeaderID, "msg_1")
		r.Header.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
		r.Header.Set(HeaderSignature, sig)
		if err := d.Verify(r); err != nil {
			t.Fatal(err)
		}
		ev, err := d.Parse(r)
		if err != nil {
			t.Fatal(err)
		}
		if ev.NeedsRefetch != refetch {
			t.Fatalf("Config.Refetch = %v: NeedsRefetch = %v", refetch, ev.NeedsRefetch)
		}
		// The webhook's own fact is kept either way.
		if ev.Fact.Status != payment.StatusPaid || ev.Fact.AmountMinor != 25990 {
			t.Fatalf("fact %+v", ev.Fact)
		}
	}
}

func TestRefetchRequest(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t, true)
	ctx := context.Background()
	for _, tc := range []struct{ base, id, want string }{
		{"https://api.gateway.example", "pay_8Jd2kQ", "https://api.gateway.example/payments/pay_8Jd2kQ"},
		{"https://api.gateway.example/v2/", "pay_8Jd2kQ", "https://api.gateway.example/v2/payments/pay_8Jd2kQ"},
		{"http://127.0.0.1:9999", "a/b?c#d", "http://127.0.0.1:9999/payments/a%2Fb%3Fc%23d"},
		{"http://127.0.0.1:9999", "...", "http://127.0.0.1:9999/payments/..."},
	} {
		req, err := d.RefetchRequest(ctx, tc.base, "sk_live_abc", tc.id)
		if err != nil {
			t.Fatalf("RefetchRequest(%q, %q): %v", tc.base, tc.id, err)
		}
		if req.Method != http.MethodGet || req.URL.String() != tc.want {
			t.Errorf("RefetchRequest(%q, %q) = %s %s, want GET %s", tc.base, tc.id, req.Method, req.URL, tc.want)
		}
		if got := req.Header.Get("Authorization"); got != "Bearer sk_live_abc" {
			t.Errorf("Authorization = %q", got)
		}
		if got := req.Header.Get("Accept"); got != "application/json" {
			t.Errorf("Accept = %q", got)
		}
	}
	for name, tc := range map[string]struct{ base, token, id string }{
		"no base URL":         {"", "s3cr3t-tok", "pay_1"},
		"empty token":         {"https://g.example", "", "pay_1"},
		"token with newline":  {"https://g.example", "s3cr3t\nX: y", "pay_1"},
		"empty id":            {"https://g.example", "s3cr3t-tok", ""},
		"dot id":              {"https://g.example", "s3cr3t-tok", "."},
		"dot-dot id":          {"https://g.example", "s3cr3t-tok", ".."},
		"id with NUL":         {"https://g.example", "s3cr3t-tok", "pay\x00"},
		"huge id":             {"https://g.example", "s3cr3t-tok", strings.Repeat("p", 256)},
		"ftp base":            {"ftp://g.example", "s3cr3t-tok", "pay_1"},
		"base with user info": {"https://user:pass@g.example", "s3cr3t-tok", "pay_1"},
		"base with fragment":  {"https://g.example/#x", "s3cr3t-tok", "pay_1"},
	} {
		if req, err := d.RefetchRequest(ctx, tc.base, tc.token, tc.id); err == nil {
			t.Errorf("%s: RefetchRequest = %s, want an error", name, req.URL)
		} else if strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "pass") {
			t.Errorf("%s: error %q reveals a secret", name, err)
		}
	}
}

func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func rf(s payment.Status, id string, amount int64, when string) payment.Fact {
	return payment.Fact{Status: s, RefundID: id, AmountMinor: amount, Currency: "BRL", OccurredAt: ts(when)}
}

func st(s payment.Status, amount int64, when string) payment.Fact {
	return payment.Fact{Status: s, AmountMinor: amount, Currency: "BRL", OccurredAt: ts(when)}
}

const (
	paidAt    = "2024-06-12T19:45:00Z"
	updatedAt = "2024-06-20T12:00:00Z"
)

var refetchCases = []struct {
	name  string
	body  string
	want  []payment.Fact // nil: ErrUnprocessable
	final payment.Status
}{
	{name: "pending", body: `{"payment_id":"pay_1","status":"pending","amount":25990,"currency":"BRL","updated_at":"2024-06-12T19:40:00Z"}`,
		want: []payment.Fact{st(payment.StatusPending, 25990, "2024-06-12T19:40:00Z")}, final: payment.StatusPending},
	{name: "pending without amount", body: `{"payment_id":"pay_1","status":"pending","updated_at":"2024-06-12T19:40:00Z"}`,
		want: []payment.Fact{{Status: payment.StatusPending, OccurredAt: ts("2024-06-12T19:40:00Z")}}, final: payment.StatusPending},
	{name: "authorized", body: `{"payment_id":"pay_1","status":"authorized","amount":25990,"currency":"brl","updated_at":"2024-06-12T19:41:00Z","refunds":[]}`,
		want: []payment.Fact{st(payment.StatusAuthorized, 25990, "2024-06-12T19:41:00Z")}, final: payment.StatusAuthorized},
	{name: "failed", body: `{"payment_id":"pay_1","status":"failed","amount":25990,"currency":"BRL","updated_at":"2024-06-12T19:41:00Z"}`,
		want: []payment.Fact{st(payment.StatusFailed, 25990, "2024-06-12T19:41:00Z")}, final: payment.StatusFailed},
	{name: "canceled", body: `{"payment_id":"pay_1","status":"canceled","amount":25990,"currency":"BRL","updated_at":"2024-06-12T19:41:00Z"}`,
		want: []payment.Fact{st(payment.StatusCanceled, 25990, "2024-06-12T19:41:00Z")}, final: payment.StatusCanceled},
	{name: "paid", body: `{"payment_id":"pay_1","status":"paid","amount":25990,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`,
		want: []payment.Fact{st(payment.StatusPaid, 25990, paidAt)}, final: payment.StatusPaid},
	{name: "partially refunded, refunds sorted by created_at", body: `{"payment_id":"pay_1","status":"partially_refunded","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z",
		"refunds":[{"id":"rf_2","amount":1000,"created_at":"2024-06-20T12:00:00Z"},{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"}]}`,
		want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
			rf(payment.StatusPartiallyRefunded, "rf_2", 1000, "2024-06-20T12:00:00Z"),
		}, final: payment.StatusPartiallyRefunded},
	{name: "refunded, refunds add up to the amount", body: `{"payment_id":"pay_1","status":"refunded","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z",
		"refunds":[{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"},{"id":"rf_2","amount":25000,"created_at":"2024-06-20T12:00:00Z"}]}`,
		want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
			rf(payment.StatusRefunded, "rf_2", 25000, "2024-06-20T12:00:00Z"),
		}, final: payment.StatusRefunded},
	{name: "refunded, refunds short of the amount: the rest in full", body: `{"payment_id":"pay_1","status":"refunded","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z",
		"refunds":[{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"}]}`,
		want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
			{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: ts(updatedAt)},
		}, final: payment.StatusRefunded},
	{name: "refunded without refunds listed", body: `{"payment_id":"pay_1","status":"refunded","amount":25990,"currency":"BRL","updated_at":"2024-06-20T12:00:00Z"}`,
		want: []payment.Fact{
			st(payment.StatusPaid, 25990, updatedAt),
			{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: ts(updatedAt)},
		}, final: payment.StatusRefunded},
	{name: "paid with a refund listed", body: `{"payment_id":"pay_1","status":"paid","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z","refunds":[{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"}]}`,
		want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
		}, final: payment.StatusPartiallyRefunded},
	{name: "disputed", body: `{"payment_id":"pay_1","status":"disputed","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z"}`,
		want: []payment.Fact{st(payment.StatusPaid, 25990, paidAt), st(payment.StatusDisputed, 25990, updatedAt)}, final: payment.StatusDisputed},
	{name: "dispute won", body: `{"payment_id":"pay_1","status":"dispute_won","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z"}`,
		want: []payment.Fact{st(payment.StatusPaid, 25990, paidAt), st(payment.StatusDisputed, 25990, updatedAt), st(payment.StatusDisputeWon, 25990, updatedAt)}, final: payment.StatusDisputeWon},
	{name: "dispute lost after a refund, in time order", body: `{"payment_id":"pay_1","status":"dispute_lost","amount":25990,"currency":"BRL","paid_at":"2024-06-12T19:45:00Z","updated_at":"2024-06-20T12:00:00Z",
		"refunds":[{"id":"rf_9","amount":500,"created_at":"2024-06-25T00:00:00Z"},{"id":"rf_1","amount":990,"created_at":"2024-06-14T10:00:00Z"}]}`,
		want: []payment.Fact{
			st(payment.StatusPaid, 25990, paidAt),
			rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z"),
			st(payment.StatusDisputed, 25990, updatedAt),
			st(payment.StatusDisputeLost, 25990, updatedAt),
			rf(payment.StatusPartiallyRefunded, "rf_9", 500, "2024-06-25T00:00:00Z"),
		}, final: payment.StatusDisputeLost},
	{name: "zero-decimal currency, zone offset", body: `{"payment_id":"pi_1","status":"paid","amount":1500,"currency":"JPY","updated_at":"2024-06-13T04:45:00+09:00"}`,
		want: []payment.Fact{{Status: payment.StatusPaid, AmountMinor: 1500, Currency: "JPY", OccurredAt: ts("2024-06-12T19:45:00Z")}}, final: payment.StatusPaid},

	{name: "missing payment_id", body: `{"status":"paid","amount":1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "unknown status", body: `{"payment_id":"pay_1","status":"succeeded","amount":1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "missing status", body: `{"payment_id":"pay_1","amount":1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "missing updated_at", body: `{"payment_id":"pay_1","status":"paid","amount":1,"currency":"BRL"}`},
	{name: "updated_at not RFC 3339", body: `{"payment_id":"pay_1","status":"paid","amount":1,"currency":"BRL","updated_at":"2024-06-12 19:45:00"}`},
	{name: "year 10000", body: `{"payment_id":"pay_1","status":"paid","amount":1,"currency":"BRL","updated_at":"10000-01-01T00:00:00Z"}`},
	{name: "paid without amount", body: `{"payment_id":"pay_1","status":"paid","currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "paid with zero amount", body: `{"payment_id":"pay_1","status":"paid","amount":0,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "amount without currency", body: `{"payment_id":"pay_1","status":"pending","amount":1,"updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "unknown currency", body: `{"payment_id":"pay_1","status":"paid","amount":1,"currency":"XBT","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "float amount", body: `{"payment_id":"pay_1","status":"paid","amount":259.9,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "negative amount", body: `{"payment_id":"pay_1","status":"paid","amount":-1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "amount above 2^53-1", body: `{"payment_id":"pay_1","status":"paid","amount":9007199254740992,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "refunds on a pending payment", body: `{"payment_id":"pay_1","status":"pending","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":1,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{name: "partially_refunded without refunds", body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "duplicate refund id", body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":1,"created_at":"2024-06-12T19:45:00Z"},{"id":"rf_1","amount":1,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{name: "refund without id", body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"amount":1,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{name: "refund without amount", body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","created_at":"2024-06-12T19:45:00Z"}]}`},
	{name: "zero refund", body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":0,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{name: "refund without created_at", body: `{"payment_id":"pay_1","status":"partially_refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":1}]}`},
	{name: "refunds over the amount", body: `{"payment_id":"pay_1","status":"refunded","amount":1000,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z","refunds":[{"id":"rf_1","amount":600,"created_at":"2024-06-12T19:45:00Z"},{"id":"rf_2","amount":401,"created_at":"2024-06-12T19:45:00Z"}]}`},
	{name: "duplicate key", body: `{"payment_id":"pay_1","status":"pending","status":"paid","amount":1,"currency":"BRL","updated_at":"2024-06-12T19:45:00Z"}`},
	{name: "not an object", body: `[{"payment_id":"pay_1"}]`},
	{name: "error body", body: `{"error":"not_found","status":404}`},
}

func TestParseRefetch(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t, true)
	for _, tc := range refetchCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := d.ParseRefetch([]byte(tc.body))
			if tc.want == nil {
				if !errors.Is(err, provider.ErrUnprocessable) || got != nil {
					t.Fatalf("ParseRefetch = %+v, %v; want ErrUnprocessable", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRefetch: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseRefetch =\n%+v\nwant\n%+v", got, tc.want)
			}
			checkRefetchConverges(t, got, tc.final)
		})
	}
}

// checkRefetchConverges replays facts on a new payment: in the order given
// every fact applies and the payment ends in final (when set); reversed and
// shuffled with a duplicate, the state is Equivalent with the same balances;
// the same facts again change nothing.
func checkRefetchConverges(t testing.TB, facts []payment.Fact, final payment.Status) {
	t.Helper()
	var m payment.Machine
	in := m.Replay(payment.State{}, facts)
	for i, d := range in.Decisions {
		if d.Outcome != payment.OutcomeApplied {
			t.Fatalf("fact %d (%+v) in order: %s %s, want applied", i, facts[i], d.Outcome, d.Reason)
		}
	}
	if final != "" && in.State.Status != final {
		t.Fatalf("final status %s, want %s", in.State.Status, final)
	}
	rng := rand.New(rand.NewPCG(uint64(len(facts)), 11))
	for round := range 8 {
		order := append([]payment.Fact(nil), facts...)
		if round == 0 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		} else {
			order = append(order, facts[rng.IntN(len(facts))])
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		got := m.Replay(payment.State{}, order)
		if !got.State.Equivalent(in.State) || !reflect.DeepEqual(got.State.Balances(), in.State.Balances()) {
			t.Fatalf("order %d: state %+v, in order %+v", round, got.State, in.State)
		}
	}
	if again := m.Replay(in.State, facts); len(again.Transitions) != 0 {
		t.Fatalf("the same facts again made transitions: %+v", again.Transitions)
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
		if strings.HasPrefix(tc.name, "partially refunded") {
			body = tc.body
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
	resp, err := gw.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	facts, err := d.ParseRefetch(body)
	if err != nil {
		t.Fatal(err)
	}
	want := []payment.Fact{st(payment.StatusPaid, 25990, paidAt), rf(payment.StatusPartiallyRefunded, "rf_1", 990, "2024-06-14T10:00:00Z")}
	if !reflect.DeepEqual(facts, want) {
		t.Fatalf("facts %+v, want %+v", facts, want)
	}
	if gw.RequestsFor("pay/8Jd2kQ") != 1 {
		// The escaped slash is one path segment: the server saw the id whole.
		t.Fatalf("RequestsFor = %d", gw.RequestsFor("pay/8Jd2kQ"))
	}
}

func FuzzParseRefetch(f *testing.F) {
	for _, tc := range refetchCases {
		f.Add([]byte(tc.body))
	}
	d := refetchDriver(f, true)
	f.Fuzz(func(t *testing.T, body []byte) {
		facts, err := d.ParseRefetch(body)
		if err != nil {
			if !errors.Is(err, provider.ErrUnprocessable) || facts != nil {
				t.Fatalf("rejection: %+v, %v; want no facts and ErrUnprocessable", facts, err)
			}
			return
		}
		if len(facts) == 0 {
			t.Fatal("accepted answer asserts no fact")
		}
		ids := map[string]bool{}
		for _, fc := range facts {
			if fc.AmountMinor < 0 || fc.AmountMinor > payment.MaxAmountMinor {
				t.Fatalf("bad amount in %+v", fc)
			}
			if fc.RefundID != "" {
				if ids[fc.RefundID] {
					t.Fatalf("refund id twice in %+v", facts)
				}
				ids[fc.RefundID] = true
			}
		}
		again, err := d.ParseRefetch(body)
		if err != nil || !reflect.DeepEqual(again, facts) {
			t.Fatalf("re-parse differs: %+v, %v", again, err)
		}
		j, _ := json.Marshal(facts)
		var back []payment.Fact
		if err := json.Unmarshal(j, &back); err != nil || !reflect.DeepEqual(back, facts) {
			t.Fatalf("JSON round trip: %+v, %v", back, err)
		}
		checkRefetchConverges(t, facts, "")
	})
}
