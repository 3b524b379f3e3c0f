package standardwebhooks

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

// The Standard Webhooks specification's documented example.
const (
	specSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTS     = 1614265330
	specBody   = `{"test": 2432232314}`
	specSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func TestSignKnownAnswer(t *testing.T) {
	t.Parallel()
	got, err := Sign(specSecret, specID, time.Unix(specTS, 0), []byte(specBody))
	if err != nil {
		t.Fatal(err)
	}
	if got != specSig {
		t.Fatalf("Sign = %q, want the spec's %q", got, specSig)
	}

	// And the same computed here with the standard library alone.
	key, _ := base64.StdEncoding.DecodeString("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	m := hmac.New(sha256.New, key)
	m.Write([]byte(specID + "." + strconv.Itoa(specTS) + "." + specBody))
	if want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil)); got != want {
		t.Fatalf("Sign = %q, stdlib computes %q", got, want)
	}

	d := harness().Driver(t, specSecret)
	r := &provider.Request{
		Header: http.Header{},
		Body:   []byte(specBody),
		Now:    time.Unix(specTS+10, 0),
	}
	r.Header.Set(HeaderID, specID)
	r.Header.Set(HeaderTimestamp, strconv.Itoa(specTS))
	r.Header.Set(HeaderSignature, "v1,bm90IHRoaXMgb25l "+specSig)
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify spec example: %v", err)
	}
}

func TestEd25519(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(provider.Config{Secrets: []string{PrefixPublicKey + base64.StdEncoding.EncodeToString(pub)}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1718210703, 0)
	body := []byte(`{"type":"payment.paid","data":{"payment_id":"p1"}}`)
	// Signature computed with crypto/ed25519 directly, not through Sign.
	sig := ed25519.Sign(priv, []byte("msg_1."+strconv.FormatInt(now.Unix(), 10)+"."+string(body)))
	r := &provider.Request{Header: http.Header{}, Body: body, Now: now}
	r.Header.Set(HeaderID, "msg_1")
	r.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	r.Header.Set(HeaderSignature, "v1a,"+base64.StdEncoding.EncodeToString(sig))
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify v1a: %v", err)
	}
	viaSign, err := Sign(PrefixPrivateKey+base64.StdEncoding.EncodeToString(priv.Seed()), "msg_1", now, body)
	if err != nil {
		t.Fatal(err)
	}
	if viaSign != "v1a,"+base64.StdEncoding.EncodeToString(sig) {
		t.Fatalf("Sign with whsk_ seed = %q, want the stdlib signature", viaSign)
	}
	r.Body = []byte(`{"type":"payment.paid","data":{"payment_id":"p2"}}`)
	var ve *provider.VerifyError
	if err := d.Verify(r); !errors.As(err, &ve) || ve.Reason != provider.ReasonBadSignature {
		t.Fatalf("Verify tampered v1a = %v, want bad_signature", err)
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  provider.Config
	}{
		{"no secrets", provider.Config{}},
		{"raw secret", provider.Config{Secrets: []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}},
		{"bad base64", provider.Config{Secrets: []string{"whsec_!!!"}}},
		{"empty whsec", provider.Config{Secrets: []string{"whsec_"}}},
		{"short public key", provider.Config{Secrets: []string{"whpk_AAAA"}}},
		{"private key", provider.Config{Secrets: []string{"whsk_" + base64.StdEncoding.EncodeToString(make([]byte, 32))}}},
		{"negative tolerance", provider.Config{Secrets: []string{specSecret}, Tolerance: -time.Second}},
	} {
		if _, err := New(tc.cfg); err == nil {
			t.Errorf("%s: New accepted %+v", tc.name, tc.cfg)
		}
	}
}

