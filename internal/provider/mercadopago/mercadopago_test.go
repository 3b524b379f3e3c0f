package mercadopago

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

const (
	oldSecret   = "mp-webhook-secret-old-5d2c"
	newSecret   = "mp-webhook-secret-new-8e1f"
	wrongSecret = "mp-webhook-secret-bad-0000"
	requestID   = "bb56a2f1-6aae-46ac-982e-9dcd3581d08e"
)

var fixtures = []providertest.Fixture{
	{
		Name:  "payment.created",
		Body:  []byte(`{"action":"payment.created","api_version":"v1","data":{"id":"123456789"},"date_created":"2024-06-12T16:45:03.000-03:00","id":112233445566,"live_mode":true,"type":"payment","user_id":"987654321"}`),
		Query: url.Values{QueryDataID: {"123456789"}, "type": {"payment"}},
		Want: &provider.Event{EventID: "112233445566", DedupKey: "112233445566", PaymentID: "123456789", Type: "payment.created", NeedsRefetch: true,
			Fact: payment.Fact{Status: payment.StatusPending, OccurredAt: time.Date(2024, 6, 12, 19, 45, 3, 0, time.UTC)}},
	},
	{
		Name:  "payment.updated: status decided by the refetch",
		Body:  []byte(`{"action":"payment.updated","api_version":"v1","data":{"id":"123456789"},"date_created":"2024-06-12T16:50:00.000-03:00","id":112233445577,"live_mode":true,"type":"payment","user_id":"987654321"}`),
		Query: url.Values{QueryDataID: {"123456789"}, "type": {"payment"}},
		Want: &provider.Event{EventID: "112233445577", DedupKey: "112233445577", PaymentID: "123456789", Type: "payment.updated", NeedsRefetch: true,
			Fact: payment.Fact{OccurredAt: time.Date(2024, 6, 12, 19, 50, 0, 0, time.UTC)}},
	},
	{
		Name:  "body data.id as a number, no query",
		Body:  []byte(`{"action":"payment.updated","data":{"id":123456789},"date_created":"2024-06-12T16:50:00Z","id":5,"type":"payment"}`),
		Query: url.Values{QueryDataID: {""}},
		Want: &provider.Event{EventID: "5", DedupKey: "5", PaymentID: "123456789", Type: "payment.updated", NeedsRefetch: true,
			Fact: payment.Fact{OccurredAt: time.Date(2024, 6, 12, 16, 50, 0, 0, time.UTC)}},
	},
	{Name: "merchant_order topic", Body: []byte(`{"action":"merchant_order.updated","data":{"id":"3607377642"},"id":7,"type":"merchant_order"}`), Irrelevant: true},
	{Name: "unknown action", Body: []byte(`{"action":"payment.exploded","data":{"id":"1"},"id":8,"type":"payment"}`)},
	{Name: "missing data.id", Body: []byte(`{"action":"payment.created","data":{},"id":9,"type":"payment"}`), Query: url.Values{QueryDataID: {""}}},
	{Name: "id not a number", Body: []byte(`{"action":"payment.created","data":{"id":"1"},"id":"abc","type":"payment"}`)},
}

func harness() providertest.Harness {
	return providertest.Harness{
		New:         New,
		OldSecret:   oldSecret,
		NewSecret:   newSecret,
		WrongSecret: wrongSecret,
		Sign: func(t testing.TB, secret string, body []byte, ts time.Time) *provider.Request {
			r := &provider.Request{Header: http.Header{}, Query: url.Values{QueryDataID: {"123456789"}, "type": {"payment"}}, Body: body, Now: ts}
			r.Header.Set(HeaderSignature, Sign(secret, "123456789", requestID, ts))
			r.Header.Set(HeaderRequestID, requestID)
			return r
		},
		Tolerance:       DefaultTolerance,
		RequiredHeaders: []string{HeaderSignature},
		BodyUnsigned:    true,
		RefetchAll:      true,
		Tampers: map[string]func(*provider.Request){
			"query data.id":        func(r *provider.Request) { r.Query.Set(QueryDataID, "123456780") },
			"query data.id absent": func(r *provider.Request) { r.Query.Del(QueryDataID) },
			"request id":           func(r *provider.Request) { r.Header.Set(HeaderRequestID, "bb56a2f1-6aae-46ac-982e-9dcd3581d08f") },
			"request id absent":    func(r *provider.Request) { r.Header.Del(HeaderRequestID) },
			"ts": func(r *provider.Request) {
				r.Header.Set(HeaderSignature, "ts="+strconv.FormatInt(r.Now.Unix()+1, 10)+r.Header.Get(HeaderSignature)[len("ts=")+10:])
			},
		},
		Fixtures: fixtures,
	}
}

func TestConformance(t *testing.T) { providertest.Conformance(t, harness()) }

// TestKnownAnswer builds the manifest and HMAC with the standard library
// alone, following Mercado Pago's documentation, including the trailing
// semicolon and the lower-casing of alphanumeric ids.
func TestKnownAnswer(t *testing.T) {
	t.Parallel()
	m := hmac.New(sha256.New, []byte(oldSecret))
	m.Write([]byte("id:abc123;request-id:" + requestID + ";ts:1704908010;"))
	want := "ts=1704908010,v1=" + hex.EncodeToString(m.Sum(nil))
	if got := Sign(oldSecret, "ABC123", requestID, time.Unix(1704908010, 0)); got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
	d := harness().Driver(t, oldSecret)
	r := &provider.Request{
		Header: http.Header{},
		Query:  url.Values{QueryDataID: {"ABC123"}},
		Now:    time.Unix(1704908010, 0),
	}
	r.Header.Set(HeaderSignature, want)
	r.Header.Set(HeaderRequestID, requestID)
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	// The same signature with ts in milliseconds is a different manifest;
	// a millisecond ts signed as such verifies.
	m = hmac.New(sha256.New, []byte(oldSecret))
	m.Write([]byte("id:abc123;request-id:" + requestID + ";ts:1704908010123;"))
	r.Header.Set(HeaderSignature, "ts=1704908010123,v1="+hex.EncodeToString(m.Sum(nil)))
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify millisecond ts: %v", err)
	}
}

func TestManifest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ id, req, ts, want string }{
		{"123", "r", "1", "id:123;request-id:r;ts:1;"},
		{"ABC", "r", "1", "id:abc;request-id:r;ts:1;"},
		{"A-B", "r", "1", "id:A-B;request-id:r;ts:1;"},
		{"", "r", "1", "request-id:r;ts:1;"},
		{"123", "", "1", "id:123;ts:1;"},
	} {
		if got := Manifest(tc.id, tc.req, tc.ts); got != tc.want {
			t.Errorf("Manifest(%q, %q, %q) = %q, want %q", tc.id, tc.req, tc.ts, got, tc.want)
		}
	}
}

func FuzzVerify(f *testing.F) { harness().FuzzVerify(f, nil) }

func FuzzParse(f *testing.F) { harness().FuzzParse(f) }
