package pagbank

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

const (
	oldToken   = "5F2A3D4E-0B1C-4D2E-9F8A-7B6C5D4E3F2A"
	newToken   = "9C8B7A6F-5E4D-4C3B-8A2F-1E0D9C8B7A6F"
	wrongToken = "00000000-0000-0000-0000-000000000000"
)

var at = providertest.At

func fx(name, body string, want *provider.Event) providertest.Fixture {
	return providertest.Fixture{Name: name, Body: []byte(body), Want: want}
}

var fixtures = []providertest.Fixture{
	fx("order paid by card",
		`{"id":"ORDE_2D6A5C4B-3E1F-4A0B-9C8D-7E6F5A4B3C2D","reference_id":"pedido-056984","created_at":"2024-06-12T16:44:50.123-03:00","customer":{"name":"Maria Silva","email":"maria@example.com","tax_id":"12345678909"},"items":[{"reference_id":"sku-1","name":"Camiseta","quantity":1,"unit_amount":25990}],"charges":[{"id":"CHAR_8F7E6D5C-4B3A-4291-8F7E-6D5C4B3A2918","reference_id":"pedido-056984","status":"PAID","created_at":"2024-06-12T16:44:51.456-03:00","paid_at":"2024-06-12T16:45:03.000-03:00","description":"Pedido 056984","amount":{"value":25990,"currency":"BRL","summary":{"total":25990,"paid":25990,"refunded":0}},"payment_response":{"code":"20000","message":"SUCESSO","reference":"1718221503"},"payment_method":{"type":"CREDIT_CARD","installments":1,"capture":true,"card":{"brand":"visa","first_digits":"411111","last_digits":"1111","exp_month":"12","exp_year":"2030","holder":{"name":"Maria Silva"}}}}],"notification_urls":["https://example.com/webhooks/pagbank"]}`,
		&provider.Event{PaymentID: "CHAR_8F7E6D5C-4B3A-4291-8F7E-6D5C4B3A2918", Type: "PAID",
			DedupKey: provider.BusinessKey("CHAR_8F7E6D5C-4B3A-4291-8F7E-6D5C4B3A2918", "PAID", payment.StatusPaid, at("2024-06-12T19:45:03Z"), "0"),
			Fact:     payment.Fact{Status: payment.StatusPaid, AmountMinor: 25990, Currency: "BRL", OccurredAt: at("2024-06-12T19:45:03Z")}}),
	// PagBank's own signing example: a charge, not an order.
	fx("charge waiting (PagBank's documented example)",
		`{"id":"CHAR_354828dd-786b-4cca-8ce4-6f7a1f3f2a1a","status":"WAITING","created_at":"2019-09-24T18:31:19.027-03:00","description":"This is the payment transaction description","amount":{"value":100,"currency":"BRL","summary":{"total":100,"paid":0,"refunded":0}},"payment_response":{"code":"20000","message":"SUCESSO"},"payment_method":{"type":"BOLETO","boleto":{"id":"eafadc9b-6e15-41ff-ab07-86218770d93b","due_date":"2020-05-08"}}}`,
		&provider.Event{PaymentID: "CHAR_354828dd-786b-4cca-8ce4-6f7a1f3f2a1a", Type: "WAITING",
			DedupKey: provider.BusinessKey("CHAR_354828dd-786b-4cca-8ce4-6f7a1f3f2a1a", "WAITING", payment.StatusPending, at("2019-09-24T21:31:19.027Z"), "0"),
			Fact:     payment.Fact{Status: payment.StatusPending, AmountMinor: 100, Currency: "BRL", OccurredAt: at("2019-09-24T21:31:19.027Z")}}),
	fx("declined",
		`{"id":"ORDE_1","created_at":"2024-06-12T16:44:50-03:00","charges":[{"id":"CHAR_D3C1","status":"DECLINED","created_at":"2024-06-12T16:44:51-03:00","amount":{"value":5000,"currency":"BRL","summary":{"total":5000,"paid":0,"refunded":0}},"payment_response":{"code":"20007","message":"NAO AUTORIZADO"}}]}`,
		&provider.Event{PaymentID: "CHAR_D3C1", Type: "DECLINED",
			DedupKey: provider.BusinessKey("CHAR_D3C1", "DECLINED", payment.StatusFailed, at("2024-06-12T19:44:51Z"), "0"),
			Fact:     payment.Fact{Status: payment.StatusFailed, AmountMinor: 5000, Currency: "BRL", OccurredAt: at("2024-06-12T19:44:51Z")}}),
	fx("paid then partially refunded",
		`{"id":"ORDE_1","charges":[{"id":"CHAR_P1","status":"PAID","created_at":"2024-06-12T16:44:51-03:00","paid_at":"2024-06-12T16:45:03-03:00","amount":{"value":25990,"currency":"BRL","summary":{"total":25990,"paid":25990,"refunded":5000}}}]}`,
		&provider.Event{PaymentID: "CHAR_P1", Type: "PAID", NeedsRefetch: true,
			DedupKey: provider.BusinessKey("CHAR_P1", "PAID", payment.StatusPartiallyRefunded, at("2024-06-12T19:45:03Z"), "5000"),
			Fact:     payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 5000, Currency: "BRL", OccurredAt: at("2024-06-12T19:45:03Z")}}),
	fx("canceled after payment is a full refund",
		`{"id":"ORDE_1","charges":[{"id":"CHAR_P1","status":"CANCELED","created_at":"2024-06-12T16:44:51-03:00","paid_at":"2024-06-12T16:45:03-03:00","amount":{"value":25990,"currency":"BRL","summary":{"total":25990,"paid":25990,"refunded":25990}}}]}`,
		&provider.Event{PaymentID: "CHAR_P1", Type: "CANCELED",
			DedupKey: provider.BusinessKey("CHAR_P1", "CANCELED", payment.StatusRefunded, at("2024-06-12T19:44:51Z"), "25990"),
			Fact:     payment.Fact{Status: payment.StatusRefunded, AmountMinor: 25990, Currency: "BRL", OccurredAt: at("2024-06-12T19:44:51Z")}}),
	{Name: "PIX order without charges yet", Body: []byte(`{"id":"ORDE_Q","created_at":"2024-06-12T16:44:50-03:00","qr_codes":[{"id":"QRCO_1","amount":{"value":1000},"text":"00020101..."}],"charges":[]}`), Irrelevant: true},
	fx("unknown status", `{"id":"ORDE_1","charges":[{"id":"CHAR_1","status":"EXPLODED","created_at":"2024-06-12T16:44:51-03:00","amount":{"value":1,"currency":"BRL"}}]}`, nil),
	fx("two charges", `{"id":"ORDE_1","charges":[{"id":"CHAR_1","status":"PAID"},{"id":"CHAR_2","status":"PAID"}]}`, nil),
	fx("float value", `{"id":"CHAR_1","status":"PAID","created_at":"2024-06-12T16:44:51-03:00","amount":{"value":259.90,"currency":"BRL"}}`, nil),
}