// parseCases is both the table of TestParse and FuzzParse's seed corpus.
var parseCases = []struct {
	name string
	body string
	want *provider.Event // nil: unprocessable
}{
	{
		name: "paid",
		body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"pay_1","amount":10050,"currency":"BRL"}}`,
		want: &provider.Event{PaymentID: "pay_1", Type: "payment.paid", Fact: payment.Fact{
			Status: payment.StatusPaid, AmountMinor: 10050, Currency: "BRL", OccurredAt: time.Date(2024, 6, 12, 16, 45, 3, 0, time.UTC),
		}},
	},
	{
		name: "created lower-case currency, offset timestamp",
		body: `{"type":"payment.created","timestamp":"2024-06-12T13:45:03-03:00","data":{"payment_id":"pay_1","amount":500,"currency":"jpy"}}`,
		want: &provider.Event{PaymentID: "pay_1", Type: "payment.created", Fact: payment.Fact{
			Status: payment.StatusPending, AmountMinor: 500, Currency: "JPY", OccurredAt: time.Date(2024, 6, 12, 16, 45, 3, 0, time.UTC),
		}},
	},
	{
		name: "partial refund with refund amount",
		body: `{"type":"payment.partially_refunded","timestamp":"2024-06-13T10:00:00Z","data":{"payment_id":"pay_1","amount":10050,"currency":"BRL","refund_id":"re_1","refund_amount":2000}}`,
		want: &provider.Event{PaymentID: "pay_1", Type: "payment.partially_refunded", Fact: payment.Fact{
			Status: payment.StatusPartiallyRefunded, AmountMinor: 2000, Currency: "BRL", RefundID: "re_1", OccurredAt: time.Date(2024, 6, 13, 10, 0, 0, 0, time.UTC),
		}},
	},
	{
		name: "full refund without refund amount uses amount",
		body: `{"type":"payment.refunded","timestamp":"2024-06-13T10:00:00Z","data":{"payment_id":"pay_1","amount":10050,"currency":"BRL","refund_id":"re_2"}}`,
		want: &provider.Event{PaymentID: "pay_1", Type: "payment.refunded", Fact: payment.Fact{
			Status: payment.StatusRefunded, AmountMinor: 10050, Currency: "BRL", RefundID: "re_2", OccurredAt: time.Date(2024, 6, 13, 10, 0, 0, 0, time.UTC),
		}},
	},
	{
		name: "dispute lost without amount",
		body: `{"type":"payment.dispute_lost","timestamp":"2024-07-01T00:00:00Z","data":{"payment_id":"pay_1"}}`,
		want: &provider.Event{PaymentID: "pay_1", Type: "payment.dispute_lost", Fact: payment.Fact{
			Status: payment.StatusDisputeLost, OccurredAt: time.Date(2024, 7, 1, 0, 0, 0, 0, time.UTC),
		}},
	},
	{name: "unknown type", body: `{"type":"payment.exploded","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"pay_1"}}`},
	{name: "missing type", body: `{"timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"pay_1"}}`},
	{name: "missing payment id", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"amount":1,"currency":"BRL"}}`},
	{name: "float amount", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p","amount":100.5,"currency":"BRL"}}`},
	{name: "negative amount", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p","amount":-100,"currency":"BRL"}}`},
	{name: "400-digit amount", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p","amount":` + string(make400()) + `,"currency":"BRL"}}`},
	{name: "overflow amount", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p","amount":9223372036854775808,"currency":"BRL"}}`},
	{name: "unknown currency", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p","amount":1,"currency":"XXX"}}`},
	{name: "amount without currency", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p","amount":1}}`},
	{name: "bad timestamp", body: `{"type":"payment.paid","timestamp":"yesterday","data":{"payment_id":"p"}}`},
	{name: "duplicate key", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p","amount":1,"amount":100000,"currency":"BRL"}}`},
	{name: "NUL in payment id", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p\u0000x"}}`},
	{name: "invalid UTF-8", body: "{\"type\":\"payment.paid\",\"timestamp\":\"2024-06-12T16:45:03Z\",\"data\":{\"payment_id\":\"p\xff\"}}"},
	{name: "truncated", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p"`},
	{name: "trailing data", body: `{"type":"payment.paid","timestamp":"2024-06-12T16:45:03Z","data":{"payment_id":"p"}} {}`},
	{name: "array", body: `[{"type":"payment.paid"}]`},
	{name: "empty", body: ``},
	{name: "form body", body: `type=payment.paid&payment_id=p`},
}

func make400() []byte {
	b := make([]byte, 400)
	for i := range b {
		b[i] = '9'
	}
	return b
}

func TestParse(t *testing.T) {
	t.Parallel()
	d, err := New(provider.Config{Secrets: []string{specSecret}, Account: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &provider.Request{Header: http.Header{}, Body: []byte(tc.body)}
			r.Header.Set(HeaderID, "msg_1")
			r.Header.Set(HeaderTimestamp, "1718210703")
			got, err := d.Parse(r)
			if tc.want == nil {
				if !errors.Is(err, provider.ErrUnprocessable) {
					t.Fatalf("Parse = %+v, %v; want ErrUnprocessable", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := *tc.want
			want.EventID, want.DedupKey = "msg_1", "acme:msg_1"
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Parse =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, tc := range parseCases {
		f.Add("webhook-id: msg_1\nwebhook-timestamp: 1718210703\n", []byte(tc.body))
	}
	providertest.AddSeeds(f, harness(), true)
	d := harness().Driver(f, specSecret)
	providertest.FuzzParse(f, d)
}
