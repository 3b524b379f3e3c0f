package mercadopago

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/provider/providertest"
)

func refetchDriver(t testing.TB) *Driver {
	t.Helper()
	return harness().Driver(t, oldSecret).(*Driver)
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
	return providertest.Object(base, []string{"id", "status", "status_detail", "currency_id", "transaction_amount", "transaction_amount_refunded", "date_created", "date_approved", "date_last_updated", "refunds"}, fields)
}

var (
	at        = providertest.At
	brl       = providertest.Fact
	brlRefund = providertest.Refund
)

const (
	created  = "2024-06-12T20:44:58Z"
	approved = "2024-06-12T20:45:03Z"
)

func refetchCases(t testing.TB) []providertest.RefetchCase {
	refunds2 := `[{"id":7001,"amount":30.5,"status":"approved","date_created":"2024-06-14T10:00:00.000-04:00"},{"id":7002,"amount":69.50,"status":"approved","date_created":"2024-06-15T10:00:00.000-04:00"}]`
	return []providertest.RefetchCase{
		// Full resources, shaped as GET /v1/payments/{id} answers.
		{Name: "approved card payment", Body: providertest.Answer(t, "approved.json"), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 25990, approved)}},
		{Name: "approved with partial refunds (one still in process)", Body: providertest.Answer(t, "approved_partially_refunded.json"), Final: payment.StatusPartiallyRefunded,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 25990, approved),
				brlRefund(payment.StatusPartiallyRefunded, "1009042015", 1000, "2024-06-14T14:00:00Z"),
				brlRefund(payment.StatusPartiallyRefunded, "1009042016", 5000, "2024-06-20T13:12:44Z"),
			}},
		{Name: "refunded in full by one refund", Body: providertest.Answer(t, "refunded.json"), Final: payment.StatusRefunded,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 25990, approved),
				brlRefund(payment.StatusRefunded, "1009042099", 25990, "2024-06-13T15:00:00Z"),
			}},
		{Name: "charged back, settled against the seller", Body: providertest.Answer(t, "charged_back_settled.json"), Final: payment.StatusDisputeLost,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 25990, approved),
				brl(payment.StatusDisputed, 25990, "2024-07-30T16:00:00Z"),
				brl(payment.StatusDisputeLost, 25990, "2024-07-30T16:00:00Z"),
			}},
		{Name: "pix waiting for transfer", Body: providertest.Answer(t, "pending_pix.json"), Final: payment.StatusPending,
			Want: []payment.Fact{brl(payment.StatusPending, 25990, created)}},

		// Every status.
		{Name: "in_process", Body: mp(`status="in_process";status_detail="pending_review_manual";date_approved=null`), Final: payment.StatusPending,
			Want: []payment.Fact{brl(payment.StatusPending, 10000, created)}},
		{Name: "authorized", Body: mp(`status="authorized";status_detail="pending_capture";date_approved=null;date_last_updated="2024-06-12T16:45:00.000-04:00"`), Final: payment.StatusAuthorized,
			Want: []payment.Fact{brl(payment.StatusAuthorized, 10000, "2024-06-12T20:45:00Z")}},
		{Name: "rejected", Body: mp(`status="rejected";status_detail="cc_rejected_insufficient_amount";date_approved=null`), Final: payment.StatusFailed,
			Want: []payment.Fact{brl(payment.StatusFailed, 10000, approved)}},
		{Name: "cancelled (expired boleto)", Body: mp(`status="cancelled";status_detail="expired";date_approved=null;date_last_updated="2024-06-15T23:59:59.000-04:00"`), Final: payment.StatusCanceled,
			Want: []payment.Fact{brl(payment.StatusCanceled, 10000, "2024-06-16T03:59:59Z")}},
		{Name: "approved without date_approved uses date_last_updated", Body: mp(`date_approved=null;date_last_updated="2024-06-12T17:00:00.000-04:00"`), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, "2024-06-12T21:00:00Z")}},
		{Name: "approved, refunds adding up to the amount", Body: mp(`status_detail="partially_refunded";transaction_amount_refunded=100.00;refunds=` + refunds2), Final: payment.StatusRefunded,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 10000, approved),
				brlRefund(payment.StatusPartiallyRefunded, "7001", 3050, "2024-06-14T14:00:00Z"),
				brlRefund(payment.StatusRefunded, "7002", 6950, "2024-06-15T14:00:00Z"),
			}},
		{Name: "refunded without refunds listed: refunded in full", Body: mp(`status="refunded";status_detail="by_admin";transaction_amount_refunded=100;date_last_updated="2024-06-13T10:00:00.000-04:00"`), Final: payment.StatusRefunded,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 10000, approved),
				{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: at("2024-06-13T14:00:00Z")},
			}},
		{Name: "refunded, refunds short of the amount: the rest in full", Body: mp(`status="refunded";transaction_amount_refunded=100;date_last_updated="2024-06-16T10:00:00.000-04:00";refunds=[{"id":7001,"amount":30.5,"status":"approved","date_created":"2024-06-14T10:00:00.000-04:00"}]`), Final: payment.StatusRefunded,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 10000, approved),
				brlRefund(payment.StatusPartiallyRefunded, "7001", 3050, "2024-06-14T14:00:00Z"),
				{Status: payment.StatusRefunded, Currency: "BRL", OccurredAt: at("2024-06-16T14:00:00Z")},
			}},
		{Name: "in_mediation", Body: mp(`status="in_mediation";status_detail="accredited";date_last_updated="2024-06-20T10:00:00.000-04:00"`), Final: payment.StatusDisputed,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z")}},
		{Name: "charged_back in process: dispute open", Body: mp(`status="charged_back";status_detail="in_process";date_last_updated="2024-06-20T10:00:00.000-04:00"`), Final: payment.StatusDisputed,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z")}},
		{Name: "charged_back reimbursed: dispute won", Body: mp(`status="charged_back";status_detail="reimbursed";date_last_updated="2024-06-20T10:00:00.000-04:00"`), Final: payment.StatusDisputeWon,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z"), brl(payment.StatusDisputeWon, 10000, "2024-06-20T14:00:00Z")}},
		{Name: "charged_back without detail: lost", Body: mp(`status="charged_back";status_detail=null;date_last_updated="2024-06-20T10:00:00.000-04:00"`), Final: payment.StatusDisputeLost,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z"), brl(payment.StatusDisputeLost, 10000, "2024-06-20T14:00:00Z")}},
		{Name: "charged_back with an unknown detail: dispute kept open", Body: mp(`status="charged_back";status_detail="something_new";date_last_updated="2024-06-20T10:00:00.000-04:00"`), Final: payment.StatusDisputed,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z")}},
		{Name: "charged_back after a partial refund: refund and dispute in time order", Body: mp(`status="charged_back";status_detail="settled";date_last_updated="2024-06-20T10:00:00.000-04:00";refunds=[{"id":7003,"amount":10,"status":"approved","date_created":"2024-06-25T10:00:00.000-04:00"},{"id":7001,"amount":30.5,"date_created":"2024-06-14T10:00:00.000-04:00"}]`), Final: payment.StatusDisputeLost,
			Want: []payment.Fact{
				brl(payment.StatusPaid, 10000, approved),
				brlRefund(payment.StatusPartiallyRefunded, "7001", 3050, "2024-06-14T14:00:00Z"),
				brl(payment.StatusDisputed, 10000, "2024-06-20T14:00:00Z"),
				brl(payment.StatusDisputeLost, 10000, "2024-06-20T14:00:00Z"),
				brlRefund(payment.StatusPartiallyRefunded, "7003", 1000, "2024-06-25T14:00:00Z"),
			}},
		{Name: "rejected and cancelled refunds are left out", Body: mp(`refunds=[{"id":7001,"amount":30.5,"status":"rejected","date_created":"2024-06-14T10:00:00.000-04:00"},{"id":7001,"amount":1,"status":"cancelled","date_created":"2024-06-14T10:00:00.000-04:00"}]`), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, approved)}},
		{Name: "refund id as a string, refund without date", Body: mp(`transaction_amount_refunded=1;refunds=[{"id":"7001","amount":1}]`), Final: payment.StatusPartiallyRefunded,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, approved), brlRefund(payment.StatusPartiallyRefunded, "7001", 100, approved)}},
		{Name: "id as a string, no transaction_amount_refunded", Body: mp(`id="5001";transaction_amount_refunded=-`), Final: payment.StatusPaid,
			Want: []payment.Fact{brl(payment.StatusPaid, 10000, approved)}},
		{Name: "CLP has no minor unit", Body: mp(`currency_id="CLP";transaction_amount=15990`), Final: payment.StatusPaid,
			Want: []payment.Fact{{Status: payment.StatusPaid, AmountMinor: 15990, Currency: "CLP", OccurredAt: at(approved)}}},
		{Name: "lower-case currency, exponent amount", Body: mp(`currency_id="ars";transaction_amount=1.5e3`), Final: payment.StatusPaid,
			Want: []payment.Fact{{Status: payment.StatusPaid, AmountMinor: 150000, Currency: "ARS", OccurredAt: at(approved)}}},

		// Unusable answers.
		{Name: "Mercado Pago 404 error body", Body: `{"message":"Payment not found","error":"not_found","status":404,"cause":[{"code":2000,"description":"Payment not found","data":null}]}`},
		{Name: "unknown status", Body: mp(`status="approved_pending"`)},
		{Name: "missing status", Body: mp(`status=-`)},
		{Name: "missing id", Body: mp(`id=-`)},
		{Name: "fractional id", Body: mp(`id=5001.5`)},
		{Name: "missing currency", Body: mp(`currency_id=-`)},
		{Name: "unknown currency", Body: mp(`currency_id="XXX"`)},
		{Name: "missing amount", Body: mp(`transaction_amount=-`)},
		{Name: "zero amount", Body: mp(`transaction_amount=0`)},
		{Name: "negative amount", Body: mp(`transaction_amount=-100`)},
		{Name: "minus zero amount", Body: mp(`transaction_amount=-0`)},
		{Name: "over-precise amount", Body: mp(`transaction_amount=100.001`)},
		{Name: "400-digit amount", Body: mp(`transaction_amount=` + strings.Repeat("9", 400))},
		{Name: "amount above 2^53-1 minor units", Body: mp(`transaction_amount=90071992547409.92`)},
		{Name: "NaN amount", Body: mp(`transaction_amount="NaN"`)},
		{Name: "missing date_created", Body: mp(`date_created=-`)},
		{Name: "bad date", Body: mp(`date_approved="12/06/2024"`)},
		{Name: "year 10000", Body: mp(`date_last_updated="10000-01-01T00:00:00Z"`)},
		{Name: "refunds on a pending payment", Body: mp(`status="pending";date_approved=null;refunds=[{"id":7001,"amount":1,"date_created":"2024-06-14T10:00:00.000-04:00"}]`)},
		{Name: "duplicate refund id", Body: mp(`transaction_amount_refunded=2;refunds=[{"id":7001,"amount":1},{"id":7001,"amount":1}]`)},
		{Name: "refund without id", Body: mp(`refunds=[{"amount":1}]`)},
		{Name: "refund without amount", Body: mp(`refunds=[{"id":7001}]`)},
		{Name: "zero refund", Body: mp(`refunds=[{"id":7001,"amount":0}]`)},
		{Name: "refunds over the amount", Body: mp(`transaction_amount_refunded=100.01;refunds=[{"id":7001,"amount":100},{"id":7002,"amount":0.01}]`)},
		{Name: "transaction_amount_refunded disagrees", Body: mp(`transaction_amount_refunded=50;refunds=[{"id":7001,"amount":30.5}]`)},
		{Name: "refunded but transaction_amount_refunded short", Body: mp(`status="refunded";transaction_amount_refunded=50`)},
		{Name: "duplicate key", Body: strings.Replace(mp(``), `{`, `{"status":"refunded",`, 1)},
		{Name: "duplicate key in a refund", Body: mp(`refunds=[{"id":7001,"amount":1,"amount":2}]`)},
		{Name: "trailing data", Body: mp(``) + `{}`},
		{Name: "array", Body: `[` + mp(``) + `]`},
		{Name: "empty", Body: ``},
	}
}