func harness() providertest.Harness {
	h := providertest.HeaderHarness(New, HeaderSignature, Sign)
	h.OldSecret, h.NewSecret, h.WrongSecret = oldToken, newToken, wrongToken
	h.Tampers = map[string]func(*provider.Request){
		"signature without delimiter": func(r *provider.Request) {
			sum := sha256.Sum256(append([]byte(oldToken), r.Body...))
			r.Header.Set(HeaderSignature, hex.EncodeToString(sum[:]))
		},
	}
	h.Documented = func(token string, body []byte, _ time.Time) string {
		return hex.EncodeToString(documented(token, body))
	}
	h.Fixtures = fixtures
	return h
}

func TestConformance(t *testing.T) { providertest.Conformance(t, harness()) }

// documented is PagBank's signature of body, SHA-256("{token}-{body}"),
// computed with the standard library alone, as PagBank documents it: the
// suite checks Sign against it (Harness.Documented) and FuzzVerify's
// oracle, signedBy, is made of it.
func documented(token string, body []byte) []byte {
	sum := sha256.Sum256([]byte(token + "-" + string(body)))
	return sum[:]
}

// signedBy is FuzzVerify's oracle: SHA-256("{token}-{body}") with the
// standard library.
func signedBy(r *provider.Request, token string) bool {
	sig, _ := hex.DecodeString(r.Header.Get(HeaderSignature))
	return string(sig) == string(documented(token, r.Body))
}

func FuzzVerify(f *testing.F) { harness().FuzzVerify(f, signedBy) }

func FuzzParse(f *testing.F) { harness().FuzzParse(f) }
