package asaas

import (
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

const (
	oldToken   = "whk_asaas_old_7d1f0c2b9e8a4d6f"
	newToken   = "whk_asaas_new_3b5c7d9e1f2a4c6e"
	wrongToken = "whk_asaas_old_7d1f0c2b9e8a4d6e"
)

// 2024-06-12 16:45:03 in Brasília is 19:45:03 UTC.
var paidAt = time.Date(2024, 6, 12, 19, 45, 3, 0, time.UTC)

var fixtures = []providertest.Fixture{
	{
		Name: "PAYMENT_CONFIRMED",
		Body: []byte(`{"id":"evt_05b708f961d739ea7eba7e4db318f621&368604920","event":"PAYMENT_CONFIRMED","dateCreated":"2024-06-12 16:45:03","payment":{"object":"payment","id":"pay_080225913252","dateCreated":"2024-06-12","customer":"cus_G7Dvo4iphUNk","value":100.50,"netValue":97.51,"originalValue":null,"description":"Pedido 056984","billingType":"CREDIT_CARD","confirmedDate":"2024-06-12","status":"CONFIRMED","dueDate":"2024-06-12","externalReference":"056984","deleted":false}}`),
		Want: &provider.Event{EventID: "evt_05b708f961d739ea7eba7e4db318f621&368604920", DedupKey: "evt_05b708f961d739ea7eba7e4db318f621&368604920",
			PaymentID: "pay_080225913252", Type: "PAYMENT_CONFIRMED",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 10050, Currency: "BRL", OccurredAt: paidAt}},
	},
	{
		Name: "PAYMENT_RECEIVED (same fact as PAYMENT_CONFIRMED)",
		Body: []byte(`{"id":"evt_6a1e0b3f9c2d47e8a5b4c3d2e1f0a9b8&368604921","event":"PAYMENT_RECEIVED","dateCreated":"2024-07-12 09:00:00","payment":{"object":"payment","id":"pay_080225913252","value":100.5,"netValue":97.51,"billingType":"CREDIT_CARD","status":"RECEIVED","paymentDate":"2024-07-12","creditDate":"2024-07-12"}}`),
		Want: &provider.Event{EventID: "evt_6a1e0b3f9c2d47e8a5b4c3d2e1f0a9b8&368604921", DedupKey: "evt_6a1e0b3f9c2d47e8a5b4c3d2e1f0a9b8&368604921",
			PaymentID: "pay_080225913252", Type: "PAYMENT_RECEIVED",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 10050, Currency: "BRL", OccurredAt: time.Date(2024, 7, 12, 12, 0, 0, 0, time.UTC)}},
	},
	{
		Name: "PAYMENT_CREATED without event id: derived key",
		Body: []byte(`{"event":"PAYMENT_CREATED","dateCreated":"2024-06-12 16:45:03","payment":{"object":"payment","id":"pay_pix_01","value":59.9,"billingType":"PIX","status":"PENDING"}}`),
		Want: &provider.Event{DedupKey: provider.BusinessKey("pay_pix_01", "PAYMENT_CREATED", payment.StatusPending, paidAt),
			PaymentID: "pay_pix_01", Type: "PAYMENT_CREATED",
			Fact: payment.Fact{Status: payment.StatusPending, AmountMinor: 5990, Currency: "BRL", OccurredAt: paidAt}},
	},
	{
		Name: "PAYMENT_PARTIALLY_REFUNDED needs a refetch",
		Body: []byte(`{"id":"evt_pr1","event":"PAYMENT_PARTIALLY_REFUNDED","dateCreated":"2024-06-12 16:45:03","payment":{"object":"payment","id":"pay_080225913252","value":100.50,"status":"CONFIRMED","refunds":[{"dateCreated":"2024-06-12 16:45:03","status":"DONE","value":20.00}]}}`),
		Want: &provider.Event{EventID: "evt_pr1", DedupKey: "evt_pr1", PaymentID: "pay_080225913252", Type: "PAYMENT_PARTIALLY_REFUNDED", NeedsRefetch: true,
			Fact: payment.Fact{Status: payment.StatusPartiallyRefunded, Currency: "BRL", OccurredAt: paidAt}},
	},
	{
		Name: "PAYMENT_CHARGEBACK_REQUESTED",
		Body: []byte(`{"id":"evt_cb1","event":"PAYMENT_CHARGEBACK_REQUESTED","dateCreated":"2024-06-12 16:45:03","payment":{"object":"payment","id":"pay_080225913252","value":100.50,"status":"CHARGEBACK_REQUESTED","chargeback":{"status":"REQUESTED","reason":"PROCESS_ERROR"}}}`),
		Want: &provider.Event{EventID: "evt_cb1", DedupKey: "evt_cb1", PaymentID: "pay_080225913252", Type: "PAYMENT_CHARGEBACK_REQUESTED",
			Fact: payment.Fact{Status: payment.StatusDisputed, AmountMinor: 10050, Currency: "BRL", OccurredAt: paidAt}},
	},
	{Name: "PAYMENT_REFUND_IN_PROGRESS carries no fact", Body: []byte(`{"id":"evt_rip","event":"PAYMENT_REFUND_IN_PROGRESS","dateCreated":"2024-06-12 16:45:03","payment":{"id":"pay_1","value":1}}`), Irrelevant: true},
	{Name: "over-precise value", Body: []byte(`{"id":"evt_x","event":"PAYMENT_CONFIRMED","dateCreated":"2024-06-12 16:45:03","payment":{"id":"pay_1","value":100.505}}`)},
	{Name: "negative value", Body: []byte(`{"id":"evt_x","event":"PAYMENT_CONFIRMED","dateCreated":"2024-06-12 16:45:03","payment":{"id":"pay_1","value":-100.50}}`)},
	{Name: "unknown event", Body: []byte(`{"id":"evt_x","event":"TRANSFER_DONE","dateCreated":"2024-06-12 16:45:03","transfer":{"id":"tra_1"}}`)},
	{Name: "missing payment", Body: []byte(`{"id":"evt_x","event":"PAYMENT_CONFIRMED","dateCreated":"2024-06-12 16:45:03"}`)},
}

func harness() providertest.Harness {
	h := providertest.HeaderHarness(New, HeaderToken, func(token string, _ []byte) string { return Sign(token) })
	h.OldSecret, h.NewSecret, h.WrongSecret = oldToken, newToken, wrongToken
	// A static token does not sign the body: only the token can be
	// tampered with. Asaas recommends HTTPS and IP allow-listing.
	h.BodyUnsigned = true
	h.Tampers = map[string]func(*provider.Request){
		"token truncated": func(r *provider.Request) { r.Header.Set(HeaderToken, r.Header.Get(HeaderToken)[1:]) },
		"token extended":  func(r *provider.Request) { r.Header.Set(HeaderToken, r.Header.Get(HeaderToken)+"x") },
	}
	h.Fixtures = fixtures
	return h
}

func TestConformance(t *testing.T) { providertest.Conformance(t, harness()) }

func TestNewRejects(t *testing.T) {
	t.Parallel()
	for _, cfg := range []provider.Config{{}, {Secrets: []string{""}}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// signedBy is FuzzVerify's oracle: the header is the token itself.
func signedBy(r *provider.Request, token string) bool { return r.Header.Get(HeaderToken) == token }

func FuzzVerify(f *testing.F) { harness().FuzzVerify(f, signedBy) }

func FuzzParse(f *testing.F) { harness().FuzzParse(f) }
