package zoop

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
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
)

func refetchDriver(t testing.TB) *Driver {
	t.Helper()
	d, err := New(provider.Config{Secrets: []string{oldSecret}, Options: config().Options})
	if err != nil {
		t.Fatal(err)
	}
	return d.(*Driver)
}

func TestRefetchRequest(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t)
	ctx := context.Background()
	path := "/v1/marketplaces/" + marketplace + "/transactions/" + txID
	for _, tc := range []struct{ base, want string }{
		{"", "https://api.zoop.ws" + path},
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080" + path},
		{"http://127.0.0.1:8080/", "http://127.0.0.1:8080" + path},
		{"https://proxy.internal/zoop/", "https://proxy.internal/zoop" + path},
	} {
		req, err := d.RefetchRequest(ctx, tc.base, "zpk_prod_fLDQqil50te59vqiqsSJ7AZ9", txID)
		if err != nil {
			t.Fatalf("RefetchRequest(%q): %v", tc.base, err)
		}
		if req.Method != http.MethodGet || req.URL.String() != tc.want {
			t.Errorf("RefetchRequest(%q) = %s %s, want GET %s", tc.base, req.Method, req.URL, tc.want)
		}
		// Basic auth, the key as the user and an empty password, computed
		// here without net/http.
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte("zpk_prod_fLDQqil50te59vqiqsSJ7AZ9:"))
		if got := req.Header.Get("Authorization"); got != want {
			t.Errorf("Authorization = %q, want %q", got, want)
		}
		if req.Context() != ctx {
			t.Error("request does not carry the context")
		}
	}
	for name, tc := range map[string]struct{ base, token, id string }{
		"empty key":           {"", "", txID},
		"key with newline":    {"", "zpk\r\nX-Evil: 1", txID},
		"key with space":      {"", "zpk key", txID},
		"key with colon":      {"", "zpk_key:password", txID},
		"empty id":            {"", "zpk_s3cr3t", ""},
		"dot-dot id":          {"", "zpk_s3cr3t", ".."},
		"path in id":          {"", "zpk_s3cr3t", "1/../../sellers"},
		"escaped path in id":  {"", "zpk_s3cr3t", "1%2F..%2Fsellers"},
		"65-byte id":          {"", "zpk_s3cr3t", strings.Repeat("a", 65)},
		"ftp base":            {"ftp://example.com", "zpk_s3cr3t", txID},
		"relative base":       {"/v1", "zpk_s3cr3t", txID},
		"base with user info": {"https://user:pass@example.com", "zpk_s3cr3t", txID},
		"base with query":     {"https://example.com/?x=1", "zpk_s3cr3t", txID},
		"unparsable base":     {"http://[::1", "zpk_s3cr3t", txID},
	} {
		if req, err := d.RefetchRequest(ctx, tc.base, tc.token, tc.id); err == nil {
			t.Errorf("%s: RefetchRequest = %s, want an error", name, req.URL)
		} else if strings.Contains(err.Error(), "s3cr3t") || (tc.token != "" && strings.Contains(err.Error(), tc.token)) {
			t.Errorf("%s: error %q reveals the key", name, err)
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
		t.Fatal("the Zoop driver must report AlwaysRefetch")
	}
	if _, ok := drv.(provider.Refetcher); !ok {
		t.Fatal("the Zoop driver must implement provider.Refetcher")
	}
}

const (
	ztID      = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
	ztCreated = "2024-06-12T19:44:58Z"
	ztPaid    = "2024-06-12T19:45:03Z"
	ztUpdated = "2024-06-20T13:00:00Z"
)

// hist builds one history entry of transaction ztID; at is a zone-less
// Zoop history time.
func hist(id, opType, status, amount, at string) string {
	return `{"id":"` + id + `","transaction":"` + ztID + `","amount":"` + amount + `","operation_type":"` + opType +
		`","status":"` + status + `","created_at":"` + at + `"}`
}

// zt builds a compact Zoop transaction resource; fields ("key=json;…",
// "key=-" to drop one) override the defaults of a succeeded, captured BRL
// 100.00 card payment.
func zt(fields string) string {
	base := map[string]string{
		"id":           `"` + ztID + `"`,
		"resource":     `"transaction"`,
		"status":       `"succeeded"`,
		"amount":       `"100.00"`,
		"currency":     `"BRL"`,
		"payment_type": `"credit"`,
		"captured":     `true`,
		"uri":          `"/v1/marketplaces/` + marketplace + `/transactions/` + ztID + `"`,
		"created_at":   `"2024-06-12T19:44:58+00:00"`,
		"updated_at":   `"2024-06-20T13:00:00+00:00"`,
		"history": `[` + hist("h0", "created", "succeeded", "100.00", "2024-06-12 19:44:58") + `,` +
			hist("h1", "authorization", "succeeded", "100.00", "2024-06-12 19:45:03") + `]`,
	}
	order := []string{"id", "resource", "status", "amount", "currency", "payment_type", "captured", "uri", "created_at", "updated_at", "history"}
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
		if v := base[k]; v != "-" {
			if !first {
				b.WriteString(",")
			}
			first = false
			b.WriteString(`"` + k + `":` + v)
		}
	}
	b.WriteString("}")
	return b.String()
}

