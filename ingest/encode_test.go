package ingest

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

var encodeCases = []envelopeFields{
	{
		source: "acme", driver: "standardwebhooks", paymentKey: "acme:pay_1",
		event: &provider.Event{EventID: "msg_1", DedupKey: "msg_1", PaymentID: "pay_1", Type: "payment.paid",
			Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 1050, Currency: "BRL", OccurredAt: time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)}},
		receivedAt: time.Date(2026, 11, 29, 18, 0, 1, 123456789, time.UTC),
		header: http.Header{"Content-Type": {"application/json"}, "Webhook-Id": {"msg_1"}, "Webhook-Timestamp": {"1795975200"},
			"Webhook-Signature": {"v1,secret-looking"}, "User-Agent": {"Svix-Webhooks/1.0"}},
		body: []byte(`{"type":"payment.paid","data":{"payment_id":"pay_1","amount":1050,"currency":"BRL"}}`),
	},
	{
		// Everything optional set, characters encoding/json escapes, a
		// non-UTC occurred_at, a refund id, refetch.
		source: "st", driver: "stripe", paymentKey: "st:acct:<pi_&>",
		event: &provider.Event{EventID: "evt_\"quoted\"", DedupKey: "acct:evt_ü\u2028", PaymentID: "<pi_&>", Type: "refund.created",
			Fact:         payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: -5, Currency: "USD", RefundID: "re_\\1", OccurredAt: time.Date(2024, 6, 12, 16, 45, 3, 500, time.FixedZone("BRT", -3*3600))},
			NeedsRefetch: true},
		receivedAt: time.Date(2024, 6, 12, 19, 45, 3, 0, time.UTC),
		header:     http.Header{"X-Request-Id": {"req\n1"}, "Idempotency-Key": {"idem\x00\xff"}},
		body:       []byte{0, 1, 2, 0xff, '"', '<'},
	},
	{
		// The DLQ: no event, a reason, no kept header, an empty body.
		source: "sw", driver: "standardwebhooks", paymentKey: "sw:unknown",
		receivedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		header:     http.Header{},
		body:       []byte{},
		reason:     "unprocessable payload: unknown type",
	},
}

// TestAppendEnvelopeMatchesMarshal: the hand-written encoder gives the
// bytes envelope.Raw.Marshal gives.
func TestAppendEnvelopeMatchesMarshal(t *testing.T) {
	t.Parallel()
	for i, f := range encodeCases {
		checkEncoding(t, i, f)
	}
}

