package mercadopago

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
)

func refetchDriver(t testing.TB) *Driver {
	t.Helper()
	d, err := New(provider.Config{Secrets: []string{oldSecret}})
	if err != nil {
		t.Fatal(err)
	}
	return d.(*Driver)
}

func TestRefetchRequest(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t)
	ctx := context.Background()
	for _, tc := range []struct{ base, want string }{
		{"", "https://api.mercadopago.com/v1/payments/83791262741"},
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080/v1/payments/83791262741"},
		{"http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1/payments/83791262741"},
		{"https://proxy.internal/mp/", "https://proxy.internal/mp/v1/payments/83791262741"},
	} {
		req, err := d.RefetchRequest(ctx, tc.base, "APP_USR-123-abc", "83791262741")
		if err != nil {
			t.Fatalf("RefetchRequest(%q): %v", tc.base, err)
		}
		if req.Method != http.MethodGet || req.URL.String() != tc.want {
			t.Errorf("RefetchRequest(%q) = %s %s, want GET %s", tc.base, req.Method, req.URL, tc.want)
		}
		if got := req.Header.Get("Authorization"); got != "Bearer APP_USR-123-abc" {
			t.Errorf("Authorization = %q", got)
		}
		if req.Context() != ctx {
			t.Error("request does not carry the context")
		}
	}
	for name, tc := range map[string]struct{ base, token, id string }{
		"empty token":         {"", "", "1"},
		"token with newline":  {"", "tok\r\nX-Evil: 1", "1"},
		"token with space":    {"", "tok en", "1"},
		"empty id":            {"", "s3cr3t-tok", ""},
		"dot-dot id":          {"", "s3cr3t-tok", ".."},
		"path in id":          {"", "s3cr3t-tok", "1/../../users/me"},
		"alphanumeric id":     {"", "s3cr3t-tok", "ORD01J"},
		"21-digit id":         {"", "s3cr3t-tok", "123456789012345678901"},
		"ftp base":            {"ftp://example.com", "s3cr3t-tok", "1"},
		"relative base":       {"/v1", "s3cr3t-tok", "1"},
		"base with user info": {"https://user:pass@example.com", "s3cr3t-tok", "1"},
		"base with query":     {"https://example.com/?x=1", "s3cr3t-tok", "1"},
		"unparsable base":     {"http://[::1", "s3cr3t-tok", "1"},
	} {
		if req, err := d.RefetchRequest(ctx, tc.base, tc.token, tc.id); err == nil {
			t.Errorf("%s: RefetchRequest = %s, want an error", name, req.URL)
		} else if tc.token != "" && strings.Contains(err.Error(), tc.token) {
			t.Errorf("%s: error %q reveals the token", name, err)
		} else if strings.Contains(err.Error(), "pass") {
			t.Errorf("%s: error %q reveals the base URL's password", name, err)
		}
	}
}

func TestAlwaysRefetch(t *testing.T) {
	t.Parallel()
	var drv provider.Driver = refetchDriver(t)
	a, ok := drv.(interface{ AlwaysRefetch() bool })
	if !ok || !a.AlwaysRefetch() {
		t.Fatal("the Mercado Pago driver must report AlwaysRefetch")
	}
}

// mp builds a compact Mercado Pago payment resource; fields override the
// defaults of an approved BRL 100.00 card payment.
func mp(fields string) string {
	base := map[string]string{
		"id":                          `5001`,
		"status":                      `"approved"`,
		"status_detail":               `"accredited"`,
		"currency_id":                 `"BRL"`,
		"transaction_amount":          `100`,
		"transaction_amount_refunded": `0`,
		"date_created":                `"2024-06-12T16:44:58.000-04:00"`,
		"date_approved":               `"2024-06-12T16:45:03.000-04:00"`,
		"date_last_updated":           `"2024-06-12T16:45:03.000-04:00"`,
		"refunds":                     `[]`,
	}
	order := []string{"id", "status", "status_detail", "currency_id", "transaction_amount", "transaction_amount_refunded", "date_created", "date_approved", "date_last_updated", "refunds"}
	for _, kv := range splitTop(fields) {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := base[k]; !ok {
			order = append(order, k)
		}
		base[k] = v
	}
	var b strings.Builder
	b.WriteString("{")
	first := true
	for _, k := range order {
		v := base[k]
		if v == "-" {
			continue
		}
		if !first {
			b.WriteString(",")
		}
		first = false
		b.WriteString(`"` + k + `":` + v)
	}
	b.WriteString("}")
	return b.String()
}

