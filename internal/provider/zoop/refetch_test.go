package zoop

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider/providertest"
)

func refetchDriver(t testing.TB) *Driver {
	t.Helper()
	return harness().Driver(t, oldSecret).(*Driver)
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
	return providertest.Object(base, []string{"id", "resource", "status", "amount", "currency", "payment_type", "captured", "uri", "created_at", "updated_at", "history"}, fields)
}

// withVoids is zt's default history plus entries.
func withVoids(entries ...string) string {
	return `history=[` + hist("h0", "created", "succeeded", "100.00", "2024-06-12 19:44:58") + `,` +
		hist("h1", "authorization", "succeeded", "100.00", "2024-06-12 19:45:03") + `,` + strings.Join(entries, ",") + `]`
}

var (
	at        = providertest.At
	brl       = providertest.Fact
	brlRefund = providertest.Refund
	dump      = providertest.DumpFacts
)

func fullRefund(when string) payment.Fact {
	return payment.Fact{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: at(when)}
}

func refetchCases(t testing.TB) []providertest.RefetchCase {
	voided := `status="canceled";captured=false;voided_at="2024-06-13T10:00:00+00:00";history=[` +
		hist("h2", "pre_authorization", "succeeded", "100.00", "2024-06-12 19:45:00") + `,` +
		hist("h3", "void", "succeeded", "100.00", "2024-06-13 10:00:00") + `]`
	return []providertest.RefetchCase{
		// Full resources, shaped as GET /v1/marketplaces/{id}/transactions/{id} answers.
		{Name: "succeeded card payment", Body: providertest.Answer(t, "succeeded_card.json"), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 148434, "2020-07-06T14:01:51Z")}},
		{Name: "card payment voided after capture", Body: providertest.Answer(t, "canceled_card.json"), Final: payment.StatusRefunded,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 500, "2020-06-15T21:09:46Z"),
				brlRefund(payment.StatusRefunded, "b466a67a7be2455aab2f7d587a3024ae", 500, "2020-06-15T21:10:09Z"),
			}},
		{Name: "pre-authorized card", Body: providertest.Answer(t, "pre_authorized.json"), Final: payment.StatusAuthorized,
			Want: []payment.Fact{brl(payment.StatusAuthorized, 1499, "2020-06-26T12:20:18Z")}},
		{Name: "captured pre-authorization, partially voided (a failed void left out)", Body: providertest.Answer(t, "partially_refunded.json"), Final: payment.StatusPartiallyRefunded,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 25990, "2024-06-12T19:45:03Z"),
				brlRefund(payment.StatusPartiallyRefunded, "c0ffee00000000000000000000000004", 1000, "2024-06-14T14:00:00Z"),
			}},
		{Name: "pix waiting for payment", Body: providertest.Answer(t, "pix_pending.json"), Final: payment.StatusPending,
			Want: []payment.Fact{brl(payment.StatusPending, 10000, ztCreated)}},

		// Every status.
		{Name: "new", Body: zt(`status="new";captured=false;history=[]`), Final: payment.StatusPending,
			Want: []payment.Fact{brl(payment.StatusPending, 10000, ztCreated)}},
		{Name: "failed", Body: zt(`status="failed";captured=false;history=[` + hist("h1", "authorization", "failed", "100.00", "2024-06-12 19:45:03") + `]`), Final: payment.StatusFailed,
			Want: []payment.Fact{brl(payment.StatusFailed, 10000, ztUpdated)}},
		{Name: "pre_authorized without a pre_authorization entry", Body: zt(`status="pre_authorized";captured=false;history=-`), Final: payment.StatusAuthorized,
			Want: []payment.Fact{brl(payment.StatusAuthorized, 10000, ztUpdated)}},
		{Name: "pre-authorization voided before capture: canceled, no money", Body: zt(voided), Final: payment.StatusCanceled,
			Want: []payment.Fact{brl(payment.StatusCanceled, 10000, "2024-06-13T10:00:00Z")}},
		{Name: "reversed, never captured", Body: zt(`status="reversed";captured=false;history=[]`), Final: payment.StatusCanceled,
			Want: []payment.Fact{brl(payment.StatusCanceled, 10000, ztUpdated)}},
		{Name: "canceled without captured flag, history shows the capture", Body: zt(`status="canceled";captured=-;` + withVoids(hist("v1", "void", "succeeded", "100.00", "2024-06-13 10:00:00"))), Final: payment.StatusRefunded,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), brlRefund(payment.StatusRefunded, "v1", 10000, "2024-06-13T10:00:00Z")}},
		{Name: "canceled after capture, no void listed: refunded in full", Body: zt(`status="canceled";voided_at="2024-06-13T10:00:00+00:00"`), Final: payment.StatusRefunded,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), fullRefund("2024-06-13T10:00:00Z")}},
		{Name: "refunded pix, no history: paid and refunded in full", Body: zt(`status="refunded";payment_type="pix";history=[]`), Final: payment.StatusRefunded,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztUpdated), fullRefund(ztUpdated)}},
		{Name: "refunded, voids short of the capture: the rest in full", Body: zt(`status="refunded";` + withVoids(hist("v1", "void", "succeeded", "30.50", "2024-06-14 10:00:00"))), Final: payment.StatusRefunded,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), brlRefund(payment.StatusPartiallyRefunded, "v1", 3050, "2024-06-14T10:00:00Z"), fullRefund(ztUpdated)}},
		{Name: "succeeded, voids adding up to the capture", Body: zt(withVoids(hist("v2", "void", "succeeded", "69.50", "2024-06-15 10:00:00"), hist("v1", "refund", "succeeded", "30.50", "2024-06-14 10:00:00"))), Final: payment.StatusRefunded,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), brlRefund(payment.StatusPartiallyRefunded, "v1", 3050, "2024-06-14T10:00:00Z"), brlRefund(payment.StatusRefunded, "v2", 6950, "2024-06-15T10:00:00Z")}},
		{Name: "partial capture of a pre-authorization", Body: zt(`history=[` + hist("h2", "pre_authorization", "succeeded", "100.00", "2024-06-12 19:45:00") + `,` + hist("h3", "capture", "succeeded", "80.00", "2024-06-12 19:45:03") + `]`), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 8000, ztPaid)}},
		{Name: "boleto paid, no history", Body: zt(`payment_type="boleto";history=-`), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztUpdated)}},
		{Name: "dispute", Body: zt(`status="dispute"`), Final: payment.StatusDisputed,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid), brl(payment.StatusDisputed, 10000, ztUpdated)}},
		{Name: "charged back after a partial refund: in time order", Body: zt(`status="charged_back";` + withVoids(hist("v1", "void", "succeeded", "10.00", "2024-06-14 10:00:00"), hist("v3", "void", "succeeded", "5.00", "2024-06-25 10:00:00"))), Final: payment.StatusDisputeLost,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 10000, ztPaid),
				brlRefund(payment.StatusPartiallyRefunded, "v1", 1000, "2024-06-14T10:00:00Z"),
				brl(payment.StatusDisputed, 10000, ztUpdated),
				brl(payment.StatusDisputeLost, 10000, ztUpdated),
				brlRefund(payment.StatusPartiallyRefunded, "v3", 500, "2024-06-25T10:00:00Z"),
			}},
		{Name: "lower-case currency, no uri, no updated_at", Body: zt(`currency="brl";uri=-;updated_at=-;history=[]`), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztCreated)}},
		{Name: "no currency: BRL", Body: zt(`currency=-`), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, ztPaid)}},

		// Unusable answers.
		{Name: "Zoop 404 error body", Body: `{"error":{"status":"Not Found","status_code":404,"type":"invalid_request_error","category":"resource_not_found","message":"Transaction not found"}}`},
		{Name: "unknown status", Body: zt(`status="approved"`)},
		{Name: "missing status", Body: zt(`status=-`)},
		{Name: "missing id", Body: zt(`id=-`)},
		{Name: "id that could steer a path", Body: zt(`id="../sellers";uri=-`)},
		{Name: "not a transaction", Body: zt(`resource="seller"`)},
		{Name: "uri of another marketplace", Body: zt(`uri="/v1/marketplaces/ffff/transactions/` + ztID + `"`)},
		{Name: "uri of another transaction", Body: zt(`uri="/v1/marketplaces/` + marketplace + `/transactions/ffff"`)},
		{Name: "history entry of another transaction", Body: zt(`history=[{"id":"x","transaction":"ffff","amount":"1.00","operation_type":"void","status":"succeeded"}]`)},
		{Name: "amount as a JSON number", Body: zt(`amount=10000`)},
		{Name: "amount not a number", Body: zt(`amount="abc"`)},
		{Name: "missing amount", Body: zt(`amount=-`)},
		{Name: "negative amount", Body: zt(`amount="-100.00"`)},
		{Name: "zero amount", Body: zt(`amount="0.00"`)},
		{Name: "over-precise amount", Body: zt(`amount="100.001"`)},
		{Name: "400-digit amount", Body: zt(`amount="` + strings.Repeat("9", 400) + `"`)},
		{Name: "amount above 2^53-1 minor units", Body: zt(`amount="90071992547409.92"`)},
		{Name: "unknown currency", Body: zt(`currency="XXX"`)},
		{Name: "missing created_at", Body: zt(`created_at=-`)},
		{Name: "bad created_at", Body: zt(`created_at="12/06/2024"`)},
		{Name: "year 10000", Body: zt(`updated_at="10000-01-01T00:00:00+00:00"`)},
		{Name: "bad history time", Body: zt(withVoids(hist("v1", "void", "succeeded", "1.00", "yesterday")))},
		{Name: "duplicate void id", Body: zt(withVoids(hist("v1", "void", "succeeded", "1.00", "2024-06-14 10:00:00"), hist("v1", "void", "succeeded", "1.00", "2024-06-14 10:00:00")))},
		{Name: "void without id", Body: zt(withVoids(hist("", "void", "succeeded", "1.00", "2024-06-14 10:00:00")))},
		{Name: "void of zero", Body: zt(withVoids(hist("v1", "void", "succeeded", "0.00", "2024-06-14 10:00:00")))},
		{Name: "void amount as a number", Body: zt(`history=[{"id":"v1","amount":1,"operation_type":"void","status":"succeeded"}]`)},
		{Name: "voids over the capture", Body: zt(withVoids(hist("v1", "void", "succeeded", "100.00", "2024-06-14 10:00:00"), hist("v2", "void", "succeeded", "0.01", "2024-06-14 10:00:00")))},
		{Name: "capture of zero", Body: zt(`history=[` + hist("h3", "capture", "succeeded", "0.00", "2024-06-12 19:45:03") + `]`)},
		{Name: "duplicate key", Body: strings.Replace(zt(``), `{`, `{"status":"refunded",`, 1)},
		{Name: "duplicate key in history", Body: zt(`history=[{"id":"v1","amount":"1.00","amount":"2.00","operation_type":"void","status":"succeeded"}]`)},
		{Name: "trailing data", Body: zt(``) + `{}`},
		{Name: "array", Body: `[` + zt(``) + `]`},
		{Name: "empty", Body: ``},
	}
}

