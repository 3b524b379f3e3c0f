package pagarme

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/hex"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

const (
	oldKey   = "sk_test_4f8e1b2c3d4a5b6c7d8e9f00"
	newKey   = "sk_test_9a8b7c6d5e4f3a2b1c0d9e8f"
	wrongKey = "sk_test_0000000000000000000000"
)

var at = providertest.At

var fixtures = []providertest.Fixture{
	{
		Name: "charge.paid",
		Body: []byte(`{"id":"hook_RyEKQO789TRpZjv5","account":{"id":"acc_jhDwbQrF0pHeyMgV","name":"Loja Exemplo"},"type":"charge.paid","created_at":"2024-06-12T19:45:00.000Z","data":{"id":"ch_d5Rz4Vq1jtJPkMx8","code":"OP-2024-0001","gateway_id":"2078960","amount":25990,"paid_amount":25990,"status":"paid","currency":"BRL","payment_method":"credit_card","paid_at":"2024-06-12T19:44:59Z","created_at":"2024-06-12T19:44:50Z","updated_at":"2024-06-12T19:45:00Z","customer":{"id":"cus_XyZ","name":"Maria Silva"},"order":{"id":"or_6Gj9A2lcPxUj0Wm4","code":"OP-2024-0001","status":"paid"},"last_transaction":{"id":"tran_Q5AOVKYsxfPEXpo1","transaction_type":"credit_card","amount":25990,"status":"captured","success":true}}}`),
		Want: &provider.Event{EventID: "hook_RyEKQO789TRpZjv5", DedupKey: "hook_RyEKQO789TRpZjv5", PaymentID: "ch_d5Rz4Vq1jtJPkMx8", Type: "charge.paid",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 25990, Currency: "BRL", OccurredAt: at("2024-06-12T19:45:00Z")}},
	},
	{
		Name: "order.paid (same fact as charge.paid)",
		Body: []byte(`{"id":"hook_Pq1Wn8Xc2Lk5Zb7M","account":{"id":"acc_jhDwbQrF0pHeyMgV"},"type":"order.paid","created_at":"2024-06-12T19:45:01.000Z","data":{"id":"or_6Gj9A2lcPxUj0Wm4","code":"OP-2024-0001","amount":25990,"currency":"BRL","closed":true,"status":"paid","charges":[{"id":"ch_d5Rz4Vq1jtJPkMx8","amount":25990,"paid_amount":25990,"status":"paid","currency":"BRL","payment_method":"credit_card"}]}}`),
		Want: &provider.Event{EventID: "hook_Pq1Wn8Xc2Lk5Zb7M", DedupKey: "hook_Pq1Wn8Xc2Lk5Zb7M", PaymentID: "ch_d5Rz4Vq1jtJPkMx8", Type: "order.paid",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 25990, Currency: "BRL", OccurredAt: at("2024-06-12T19:45:01Z")}},
	},
	{
		Name: "charge.payment_failed",
		Body: []byte(`{"id":"hook_F4il","type":"charge.payment_failed","created_at":"2024-06-12T19:45:00Z","data":{"id":"ch_fail","amount":1000,"status":"failed","currency":"BRL","last_transaction":{"id":"tran_f","amount":1000,"status":"not_authorized","success":false}}}`),
		Want: &provider.Event{EventID: "hook_F4il", DedupKey: "hook_F4il", PaymentID: "ch_fail", Type: "charge.payment_failed",
			Fact: payment.Fact{Status: payment.StatusFailed, AmountMinor: 1000, Currency: "BRL", OccurredAt: at("2024-06-12T19:45:00Z")}},
	},
	{
		Name: "charge.partial_canceled",
		Body: []byte(`{"id":"hook_P4rt","type":"charge.partial_canceled","created_at":"2024-06-13T10:00:00Z","data":{"id":"ch_d5Rz4Vq1jtJPkMx8","amount":25990,"paid_amount":25990,"canceled_amount":5000,"status":"paid","currency":"BRL","last_transaction":{"id":"tran_R3fund1","transaction_type":"credit_card","amount":5000,"status":"partial_void","success":true}}}`),
		Want: &provider.Event{EventID: "hook_P4rt", DedupKey: "hook_P4rt", PaymentID: "ch_d5Rz4Vq1jtJPkMx8", Type: "charge.partial_canceled",
			Fact: payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 5000, Currency: "BRL", RefundID: "tran_R3fund1", OccurredAt: at("2024-06-13T10:00:00Z")}},
	},
	{
		Name: "charge.refunded",
		Body: []byte(`{"id":"hook_R3f","type":"charge.refunded","created_at":"2024-06-14T10:00:00Z","data":{"id":"ch_d5Rz4Vq1jtJPkMx8","amount":25990,"canceled_amount":25990,"status":"refunded","currency":"BRL","last_transaction":{"id":"tran_R3fund2","amount":20990,"status":"voided","success":true}}}`),
		Want: &provider.Event{EventID: "hook_R3f", DedupKey: "hook_R3f", PaymentID: "ch_d5Rz4Vq1jtJPkMx8", Type: "charge.refunded",
			Fact: payment.Fact{Status: payment.StatusRefunded, AmountMinor: 20990, Currency: "BRL", RefundID: "tran_R3fund2", OccurredAt: at("2024-06-14T10:00:00Z")}},
	},
	{
		Name: "charge.chargedback",
		Body: []byte(`{"id":"hook_Cb","type":"charge.chargedback","created_at":"2024-07-01T12:00:00Z","data":{"id":"ch_d5Rz4Vq1jtJPkMx8","amount":25990,"status":"chargedback","currency":"BRL"}}`),
		Want: &provider.Event{EventID: "hook_Cb", DedupKey: "hook_Cb", PaymentID: "ch_d5Rz4Vq1jtJPkMx8", Type: "charge.chargedback",
			Fact: payment.Fact{Status: payment.StatusDisputed, AmountMinor: 25990, Currency: "BRL", OccurredAt: at("2024-07-01T12:00:00Z")}},
	},
	{Name: "charge.updated carries no fact", Body: []byte(`{"id":"hook_U","type":"charge.updated","created_at":"2024-06-12T19:45:00Z","data":{"id":"ch_1","amount":1,"currency":"BRL"}}`), Irrelevant: true},
	{Name: "unknown type", Body: []byte(`{"id":"hook_X","type":"recipient.created","created_at":"2024-06-12T19:45:00Z","data":{"id":"rp_1"}}`)},
	{Name: "order with two charges", Body: []byte(`{"id":"hook_2","type":"order.paid","created_at":"2024-06-12T19:45:00Z","data":{"id":"or_1","charges":[{"id":"ch_1","amount":1},{"id":"ch_2","amount":2}]}}`)},
	{Name: "amount in reais", Body: []byte(`{"id":"hook_F","type":"charge.paid","created_at":"2024-06-12T19:45:00Z","data":{"id":"ch_1","amount":259.90,"currency":"BRL"}}`)},
}