// splitTop splits "a=1;b=[x;y]" on the semicolons outside brackets.
func splitTop(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[', '{':
			depth++
		case ']', '}':
			depth--
		case ';':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func brl(s payment.Status, amount int64, when string) payment.Fact {
	return payment.Fact{Status: s, AmountMinor: amount, Currency: "BRL", OccurredAt: at(when)}
}

func brlRefund(s payment.Status, id string, amount int64, when string) payment.Fact {
	return payment.Fact{Status: s, RefundID: id, AmountMinor: amount, Currency: "BRL", OccurredAt: at(when)}
}

const (
	created  = "2024-06-12T20:44:58Z"
	approved = "2024-06-12T20:45:03Z"
)

type refetchCase struct {
	name string
	body string
	want []payment.Fact // nil: ErrUnprocessable
	// final is the status the facts leave a new payment in.
	final payment.Status
}

func refetchCases(t testing.TB) []refetchCase {
	file := func(name string) string {
		b, err := os.ReadFile(filepath.Join("testdata", "refetch", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	refunds2 := `[{"id":7001,"amount":30.5,"status":"approved","date_created":"2024-06-14T10:00:00.000-04:00"},{"id":7002,"amount":69.50,"status":"approved","date_created":"2024-06-15T10:00:00.000-04:00"}]`
	return []refetchCase{
		// Full resources, shaped as GET /v1/payments/{id} answers.
		{name: "approved card payment", body: file("approved.json"), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 25990, approved)}},
		{name: "approved with partial refunds (one still in process)", body: file("approved_partially_refunded.json"), final: payment.StatusPartiallyRefunded,
			want: []payment.Fact{
				brl(payment.StatusPaid, 25990, approved),
				brlRefund(payment.StatusPartiallyRefunded, "1009042015", 1000, "2024-06-14T14:00:00Z"),
				brlRefund(payment.StatusPartiallyRefunded, "1009042016", 5000, "2024-06-20T13:12:44Z"),
			}},
		{name: "refunded in full by one refund", body: file("refunded.json"), final: payment.StatusRefunded,
			want: []payment.Fact{
				brl(payment.StatusPaid, 25990, approved),
				brlRefund(payment.StatusRefunded, "1009042099", 25990, "2024-06-13T15:00:00Z"),
			}},
		{name: "charged back, settled against the seller", body: file("charged_back_settled.json"), final: payment.StatusDisputeLost,
			want: []payment.Fact{
				brl(payment.StatusPaid, 25990, approved),
				brl(payment.StatusDisputed, 25990, "2024-07-30T16:00:00Z"),
				brl(payment.StatusDisputeLost, 25990, "2024-07-30T16:00:00Z"),
			}},
		{name: "pix waiting for transfer", body: file("pending_pix.json"), final: payment.StatusPending,
			want: []payment.Fact{brl(payment.StatusPending, 25990, created)}},

		// Every status.
		{name: "in_process", body: mp(`status="in_process";status_detail="pending_review_manual";date_approved=null`), final: payment.StatusPending,
			want: []payment.Fact{brl(payment.StatusPending, 10000, created)}},
		{name: "authorized", body: mp(`status="authorized";status_detail="pending_capture";date_approved=null;date_last_updated="2024-06-12T16:45:00.000-04:00"`), final: payment.StatusAuthorized,
			want: []payment.Fact{brl(payment.StatusAuthorized, 10000, "2024-06-12T20:45:00Z")}},
		{name: "rejected", body: mp(`status="rejected";status_detail="cc_rejected_insufficient_amount";date_approved=null`), final: payment.StatusFailed,
			want: []payment.Fact{brl(payment.StatusFailed, 10000, approved)}},
		{name: "cancelled (expired boleto)", body: mp(`status="cancelled";status_detail="expired";date_approved=null;date_last_updated="2024-06-15T23:59:59.000-04:00"`), final: payment.StatusCanceled,
			want: []payment.Fact{brl(payment.StatusCanceled, 10000, "2024-06-16T03:59:59Z")}},
		{name: "approved without date_approved uses date_last_updated", body: mp(`date_approved=null;date_last_updated="2024-06-12T17:00:00.000-04:00"`), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, "2024-06-12T21:00:00Z")}},
		{name: "approved, refunds adding up to the amount", body: mp(`status_detail="partially_refunded";transaction_amount_refunded=100.00;refunds=` + refunds2), final: payment.StatusRefunded,
			want: []payment.Fact{
				brl(payment.StatusPaid, 10000, approved),
				brlRefund(payment.StatusPartiallyRefunded, "7001", 3050, "2024-06-14T14:00:00Z"),
				brlRefund(payment.StatusRefunded, "7002", 6950, "2024-06-15T14:00:00Z"),
			}},
		{name: "refunded without refunds listed: refunded in full", body: mp(`status="refunded";status_detail="by_admin";transaction_amount_refunded=100;date_last_updated="2024-06-13T10:00:00.000-04:00"`), final: payment.StatusRefunded,
			want: []payment.Fact{
				brl(payment.StatusPaid, 10000, approved),
				{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: at("2024-06-13T14:00:00Z")},
			}},
		{name: "refunded, refunds short of the amount: the rest in full", body: mp(`status="refunded";transaction_amount_refunded=100;date_last_updated="2024-06-16T10:00:00.000-04:00";refunds=[{"id":7001,"amount":30.5,"status":"approved","date_created":"2024-06-14T10:00:00.000-04:00"}]`), final: payment.StatusRefunded,
			want: []payment.Fact{
				brl(payment.StatusPaid, 10000, approved),
				brlRefund(payment.StatusPartiallyRefunded, "7001", 3050, "2024-06-14T14:00:00Z"),
				{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: at("2024-06-16T14:00:00Z")},
			}},
		{name: "in_mediation", body: mp(`status="in_mediation";status_detail="accredited";date_last_updated="2024-06-20T10:00:00.000-04:00"`), final: payment.StatusDisputed,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z")}},
		{name: "charged_back in process: dispute open", body: mp(`status="charged_back";status_detail="in_process";date_last_updated="2024-06-20T10:00:00.000-04:00"`), final: payment.StatusDisputed,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z")}},
		{name: "charged_back reimbursed: dispute won", body: mp(`status="charged_back";status_detail="reimbursed";date_last_updated="2024-06-20T10:00:00.000-04:00"`), final: payment.StatusDisputeWon,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z"), brl(payment.StatusDisputeWon, 10000, "2024-06-20T14:00:00Z")}},
		{name: "charged_back without detail: lost", body: mp(`status="charged_back";status_detail=null;date_last_updated="2024-06-20T10:00:00.000-04:00"`), final: payment.StatusDisputeLost,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z"), brl(payment.StatusDisputeLost, 10000, "2024-06-20T14:00:00Z")}},
		{name: "charged_back with an unknown detail: dispute kept open", body: mp(`status="charged_back";status_detail="something_new";date_last_updated="2024-06-20T10:00:00.000-04:00"`), final: payment.StatusDisputed,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z")}},
		{name: "charged_back after a partial refund: refund and dispute in time order", body: mp(`status="charged_back";status_detail="settled";date_last_updated="2024-06-20T10:00:00.000-04:00";refunds=[{"id":7003,"amount":10,"status":"approved","date_created":"2024-06-25T10:00:00.000-04:00"},{"id":7001,"amount":30.5,"date_created":"2024-06-14T10:00:00.000-04:00"}]`), final: payment.StatusDisputeLost,
			want: []payment.Fact{
				brl(payment.StatusPaid, 10000, approved),
				brlRefund(payment.StatusPartiallyRefunded, "7001", 3050, "2024-06-14T14:00:00Z"),
				brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z"),
				brl(payment.StatusDisputeLost, 10000, "2024-06-20T14:00:00Z"),
				brlRefund(payment.StatusPartiallyRefunded, "7003", 1000, "2024-06-25T14:00:00Z"),
			}},
		{name: "rejected and cancelled refunds are left out", body: mp(`refunds=[{"id":7001,"amount":30.5,"status":"rejected","date_created":"2024-06-14T10:00:00.000-04:00"},{"id":7001,"amount":1,"status":"cancelled","date_created":"2024-06-14T10:00:00.000-04:00"}]`), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, approved)}},
		{name: "refund id as a string, refund without date", body: mp(`transaction_amount_refunded=1;refunds=[{"id":"7001","amount":1}]`), final: payment.StatusPartiallyRefunded,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brlRefund(payment.StatusPartiallyRefunded, "7001", 100, approved)}},
		{name: "id as a string, no transaction_amount_refunded", body: mp(`id="5001";transaction_amount_refunded=-`), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, approved)}},
		{name: "CLP has no minor unit", body: mp(`currency_id="CLP";transaction_amount=15990`), final: payment.StatusPaid,
			want: []payment.Fact{{Status: payment.StatusPaid, AmountMinor: 15990, Currency: "CLP", OccurredAt: at(approved)}}},
		{name: "lower-case currency, exponent amount", body: mp(`currency_id="ars";transaction_amount=1.5e3`), final: payment.StatusPaid,
			want: []payment.Fact{{Status: payment.StatusPaid, AmountMinor: 150000, Currency: "ARS", OccurredAt: at(approved)}}},

		// Unusable answers.
		{name: "Mercado Pago 404 error body", body: `{"message":"Payment not found","error":"not_found","status":404,"cause":[{"code":2000,"description":"Payment not found","data":null}]}`},
		{name: "unknown status", body: mp(`status="approved_pending"`)},
		{name: "missing status", body: mp(`status=-`)},
		{name: "missing id", body: mp(`id=-`)},
		{name: "fractional id", body: mp(`id=5001.5`)},
		{name: "missing currency", body: mp(`currency_id=-`)},
		{name: "unknown currency", body: mp(`currency_id="XXX"`)},
		{name: "missing amount", body: mp(`transaction_amount=-`)},
		{name: "zero amount", body: mp(`transaction_amount=0`)},
		{name: "negative amount", body: mp(`transaction_amount=-100`)},
		{name: "minus zero amount", body: mp(`transaction_amount=-0`)},
		{name: "over-precise amount", body: mp(`transaction_amount=100.001`)},
		{name: "400-digit amount", body: mp(`transaction_amount=` + strings.Repeat("9", 400))},
		{name: "amount above 2^53-1 minor units", body: mp(`transaction_amount=90071992547409.92`)},
		{name: "NaN amount", body: mp(`transaction_amount="NaN"`)},
		{name: "missing date_created", body: mp(`date_created=-`)},
		{name: "bad date", body: mp(`date_approved="12/06/2024"`)},
		{name: "year 10000", body: mp(`date_last_updated="10000-01-01T00:00:00Z"`)},
		{name: "refunds on a pending payment", body: mp(`status="pending";date_approved=null;refunds=[{"id":7001,"amount":1,"date_created":"2024-06-14T10:00:00.000-04:00"}]`)},
		{name: "duplicate refund id", body: mp(`transaction_amount_refunded=2;refunds=[{"id":7001,"amount":1},{"id":7001,"amount":1}]`)},
		{name: "refund without id", body: mp(`refunds=[{"amount":1}]`)},
		{name: "refund without amount", body: mp(`refunds=[{"id":7001}]`)},
		{name: "zero refund", body: mp(`refunds=[{"id":7001,"amount":0}]`)},
		{name: "refunds over the amount", body: mp(`transaction_amount_refunded=100.01;refunds=[{"id":7001,"amount":100},{"id":7002,"amount":0.01}]`)},
		{name: "transaction_amount_refunded disagrees", body: mp(`transaction_amount_refunded=50;refunds=[{"id":7001,"amount":30.5}]`)},
		{name: "refunded but transaction_amount_refunded short", body: mp(`status="refunded";transaction_amount_refunded=50`)},
		{name: "duplicate key", body: strings.Replace(mp(``), `{`, `{"status":"refunded",`, 1)},
		{name: "duplicate key in a refund", body: mp(`refunds=[{"id":7001,"amount":1,"amount":2}]`)},
		{name: "trailing data", body: mp(``) + `{}`},
		{name: "array", body: `[` + mp(``) + `]`},
		{name: "empty", body: ``},
	}
}

func TestParseRefetch(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t)
	for _, tc := range refetchCases(t) {
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
				t.Fatalf("ParseRefetch =\n%s\nwant\n%s", dump(got), dump(tc.want))
			}
			checkConverges(t, got, tc.final)
		})
	}
}