// withVoids is zt's default history plus entries.
func withVoids(entries ...string) string {
	return `history=[` + hist("h0", "created", "succeeded", "100.00", "2024-06-12 19:44:58") + `,` +
		hist("h1", "authorization", "succeeded", "100.00", "2024-06-12 19:45:03") + `,` + strings.Join(entries, ",") + `]`
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

func fullRefund(when string) payment.Fact {
	return payment.Fact{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: at(when)}
}

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
	voided := `status="canceled";captured=false;voided_at="2024-06-13T10:00:00+00:00";history=[` +
		hist("h2", "pre_authorization", "succeeded", "100.00", "2024-06-12 19:45:00") + `,` +
		hist("h3", "void", "succeeded", "100.00", "2024-06-13 10:00:00") + `]`
	return []refetchCase{
		// Full resources, shaped as GET /v1/marketplaces/{id}/transactions/{id} answers.
		{name: "succeeded card payment", body: file("succeeded_card.json"), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 148434, "2020-07-06T14:01:51Z")}},
		{name: "card payment voided after capture", body: file("canceled_card.json"), final: payment.StatusRefunded,
			want: []payment.Fact{
				brl(payment.StatusPaid, 500, "2020-06-15T21:09:46Z"),
				brlRefund(payment.StatusRefunded, "b466a67a7be2455aab2f7d587a3024ae", 500, "2020-06-15T21:10:09Z"),
			}},
		{name: "pre-authorized card", body: file("pre_authorized.json"), final: payment.StatusAuthorized,
			want: []payment.Fact{brl(payment.StatusAuthorized, 1499, "2020-06-26T12:20:18Z")}},
		{name: "captured pre-authorization, partially voided (a failed void left out)", body: file("partially_refunded.json"), final: payment.StatusPartiallyRefunded,
			want: []payment.Fact{
				brl(payment.StatusPaid, 25990, "2024-06-12T19:45:03Z"),
				brlRefund(payment.StatusPartiallyRefunded, "c0ffee00000000000000000000000004", 1000, "2024-06-14T14:00:00Z"),
			}},
		{name: "pix waiting for payment", body: file("pix_pending.json"), final: payment.StatusPending,
			want: []payment.Fact{brl(payment.StatusPending, 10000, ztCreated)}},

		// Every status.
		{name: "new", body: zt(`status="new";captured=false;history=[]`), final: payment.StatusPending,
			want: []payment.Fact{brl(payment.StatusPending, 10000, ztCreated)}},
		{name: "failed", body: zt(`status="failed";captured=false;history=[` + hist("h1", "authorization", "failed", "100.00", "2024-06-12 19:45:03") + `]`), final: payment.StatusFailed,
			want: []payment.Fact{brl(payment.StatusFailed, 10000, ztUpdated)}},
		{name: "pre_authorized without a pre_authorization entry", body: zt(`status="pre_authorized";captured=false;history=-`), final: payment.StatusAuthorized,
			want: []payment.Fact{brl(payment.StatusAuthorized, 10000, ztUpdated)}},
		{name: "pre-authorization voided before capture: canceled, no money", body: zt(voided), final: payment.StatusCanceled,
			want: []payment.Fact{brl(payment.StatusCanceled, 10000, "2024-06-13T10:00:00Z")}},
		{name: "reversed, never captured", body: zt(`status="reversed";captured=false;history=[]`), final: payment.StatusCanceled,
			want: []payment.Fact{brl(payment.StatusCanceled, 10000, ztUpdated)}},
		{name: "canceled without captured flag, history shows the capture", body: zt(`status="canceled";captured=-;` + withVoids(hist("v1", "void", "succeeded", "100.00", "2024-06-13 10:00:00"))), final: payment.StatusRefunded,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), brlRefund(payment.StatusRefunded, "v1", 10000, "2024-06-13T10:00:00Z")}},
		{name: "canceled after capture, no void listed: refunded in full", body: zt(`status="canceled";voided_at="2024-06-13T10:00:00+00:00"`), final: payment.StatusRefunded,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), fullRefund("2024-06-13T10:00:00Z")}},
		{name: "refunded pix, no history: paid and refunded in full", body: zt(`status="refunded";payment_type="pix";history=[]`), final: payment.StatusRefunded,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztUpdated), fullRefund(ztUpdated)}},
		{name: "refunded, voids short of the capture: the rest in full", body: zt(`status="refunded";` + withVoids(hist("v1", "void", "succeeded", "30.50", "2024-06-14 10:00:00"))), final: payment.StatusRefunded,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), brlRefund(payment.StatusPartiallyRefunded, "v1", 3050, "2024-06-14T10:00:00Z"), fullRefund(ztUpdated)}},
		{name: "succeeded, voids adding up to the capture", body: zt(withVoids(hist("v2", "void", "succeeded", "69.50", "2024-06-15 10:00:00"), hist("v1", "refund", "succeeded", "30.50", "2024-06-14 10:00:00"))), final: payment.StatusRefunded,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), brlRefund(payment.StatusPartiallyRefunded, "v1", 3050, "2024-06-14T10:00:00Z"), brlRefund(payment.StatusRefunded, "v2", 6950, "2024-06-15T10:00:00Z")}},
		{name: "partial capture of a pre-authorization", body: zt(`history=[` + hist("h2", "pre_authorization", "succeeded", "100.00", "2024-06-12 19:45:00") + `,` + hist("h3", "capture", "succeeded", "80.00", "2024-06-12 19:45:03") + `]`), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 8000, ztPaid)}},
		{name: "boleto paid, no history", body: zt(`payment_type="boleto";history=-`), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztUpdated)}},
		{name: "dispute", body: zt(`status="dispute"`), final: payment.StatusDisputed,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), brl(payment.StatusDisputed, 10000, ztUpdated)}},
		{name: "charged back after a partial refund: in time order", body: zt(`status="charged_back";` + withVoids(hist("v1", "void", "succeeded", "10.00", "2024-06-14 10:00:00"), hist("v3", "void", "succeeded", "5.00", "2024-06-25 10:00:00"))), final: payment.StatusDisputeLost,
			want: []payment.Fact{
				brl(payment.StatusPaid, 10000, ztPaid),
				brlRefund(payment.StatusPartiallyRefunded, "v1", 1000, "2024-06-14T10:00:00Z"),
				brl(payment.StatusDisputed, 10000, ztUpdated),
				brl(payment.StatusDisputeLost, 10000, ztUpdated),
				brlRefund(payment.StatusPartiallyRefunded, "v3", 500, "2024-06-25T10:00:00Z"),
			}},
		{name: "lower-case currency, no uri, no updated_at", body: zt(`currency="brl";uri=-;updated_at=-;history=[]`), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztCreated)}},
		{name: "no currency: BRL", body: zt(`currency=-`), final: payment.StatusPaid,
			want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid)}},

		// Unusable answers.
		{name: "Zoop 404 error body", body: `{"error":{"status":"Not Found","status_code":404,"type":"invalid_request_error","category":"resource_not_found","message":"Transaction not found"}}`},
		{name: "unknown status", body: zt(`status="approved"`)},
		{name: "missing status", body: zt(`status=-`)},
		{name: "missing id", body: zt(`id=-`)},
		{name: "id that could steer a path", body: zt(`id="../sellers";uri=-`)},
		{name: "not a transaction", body: zt(`resource="seller"`)},
		{name: "uri of another marketplace", body: zt(`uri="/v1/marketplaces/ffff/transactions/` + ztID + `"`)},
		{name: "uri of another transaction", body: zt(`uri="/v1/marketplaces/` + marketplace + `/transactions/ffff"`)},
		{name: "history entry of another transaction", body: zt(`history=[{"id":"x","transaction":"ffff","amount":"1.00","operation_type":"void","status":"succeeded"}]`)},
		{name: "amount as a JSON number", body: zt(`amount=10000`)},
		{name: "amount not a number", body: zt(`amount="abc"`)},
		{name: "missing amount", body: zt(`amount=-`)},
		{name: "negative amount", body: zt(`amount="-100.00"`)},
		{name: "zero amount", body: zt(`amount="0.00"`)},
		{name: "over-precise amount", body: zt(`amount="100.001"`)},
		{name: "400-digit amount", body: zt(`amount="` + strings.Repeat("9", 400) + `"`)},
		{name: "amount above 2^53-1 minor units", body: zt(`amount="90071992547409.92"`)},
		{name: "unknown currency", body: zt(`currency="XXX"`)},
		{name: "missing created_at", body: zt(`created_at=-`)},
		{name: "bad created_at", body: zt(`created_at="12/06/2024"`)},
		{name: "year 10000", body: zt(`updated_at="10000-01-01T00:00:00+00:00"`)},
		{name: "bad history time", body: zt(withVoids(hist("v1", "void", "succeeded", "1.00", "yesterday")))},
		{name: "duplicate void id", body: zt(withVoids(hist("v1", "void", "succeeded", "1.00", "2024-06-14 10:00:00"), hist("v1", "void", "succeeded", "1.00", "2024-06-14 10:00:00")))},
		{name: "void without id", body: zt(withVoids(hist("", "void", "succeeded", "1.00", "2024-06-14 10:00:00")))},
		{name: "void of zero", body: zt(withVoids(hist("v1", "void", "succeeded", "0.00", "2024-06-14 10:00:00")))},
		{name: "void amount as a number", body: zt(`history=[{"id":"v1","amount":1,"operation_type":"void","status":"succeeded"}]`)},
		{name: "voids over the capture", body: zt(withVoids(hist("v1", "void", "succeeded", "100.00", "2024-06-14 10:00:00"), hist("v2", "void", "succeeded", "0.01", "2024-06-14 10:00:00")))},
		{name: "capture of zero", body: zt(`history=[` + hist("h3", "capture", "succeeded", "0.00", "2024-06-12 19:45:03") + `]`)},
		{name: "duplicate key", body: strings.Replace(zt(``), `{`, `{"status":"refunded",`, 1)},
		{name: "duplicate key in history", body: zt(`history=[{"id":"v1","amount":"1.00","amount":"2.00","operation_type":"void","status":"succeeded"}]`)},
		{name: "trailing data", body: zt(``) + `{}`},
		{name: "array", body: `[` + zt(``) + `]`},
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