// refetchSuite describes the driver to the refetch conformance suite.
func refetchSuite(t testing.TB) providertest.RefetchSuite {
	return providertest.RefetchSuite{
		Driver:        refetchDriver(t),
		AlwaysRefetch: true,
		Cases:         refetchCases(t),
		IDOf:          func(body []byte) string { return numericID(providertest.Member(body, "id")) },
		OtherIDs: func(id string) []string {
			return []string{id + "1", "1" + id, strings.TrimSuffix(id, id[len(id)-1:]), "0"}
		},
		Request: providertest.RefetchRequestCase{
			Token: "APP_USR-123-abc", ID: "83791262741", Auth: "Bearer APP_USR-123-abc",
			URLs: map[string]string{
				"":                           "https://api.mercadopago.com/v1/payments/83791262741",
				"http://127.0.0.1:8080":      "http://127.0.0.1:8080/v1/payments/83791262741",
				"http://127.0.0.1:8080/":     "http://127.0.0.1:8080/v1/payments/83791262741",
				"https://proxy.internal/mp/": "https://proxy.internal/mp/v1/payments/83791262741",
			},
			BadIDs: []string{"1/../../users/me", "ORD01J", "123456789012345678901"},
		},
	}
}

// TestRefetchConformance runs the refetch conformance suite.
func TestRefetchConformance(t *testing.T) {
	t.Parallel()
	refetchSuite(t).Run(t)
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
		t.Fatalf("facts\n%s\nwant\n%s", providertest.DumpFacts(facts), providertest.DumpFacts(want))
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

// FuzzParseRefetch runs the suite's fuzz properties (RefetchSuite.Fuzz),
// seeded with variants of a real answer.
func FuzzParseRefetch(f *testing.F) {
	refetchSuite(f).Fuzz(f, providertest.Variants(providertest.Answer(f, "approved_partially_refunded.json"), [][2]string{
		{`"amount": 50`, `"amount": 5e1`},
		{`"amount": 50`, `"amount": 259.9`},
		{`"status": "in_process"`, `"status": "approved"`},
		{`"id": 1009042016`, `"id": 1009042015`},
		{`"transaction_amount": 259.90`, `"transaction_amount": 259.90e0`},
		{`"currency_id": "BRL"`, `"currency_id": "JPY"`},
		{`"status": "approved",`, `"status": "charged_back",`},
		{`"status": "approved",`, `"status": "in_mediation",`},
		{`"status": "approved",`, `"status": "refunded",`},
		{`"date_created": "2024-06-14T10:00:00.000-04:00"`, `"date_created": "1969-12-31T23:59:59Z"`},
		{`"Pedido #10293"`, `"Pedido \u0000"`},
	})...)
}