func dump(fs []payment.Fact) string {
	var b strings.Builder
	for _, f := range fs {
		j, _ := json.Marshal(f)
		b.WriteString("  " + string(j) + "\n")
	}
	return b.String()
}

// checkConverges replays facts on a new payment: in the order given every
// fact applies (nothing is left deferred or ignored) and the payment ends in
// final; in reverse and shuffled orders, with duplicates, it ends in an
// Equivalent state with the same balances.
func checkConverges(t testing.TB, facts []payment.Fact, final payment.Status) {
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
	rng := rand.New(rand.NewPCG(uint64(len(facts)), 7))
	for round := range 8 {
		order := append([]payment.Fact(nil), facts...)
		switch round {
		case 0:
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		default:
			order = append(order, facts[rng.IntN(len(facts))])
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		got := m.Replay(payment.State{}, order)
		if !got.State.Equivalent(in.State) {
			t.Fatalf("order %d: state %+v, in order %+v", round, got.State, in.State)
		}
		if !reflect.DeepEqual(got.State.Balances(), in.State.Balances()) {
			t.Fatalf("order %d: balances %v, in order %v", round, got.State.Balances(), in.State.Balances())
		}
	}
	// A second refetch of the same answer changes nothing.
	again := m.Replay(in.State, facts)
	if len(again.Transitions) != 0 {
		t.Fatalf("refetching the same answer again made transitions: %+v", again.Transitions)
	}
}

// TestRefetchSequence checks that successive refetches of one payment as it
// evolves (pending, approved, partially refunded, refunded) converge with
// the state in-order delivery gives.
func TestRefetchSequence(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t)
	snapshots := []string{
		mp(`status="pending";status_detail="pending_waiting_transfer";date_approved=null`),
		mp(``),
		mp(`transaction_amount_refunded=30.5;refunds=[{"id":7001,"amount":30.5,"status":"approved","date_created":"2024-06-14T10:00:00.000-04:00"}]`),
		mp(`status="refunded";transaction_amount_refunded=100;refunds=[{"id":7001,"amount":30.5,"status":"approved","date_created":"2024-06-14T10:00:00.000-04:00"},{"id":7002,"amount":69.5,"status":"approved","date_created":"2024-06-15T10:00:00.000-04:00"}]`),
	}
	var m payment.Machine
	var s payment.State
	var all []payment.Fact
	for i, body := range snapshots {
		facts, err := d.ParseRefetch([]byte(body))
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		all = append(all, facts...)
		r := m.Replay(s, facts)
		for j, dec := range r.Decisions {
			if dec.Outcome == payment.OutcomeDeferred {
				t.Fatalf("snapshot %d fact %d deferred: %s", i, j, dec.Reason)
			}
		}
		s = r.State
	}
	if s.Status != payment.StatusRefunded || s.RefundedMinor != 10000 || s.CapturedMinor != 10000 {
		t.Fatalf("final state %+v", s)
	}
	// The latest snapshot alone, or every fact shuffled, gives the same.
	last, _ := d.ParseRefetch([]byte(snapshots[len(snapshots)-1]))
	if got := m.Replay(payment.State{}, last).State; !got.Equivalent(s) {
		t.Fatalf("last snapshot alone: %+v, want %+v", got, s)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	if got := m.Replay(payment.State{}, all).State; !got.Equivalent(s) {
		t.Fatalf("all facts shuffled: %+v, want %+v", got, s)
	}
}

// TestRefetchAgainstGateway runs the whole refetch against a local server
// playing Mercado Pago's API.
func TestRefetchAgainstGateway(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	approvedAt := at(approved)
	gw.SetPayment("83791262741", gatewaytest.MercadoPagoPayment{
		ID: 83791262741, Status: "approved", StatusDetail: "partially_refunded", CurrencyID: "BRL",
		TransactionAmount: "259.90", TransactionAmountRefunded: "10.00",
		DateCreated: at(created), DateApproved: &approvedAt, DateLastUpdated: at("2024-06-14T14:00:00Z"),
		Refunds: []gatewaytest.MercadoPagoRefund{{ID: 1009042015, PaymentID: 83791262741, Amount: "10.00", Status: "approved", DateCreated: at("2024-06-14T14:00:00Z")}},
	})
	d := refetchDriver(t)
	fetch := func(token, id string) (int, []payment.Fact, error) {
		req, err := d.RefetchRequest(context.Background(), gw.URL(), token, id)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := gw.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, nil, nil
		}
		facts, err := d.ParseRefetch(body)
		return resp.StatusCode, facts, err
	}
	status, facts, err := fetch(gw.Token(), "83791262741")
	if status != http.StatusOK || err != nil {
		t.Fatalf("refetch: %d, %v", status, err)
	}
	want := []payment.Fact{
		brl(payment.StatusPaid, 25990, approved),
		brlRefund(payment.StatusPartiallyRefunded, "1009042015", 1000, "2024-06-14T14:00:00Z"),
	}
	if !reflect.DeepEqual(facts, want) {
		t.Fatalf("facts\n%s\nwant\n%s", dump(facts), dump(want))
	}
	if status, _, _ := fetch("wrong-token", "83791262741"); status != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", status)
	}
	if status, _, _ := fetch(gw.Token(), "1"); status != http.StatusNotFound {
		t.Fatalf("unknown payment: %d", status)
	}
	if gw.RequestsFor("83791262741") != 2 || gw.Requests() != 3 {
		t.Fatalf("requests: %d for the payment, %d in all", gw.RequestsFor("83791262741"), gw.Requests())
	}
}