// refetchSuite describes the driver to the refetch conformance suite.
func refetchSuite(t testing.TB) providertest.RefetchSuite {
	path := "/v1/marketplaces/" + marketplace + "/transactions/" + txID
	const key = "zpk_prod_fLDQqil50te59vqiqsSJ7AZ9"
	return providertest.RefetchSuite{
		Driver:        refetchDriver(t),
		AlwaysRefetch: true,
		Cases:         refetchCases(t),
		IDOf:          providertest.StringMember("id"),
		OtherIDs:      func(id string) []string { return []string{"b1b2c3d4e5f60718293a4b5c6d7e8f90", strings.ToUpper(id)} },
		Request: providertest.RefetchRequestCase{
			Token: key, ID: txID,
			// Basic auth, the key as the user and an empty password,
			// computed here without net/http.
			Auth: "Basic " + base64.StdEncoding.EncodeToString([]byte(key+":")),
			URLs: map[string]string{
				"":                             "https://api.zoop.ws" + path,
				"http://127.0.0.1:8080":        "http://127.0.0.1:8080" + path,
				"http://127.0.0.1:8080/":       "http://127.0.0.1:8080" + path,
				"https://proxy.internal/zoop/": "https://proxy.internal/zoop" + path,
			},
			BadIDs:    []string{"1/../../sellers", "1%2F..%2Fsellers", strings.Repeat("a", 65)},
			BadTokens: []string{"zpk_key:password"},
		},
	}
}

// TestRefetchConformance runs the refetch conformance suite.
func TestRefetchConformance(t *testing.T) {
	t.Parallel()
	refetchSuite(t).Run(t)
}

// FuzzParseRefetch runs the suite's fuzz properties (RefetchSuite.Fuzz),
// seeded with variants of a real answer.
func FuzzParseRefetch(f *testing.F) {
	refetchSuite(f).Fuzz(f, providertest.Variants(providertest.Answer(f, "partially_refunded.json"), [][2]string{
		{`"amount": "10.00"`, `"amount": "1e1"`},
		{`"amount": "10.00"`, `"amount": "259.90"`},
		{`"status": "failed"`, `"status": "succeeded"`},
		{`c0ffee00000000000000000000000005`, `c0ffee00000000000000000000000004`},
		{`"currency": "BRL"`, `"currency": "JPY"`},
		{`"status": "succeeded",`, `"status": "charged_back",`},
		{`"status": "succeeded",`, `"status": "canceled",`},
		{`"status": "succeeded",`, `"status": "refunded",`},
		{`"captured": true`, `"captured": false`},
		{`"2024-06-14 14:00:00"`, `"1969-12-31 23:59:59"`},
		{`"Pedido #10293"`, `"Pedido \u0000"`},
	})...)
}
