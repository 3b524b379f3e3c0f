package stripe

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

const (
	oldSecret   = "whsec_test_old_8cf5b0e1d2a34f6e9b7c"
	newSecret   = "whsec_test_new_1a2b3c4d5e6f7a8b9c0d"
	wrongSecret = "whsec_test_wrong_000000000000000000"
)

func at(unix int64) time.Time { return time.Unix(unix, 0).UTC() }

// fixtures are Stripe events as Stripe sends them (trimmed of fields
// paystream does not read), and what they normalize to.
var fixtures = []providertest.Fixture{
	{
		Name: "payment_intent.succeeded",
		Body: []byte(`{"id":"evt_3PQm1vLkdIwHu7ix0Zc1Jd2K","object":"event","api_version":"2024-04-10","created":1718221500,"data":{"object":{"id":"pi_3PQm1vLkdIwHu7ix0bEzX4Ki","object":"payment_intent","amount":2000,"amount_capturable":0,"amount_received":2000,"currency":"usd","status":"succeeded","latest_charge":"ch_3PQm1vLkdIwHu7ix0Q9v7y8Z"}},"livemode":false,"pending_webhooks":1,"request":{"id":"req_Vb0gGzK5cQ1pTq","idempotency_key":"b5b6f1c2"},"type":"payment_intent.succeeded"}`),
		Want: &provider.Event{EventID: "evt_3PQm1vLkdIwHu7ix0Zc1Jd2K", DedupKey: "evt_3PQm1vLkdIwHu7ix0Zc1Jd2K", PaymentID: "pi_3PQm1vLkdIwHu7ix0bEzX4Ki", Type: "payment_intent.succeeded",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 2000, Currency: "USD", OccurredAt: at(1718221500)}},
	},
	{
		Name: "charge.succeeded (same fact as payment_intent.succeeded)",
		Body: []byte(`{"id":"evt_3PQm1vLkdIwHu7ix0gYy7Aa1","object":"event","created":1718221500,"data":{"object":{"id":"ch_3PQm1vLkdIwHu7ix0Q9v7y8Z","object":"charge","amount":2000,"amount_captured":2000,"amount_refunded":0,"captured":true,"currency":"usd","paid":true,"payment_intent":"pi_3PQm1vLkdIwHu7ix0bEzX4Ki","refunded":false,"status":"succeeded"}},"livemode":false,"type":"charge.succeeded"}`),
		Want: &provider.Event{EventID: "evt_3PQm1vLkdIwHu7ix0gYy7Aa1", DedupKey: "evt_3PQm1vLkdIwHu7ix0gYy7Aa1", PaymentID: "pi_3PQm1vLkdIwHu7ix0bEzX4Ki", Type: "charge.succeeded",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 2000, Currency: "USD", OccurredAt: at(1718221500)}},
	},
	{
		Name: "charge.succeeded uncaptured is an authorization",
		Body: []byte(`{"id":"evt_auth1","object":"event","created":1718221400,"data":{"object":{"id":"ch_auth1","object":"charge","amount":5000,"amount_captured":0,"captured":false,"currency":"brl","payment_intent":"pi_auth1","status":"succeeded"}},"type":"charge.succeeded"}`),
		Want: &provider.Event{EventID: "evt_auth1", DedupKey: "evt_auth1", PaymentID: "pi_auth1", Type: "charge.succeeded",
			Fact: payment.Fact{Status: payment.StatusAuthorized, AmountMinor: 5000, Currency: "BRL", OccurredAt: at(1718221400)}},
	},
	{
		Name: "payment_intent.payment_failed",
		Body: []byte(`{"id":"evt_fail1","object":"event","created":1718221300,"data":{"object":{"id":"pi_fail1","object":"payment_intent","amount":1099,"amount_received":0,"currency":"eur","status":"requires_payment_method","last_payment_error":{"code":"card_declined","decline_code":"insufficient_funds"}}},"type":"payment_intent.payment_failed"}`),
		Want: &provider.Event{EventID: "evt_fail1", DedupKey: "evt_fail1", PaymentID: "pi_fail1", Type: "payment_intent.payment_failed",
			Fact: payment.Fact{Status: payment.StatusFailed, AmountMinor: 1099, Currency: "EUR", OccurredAt: at(1718221300)}},
	},
	{
		Name: "charge.refunded in full",
		Body: []byte(`{"id":"evt_ref_full","object":"event","created":1718300000,"data":{"object":{"id":"ch_3PQm1vLkdIwHu7ix0Q9v7y8Z","object":"charge","amount":2000,"amount_captured":2000,"amount_refunded":2000,"captured":true,"currency":"usd","payment_intent":"pi_3PQm1vLkdIwHu7ix0bEzX4Ki","refunded":true}},"type":"charge.refunded"}`),
		Want: &provider.Event{EventID: "evt_ref_full", DedupKey: "evt_ref_full", PaymentID: "pi_3PQm1vLkdIwHu7ix0bEzX4Ki", Type: "charge.refunded",
			Fact: payment.Fact{Status: payment.StatusRefunded, AmountMinor: 2000, Currency: "USD", OccurredAt: at(1718300000)}},
	},
	{
		Name: "charge.refunded partially",
		Body: []byte(`{"id":"evt_ref_part","object":"event","created":1718300000,"data":{"object":{"id":"ch_1","object":"charge","amount":2000,"amount_captured":2000,"amount_refunded":500,"captured":true,"currency":"usd","payment_intent":"pi_1","refunded":false}},"type":"charge.refunded"}`),
		Want: &provider.Event{EventID: "evt_ref_part", DedupKey: "evt_ref_part", PaymentID: "pi_1", Type: "charge.refunded",
			Fact: payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 500, Currency: "USD", OccurredAt: at(1718300000)}},
	},
	{
		Name: "refund.created succeeded",
		Body: []byte(`{"id":"evt_re1","object":"event","created":1718300001,"data":{"object":{"id":"re_3PQm1vLkdIwHu7ix0T1a2b3c","object":"refund","amount":500,"charge":"ch_1","currency":"usd","payment_intent":"pi_1","reason":"requested_by_customer","status":"succeeded"}},"type":"refund.created"}`),
		Want: &provider.Event{EventID: "evt_re1", DedupKey: "evt_re1", PaymentID: "pi_1", Type: "refund.created",
			Fact: payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 500, Currency: "USD", RefundID: "re_3PQm1vLkdIwHu7ix0T1a2b3c", OccurredAt: at(1718300001)}},
	},
	{
		Name:       "refund.created pending is irrelevant until it succeeds",
		Body:       []byte(`{"id":"evt_re2","object":"event","created":1718300001,"data":{"object":{"id":"re_2","object":"refund","amount":500,"charge":"ch_1","currency":"usd","payment_intent":"pi_1","status":"pending"}},"type":"refund.created"}`),
		Irrelevant: true,
	},
	{
		Name: "charge.dispute.created",
		Body: []byte(`{"id":"evt_dp1","object":"event","created":1718400000,"data":{"object":{"id":"dp_1","object":"dispute","amount":2000,"charge":"ch_1","currency":"usd","payment_intent":"pi_1","reason":"fraudulent","status":"needs_response"}},"type":"charge.dispute.created"}`),
		Want: &provider.Event{EventID: "evt_dp1", DedupKey: "evt_dp1", PaymentID: "pi_1", Type: "charge.dispute.created",
			Fact: payment.Fact{Status: payment.StatusDisputed, AmountMinor: 2000, Currency: "USD", OccurredAt: at(1718400000)}},
	},
	{
		Name: "charge.dispute.closed won",
		Body: []byte(`{"id":"evt_dp2","object":"event","created":1719400000,"data":{"object":{"id":"dp_1","object":"dispute","amount":2000,"charge":"ch_1","currency":"usd","payment_intent":"pi_1","status":"won"}},"type":"charge.dispute.closed"}`),
		Want: &provider.Event{EventID: "evt_dp2", DedupKey: "evt_dp2", PaymentID: "pi_1", Type: "charge.dispute.closed",
			Fact: payment.Fact{Status: payment.StatusDisputeWon, AmountMinor: 2000, Currency: "USD", OccurredAt: at(1719400000)}},
	},
	{
		Name: "charge.dispute.closed lost",
		Body: []byte(`{"id":"evt_dp3","object":"event","created":1719400000,"data":{"object":{"id":"dp_1","object":"dispute","amount":2000,"charge":"ch_1","currency":"usd","payment_intent":"pi_1","status":"lost"}},"type":"charge.dispute.closed"}`),
		Want: &provider.Event{EventID: "evt_dp3", DedupKey: "evt_dp3", PaymentID: "pi_1", Type: "charge.dispute.closed",
			Fact: payment.Fact{Status: payment.StatusDisputeLost, AmountMinor: 2000, Currency: "USD", OccurredAt: at(1719400000)}},
	},
	{
		Name: "legacy charge without PaymentIntent",
		Body: []byte(`{"id":"evt_legacy","object":"event","created":1718221500,"data":{"object":{"id":"ch_legacy","object":"charge","amount":1500,"amount_captured":1500,"captured":true,"currency":"jpy","payment_intent":null,"status":"succeeded"}},"type":"charge.succeeded"}`),
		Want: &provider.Event{EventID: "evt_legacy", DedupKey: "evt_legacy", PaymentID: "ch_legacy", Type: "charge.succeeded",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 1500, Currency: "JPY", OccurredAt: at(1718221500)}},
	},
	{
		Name: "MGA is zero-decimal in Stripe, two-decimal in ISO",
		Body: []byte(`{"id":"evt_mga","object":"event","created":1718221500,"data":{"object":{"id":"pi_mga","object":"payment_intent","amount":10000,"amount_received":10000,"currency":"mga","status":"succeeded"}},"type":"payment_intent.succeeded"}`),
		Want: &provider.Event{EventID: "evt_mga", DedupKey: "evt_mga", PaymentID: "pi_mga", Type: "payment_intent.succeeded",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 1000000, Currency: "MGA", OccurredAt: at(1718221500)}},
	},
	{Name: "unknown type", Body: []byte(`{"id":"evt_x","object":"event","created":1718221500,"data":{"object":{"id":"cus_1","object":"customer"}},"type":"customer.created"}`)},
	{Name: "float amount", Body: []byte(`{"id":"evt_f","object":"event","created":1718221500,"data":{"object":{"id":"pi_1","object":"payment_intent","amount":20.5,"amount_received":20.5,"currency":"usd"}},"type":"payment_intent.succeeded"}`)},
	{Name: "negative amount", Body: []byte(`{"id":"evt_n","object":"event","created":1718221500,"data":{"object":{"id":"pi_1","object":"payment_intent","amount":-2000,"amount_received":-2000,"currency":"usd"}},"type":"payment_intent.succeeded"}`)},
	{Name: "missing event id", Body: []byte(`{"object":"event","created":1718221500,"data":{"object":{"id":"pi_1","object":"payment_intent","amount":2000,"currency":"usd"}},"type":"payment_intent.succeeded"}`)},
	{Name: "ISK amount not a multiple of 100", Body: []byte(`{"id":"evt_isk","object":"event","created":1718221500,"data":{"object":{"id":"pi_1","object":"payment_intent","amount":12345,"amount_received":12345,"currency":"isk"}},"type":"payment_intent.succeeded"}`)},
}