// FuzzParseRefetch checks ParseRefetch on arbitrary answers: it never
// panics; a rejection wraps provider.ErrUnprocessable and returns no facts;
// accepted facts are well formed, deterministic, survive a JSON round trip,
// all apply in the order given to a new payment, and converge in reverse
// order.
func FuzzParseRefetch(f *testing.F) {
	for _, tc := range refetchCases(f) {
		f.Add([]byte(tc.body))
	}
	b, err := os.ReadFile(filepath.Join("testdata", "refetch", "approved_partially_refunded.json"))
	if err != nil {
		f.Fatal(err)
	}
	s := string(b)
	for _, v := range []string{
		s[:len(s)/2],
		strings.Replace(s, `"amount": 50`, `"amount": 5e1`, 1),
		strings.Replace(s, `"amount": 50`, `"amount": 259.9`, 1),
		strings.Replace(s, `"status": "in_process"`, `"status": "approved"`, 1),
		strings.Replace(s, `"id": 1009042016`, `"id": 1009042015`, 1),
		strings.Replace(s, `"transaction_amount": 259.90`, `"transaction_amount": 259.90e0`, 1),
		strings.Replace(s, `"currency_id": "BRL"`, `"currency_id": "JPY"`, 1),
		strings.Replace(s, `"status": "approved",`, `"status": "charged_back",`, 1),
		strings.Replace(s, `"status": "approved",`, `"status": "in_mediation",`, 1),
		strings.Replace(s, `"status": "approved",`, `"status": "refunded",`, 1),
		strings.Replace(s, `"date_created": "2024-06-14T10:00:00.000-04:00"`, `"date_created": "1969-12-31T23:59:59Z"`, 1),
		strings.Replace(s, `"Pedido #10293"`, `"Pedido \u0000"`, 1),
		strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40),
	} {
		f.Add([]byte(v))
	}
	d := refetchDriver(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		facts, err := d.ParseRefetch(body)
		if err != nil {
			if !errors.Is(err, provider.ErrUnprocessable) {
				t.Fatalf("error does not wrap ErrUnprocessable: %v", err)
			}
			if facts != nil {
				t.Fatalf("rejected answer returned facts: %+v", facts)
			}
			return
		}
		if len(facts) == 0 {
			t.Fatal("accepted answer asserts no fact")
		}
		ids := map[string]bool{}
		for _, fc := range facts {
			if fc.AmountMinor < 0 || fc.AmountMinor > payment.MaxAmountMinor || len(fc.Currency) != 3 || strings.ToUpper(fc.Currency) != fc.Currency {
				t.Fatalf("malformed fact %+v", fc)
			}
			if y := fc.OccurredAt.Year(); y < 1970 || y > 9999 || fc.OccurredAt.Location() != time.UTC {
				t.Fatalf("bad OccurredAt in %+v", fc)
			}
			if fc.RefundID != "" {
				if ids[fc.RefundID] || provider.CheckID("refund id", fc.RefundID) != nil {
					t.Fatalf("bad or repeated refund id in %+v", facts)
				}
				ids[fc.RefundID] = true
			}
		}
		again, err := d.ParseRefetch(body)
		if err != nil || !reflect.DeepEqual(again, facts) {
			t.Fatalf("re-parse differs: %+v, %v", again, err)
		}
		j, err := json.Marshal(facts)
		if err != nil {
			t.Fatal(err)
		}
		var back []payment.Fact
		if err := json.Unmarshal(j, &back); err != nil || !reflect.DeepEqual(back, facts) {
			t.Fatalf("JSON round trip: %+v, %v", back, err)
		}
		checkConverges(t, facts, "")
	})
}