func checkEncoding(t *testing.T, name any, f envelopeFields) {
	t.Helper()
	raw := f.raw()
	want, wantErr := raw.Marshal()
	got, gotErr := appendEnvelope([]byte("prefix"), &f)
	if (wantErr != nil) != (gotErr != nil) {
		t.Fatalf("%v: appendEnvelope error %v, Marshal error %v", name, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	if !bytes.HasPrefix(got, []byte("prefix")) {
		t.Fatalf("%v: appendEnvelope dropped what was in the buffer", name)
	}
	if got = got[len("prefix"):]; !bytes.Equal(got, want) {
		t.Fatalf("%v: appendEnvelope\n got %s\nwant %s", name, got, want)
	}
}

// TestAppendEnvelopeKnowsEveryField fails when a field is added to the
// envelope, the event or the fact: appendEnvelope must learn it (and
// encodeCases must set it).
func TestAppendEnvelopeKnowsEveryField(t *testing.T) {
	t.Parallel()
	known := map[reflect.Type][]string{
		reflect.TypeFor[envelope.Raw]():   {"v", "source", "driver", "payment_key", "event", "received_at", "headers,omitempty", "body", "reason,omitempty"},
		reflect.TypeFor[provider.Event](): {"event_id,omitempty", "dedup_key", "payment_id", "type", "fact", "needs_refetch,omitempty"},
		reflect.TypeFor[payment.Fact]():   {"status", "amount_minor", "currency", "refund_id,omitempty", "occurred_at"},
	}
	for typ, want := range known {
		var got []string
		for f := range typ.Fields() {
			got = append(got, f.Tag.Get("json"))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s has JSON fields %q; appendEnvelope encodes %q: update it", typ, got, want)
		}
	}
	if !slices.IsSorted(keptHeaders) {
		t.Errorf("keptHeaders %v not sorted: JSON object keys from a map are", keptHeaders)
	}
	for _, k := range keptHeaders {
		if http.CanonicalHeaderKey(k) != k {
			t.Errorf("keptHeaders: %q is not canonical (headerValue looks it up as is)", k)
		}
	}
}

func FuzzAppendEnvelope(f *testing.F) {
	for _, c := range encodeCases {
		var ev provider.Event
		if c.event != nil {
			ev = *c.event
		}
		f.Add(c.source, ev.EventID, ev.DedupKey, ev.Type, c.reason, c.header.Get("X-Request-Id"), c.body,
			ev.Fact.AmountMinor, ev.Fact.OccurredAt.UnixNano(), int32(0), ev.NeedsRefetch)
	}
	f.Fuzz(func(t *testing.T, source, eventID, dedup, typ, reason, requestID string, body []byte, amount, occurredNanos int64, zone int32, refetch bool) {
		loc := time.UTC
		if zone != 0 {
			loc = time.FixedZone("Z", int(zone%(24*3600)))
		}
		fields := envelopeFields{
			source: source, driver: "d", paymentKey: source + ":" + eventID,
			event: &provider.Event{EventID: eventID, DedupKey: dedup, PaymentID: eventID, Type: typ, NeedsRefetch: refetch,
				Fact: payment.Fact{Status: payment.Status(typ), AmountMinor: amount, Currency: "BRL", RefundID: reason, OccurredAt: time.Unix(0, occurredNanos).In(loc)}},
			receivedAt: time.Unix(0, occurredNanos).UTC(),
			header:     http.Header{"X-Request-Id": {requestID}},
			body:       body,
			reason:     reason,
		}
		checkEncoding(t, "fuzz", fields)
	})
}

func TestReadBody(t *testing.T) {
	t.Parallel()
	const limit = 64
	body := strings.Repeat("x", 50)
	cases := []struct {
		name          string
		body          string
		contentLength int64
		wantErr       bool
	}{
		{"announced length", body, int64(len(body)), false},
		{"unknown length", body, -1, false},
		{"empty", "", 0, false},
		{"at the limit", strings.Repeat("y", limit), limit, false},
		{"over the limit, announced", strings.Repeat("z", limit+1), limit + 1, true},
		{"over the limit, unannounced", strings.Repeat("z", 5*limit), -1, true},
	}
	// net/http's limiter and fasthttp's (maxBytesReader) must agree.
	limiters := map[string]func(io.Reader) io.Reader{
		"net/http": func(r io.Reader) io.Reader {
			return http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(r), limit)
		},
		"fasthttp": func(r io.Reader) io.Reader { return newMaxBytesReader(iotest.OneByteReader(r), limit) },
	}
	for server, limited := range limiters {
		for _, c := range cases {
			for _, bufCap := range []int{0, 8, 4096} {
				buf := &bodyBuf{b: make([]byte, 0, bufCap), s: &Server{cfg: Config{MaxBufferedBodyBytes: 1 << 30}}}
				got, err := readBody(limited(strings.NewReader(c.body)), c.contentLength, limit, buf)
				// Charged for the buffer beyond the first 8 KiB, no more, and
				// at least for what it holds and the byte that saw EOF.
				const free = 8 << 10
				if buf.n > max(int64(cap(buf.b))-free, 0) || err == nil && buf.n < int64(len(got))+1-free {
					t.Errorf("%s, %s (cap %d): charged %d bytes for a buffer of %d holding %d", server, c.name, bufCap, buf.n, cap(buf.b), len(got))
				}
				var tooLarge *http.MaxBytesError
				switch {
				case c.wantErr && (!errors.As(err, &tooLarge) || tooLarge.Limit != limit):
					t.Errorf("%s, %s (cap %d): error %v, want a MaxBytesError of limit %d", server, c.name, bufCap, err, limit)
				case !c.wantErr && (err != nil || string(got) != c.body):
					t.Errorf("%s, %s (cap %d): got %q, %v", server, c.name, bufCap, got, err)
				}
			}
		}
	}
}

// TestFastHeader: fasthttp's request headers reach the drivers keyed as
// net/http keys them, repeated names in order, Host and Transfer-Encoding
// left out.
func TestFastHeader(t *testing.T) {
	t.Parallel()
	var req fasthttp.Request
	raw := "POST /webhooks/sw HTTP/1.1\r\nHost: ingest\r\nwebhook-id: msg_1\r\nWEBHOOK-SIGNATURE: v1,a\r\n" +
		"Webhook-Signature: v1,b\r\nX-Request-Id: r1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	got := fastHeader(&req.Header)
	want := http.Header{
		"Webhook-Id":        {"msg_1"},
		"Webhook-Signature": {"v1,a", "v1,b"},
		"X-Request-Id":      {"r1"},
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{"Host", "Transfer-Encoding"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s is a header: %q", k, got[k])
		}
	}
}