func harness() providertest.Harness {
	h := providertest.HeaderHarnessAt(New, HeaderSignature, func(secret string, body []byte, ts time.Time) string {
		return Sign(secret, ts, body)
	})
	h.OldSecret, h.NewSecret, h.WrongSecret = oldSecret, newSecret, wrongSecret
	h.Tolerance = DefaultTolerance
	h.Tampers = map[string]func(*provider.Request){
		"timestamp": func(r *provider.Request) {
			sig := r.Header.Get(HeaderSignature)
			r.Header.Set(HeaderSignature, strings.Replace(sig, "t="+strconv.FormatInt(r.Now.Unix(), 10), "t="+strconv.FormatInt(r.Now.Unix()-1, 10), 1))
		},
		"v1 replaced by v0": func(r *provider.Request) {
			r.Header.Set(HeaderSignature, strings.Replace(r.Header.Get(HeaderSignature), "v1=", "v0=", 1))
		},
	}
	h.Fixtures = fixtures
	return h
}

func TestConformance(t *testing.T) { providertest.Conformance(t, harness()) }

// TestKnownAnswer checks Sign and Verify against a signature computed here
// with the standard library alone, the way Stripe documents it.
func TestKnownAnswer(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_1","object":"event"}`)
	m := hmac.New(sha256.New, []byte(oldSecret))
	m.Write([]byte("1718221500." + string(body)))
	want := "t=1718221500,v1=" + hex.EncodeToString(m.Sum(nil))
	if got := Sign(oldSecret, time.Unix(1718221500, 0), body); got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
	d := harness().Driver(t, oldSecret)
	r := &provider.Request{Header: http.Header{}, Body: body, Now: time.Unix(1718221500, 0)}
	// Several v1 (Stripe sends one per active secret) and a v0 to ignore.
	r.Header.Set(HeaderSignature, "t=1718221500,v1=00ff,"+strings.TrimPrefix(want, "t=1718221500,")+",v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39")
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	for _, cfg := range []provider.Config{
		{},
		{Secrets: []string{""}},
		{Secrets: []string{"sk_live_123"}},
		{Secrets: []string{oldSecret}, Tolerance: -time.Second},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// signedBy is FuzzVerify's oracle, independent of the driver: some v1 in
// the header is the standard library's HMAC of "{t}.{body}".
func signedBy(r *provider.Request, secret string) bool {
	var ts string
	var v1 []string
	for _, p := range strings.Split(r.Header.Get(HeaderSignature), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			v1 = append(v1, strings.ToLower(v))
		}
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "." + string(r.Body)))
	return slices.Contains(v1, hex.EncodeToString(m.Sum(nil)))
}

func FuzzVerify(f *testing.F) { harness().FuzzVerify(f, signedBy) }

func FuzzParse(f *testing.F) { harness().FuzzParse(f) }