// TestParseRefetchFor: an answer about another transaction than the one
// asked for is refused, however well-formed; the right one parses as
// ParseRefetch does.
func TestParseRefetchFor(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t)
	body := []byte(zt(``))
	want, err := d.ParseRefetch(body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.ParseRefetchFor(ztID, body)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseRefetchFor(asked id) = %+v, %v; want %+v", got, err, want)
	}
	for _, asked := range []string{"b1b2c3d4e5f60718293a4b5c6d7e8f90", strings.ToUpper(ztID), ""} {
		if got, err := d.ParseRefetchFor(asked, body); !errors.Is(err, provider.ErrUnprocessable) || got != nil {
			t.Errorf("ParseRefetchFor(%q) = %+v, %v; want ErrUnprocessable", asked, got, err)
		}
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
// fact applies and the payment ends in final; in reverse and shuffled
// orders, with duplicates, it ends in an Equivalent state with the same
// balances; and applying the same answer again changes nothing.
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
	if again := m.Replay(in.State, facts); len(again.Transitions) != 0 {
		t.Fatalf("refetching the same answer again made transitions: %+v", again.Transitions)
	}
}

// FuzzParseRefetch checks ParseRefetch on arbitrary answers: it never
// panics; a rejection wraps provider.ErrUnprocessable and returns no facts;
// accepted facts are well formed, deterministic, survive a JSON round trip,
// all apply in the order given to a new payment, and converge in any order.
func FuzzParseRefetch(f *testing.F) {
	for _, tc := range refetchCases(f) {
		f.Add([]byte(tc.body))
	}
	b, err := os.ReadFile(filepath.Join("testdata", "refetch", "partially_refunded.json"))
	if err != nil {
		f.Fatal(err)
	}
	s := string(b)
	for _, v := range []string{
		s[:len(s)/2],
		strings.Replace(s, `"amount": "10.00"`, `"amount": "1e1"`, 1),
		strings.Replace(s, `"amount": "10.00"`, `"amount": "259.90"`, 1),
		strings.Replace(s, `"status": "failed"`, `"status": "succeeded"`, 1),
		strings.Replace(s, `c0ffee00000000000000000000000005`, `c0ffee00000000000000000000000004`, 1),
		strings.Replace(s, `"currency": "BRL"`, `"currency": "JPY"`, 1),
		strings.Replace(s, `"status": "succeeded",`, `"status": "charged_back",`, 1),
		strings.Replace(s, `"status": "succeeded",`, `"status": "canceled",`, 1),
		strings.Replace(s, `"status": "succeeded",`, `"status": "refunded",`, 1),
		strings.Replace(s, `"captured": true`, `"captured": false`, 1),
		strings.Replace(s, `"2024-06-14 14:00:00"`, `"1969-12-31 23:59:59"`, 1),
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