func harness() providertest.Harness {
	h := providertest.HeaderHarness(New, HeaderSignature, Sign)
	h.OldSecret, h.NewSecret, h.WrongSecret = oldKey, newKey, wrongKey
	h.Tampers = map[string]func(*provider.Request){
		"sha256 scheme": func(r *provider.Request) {
			r.Header.Set(HeaderSignature, "sha256="+r.Header.Get(HeaderSignature)[5:])
		},
	}
	h.Documented = func(key string, body []byte, _ time.Time) string {
		return "sha1=" + hex.EncodeToString(documented(key, body))
	}
	h.Fixtures = fixtures
	return h
}

func TestConformance(t *testing.T) { providertest.Conformance(t, harness()) }

// documented is Pagar.me's signature of body, HMAC-SHA1 with key, computed
// with the standard library alone: the suite checks Sign against it
// (Harness.Documented) and FuzzVerify's oracle, signedBy, is made of it.
func documented(key string, body []byte) []byte {
	m := hmac.New(sha1.New, []byte(key))
	m.Write(body)
	return m.Sum(nil)
}

// signedBy is FuzzVerify's oracle: HMAC-SHA1 with the standard library.
func signedBy(r *provider.Request, key string) bool {
	sig, _ := hex.DecodeString(r.Header.Get(HeaderSignature)[len("sha1="):])
	return hmac.Equal(sig, documented(key, r.Body))
}

func FuzzVerify(f *testing.F) { harness().FuzzVerify(f, signedBy) }

func FuzzParse(f *testing.F) { harness().FuzzParse(f) }
