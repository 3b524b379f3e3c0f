package envelope_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
)

// keptHeaders are the request headers ingest copies into an envelope.
var keptHeaders = []string{"Content-Type", "Idempotency-Key", "User-Agent", "Webhook-Id", "Webhook-Timestamp", "X-Request-Id"}

// ingestEnvelopes returns the records ingest writes for every driver's
// payloads: each step of a payment's life (created, paid, refunds) built
// and signed by the load generator, parsed by the real driver, wrapped as
// ingest wraps it (Raw.Marshal, which ingest's encoder matches byte for
// byte), and the same request as a DLQ record (no event, a reason).
func ingestEnvelopes(tb testing.TB) [][]byte {
	tb.Helper()
	srcs, err := loadgen.ParseSources([]byte(loadgen.TestSourcesYAML))
	if err != nil {
		tb.Fatal(err)
	}
	covered := map[string]bool{}
	var out [][]byte
	now := time.Date(2026, 11, 29, 18, 0, 1, 123456789, time.UTC)
	for _, src := range srcs {
		covered[src.Driver] = true
		d, err := drivers.Factories()[src.Driver](provider.Config{Secrets: src.Secrets, Options: src.Options})
		if err != nil {
			tb.Fatal(err)
		}
		b, err := loadgen.NewBuilder(src, "d3c0", 42)
		if err != nil {
			tb.Fatal(err)
		}
		for step := range 4 {
			req, err := b.Build(loadgen.Event{Seq: uint64(step + 1), Payment: 7, Step: step, OccurredAt: now.Add(-time.Minute)}, now)
			if err != nil {
				tb.Fatal(err)
			}
			query, err := url.ParseQuery(req.RawQuery)
			if err != nil {
				tb.Fatal(err)
			}
			ev, err := d.Parse(&provider.Request{Header: req.Header, Query: query, Body: req.Body, Now: now})
			if err != nil {
				tb.Fatalf("%s step %d: Parse: %v", src.Name, step, err)
			}
			r := envelope.Raw{Source: src.Name, Driver: src.Driver, PaymentKey: provider.PaymentKey(src.Name, "", ev.PaymentID),
				Event: ev, ReceivedAt: now, Body: req.Body}
			for _, k := range keptHeaders {
				if v := req.Header.Get(k); v != "" {
					if r.Headers == nil {
						r.Headers = map[string]string{}
					}
					r.Headers[k] = v
				}
			}
			out = append(out, marshal(tb, r))
			r.Event, r.PaymentKey, r.Reason = provider.Event{}, src.Name+":unknown", "unprocessable payload: unknown type"
			out = append(out, marshal(tb, r))
		}
	}
	for _, d := range loadgen.Drivers {
		if !covered[d] {
			tb.Errorf("driver %s has no envelopes", d)
		}
	}
	return out
}

func marshal(tb testing.TB, r envelope.Raw) []byte {
	tb.Helper()
	b, err := r.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// sameAsJSON fails unless DecodeRaw gives for b what encoding/json alone
// gives (the same Raw, deeply, and an error when and only when it errs),
// and unless the fast path, when it takes b, decodes it exactly as
// json.Unmarshal does. It reports whether the fast path took b.
func sameAsJSON(t testing.TB, b []byte) (fast bool) {
	t.Helper()
	want, wantErr := envelope.DecodeRawJSON(b)
	got, gotErr := envelope.DecodeRaw(b)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("DecodeRaw(%q): error %v; encoding/json: error %v", b, gotErr, wantErr)
	}
	if gotErr != nil && !errors.Is(gotErr, envelope.ErrUndecodable) {
		t.Fatalf("DecodeRaw(%q): error %v does not wrap ErrUndecodable", b, gotErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("DecodeRaw(%q):\n got %#v\nwant %#v", b, got, want)
	}
	r, ok := envelope.DecodeRawFast(b)
	if !ok {
		return false
	}
	var j envelope.Raw
	if err := json.Unmarshal(b, &j); err != nil {
		t.Fatalf("fast path took %q, which encoding/json rejects: %v", b, err)
	}
	if !reflect.DeepEqual(r, j) {
		t.Fatalf("fast path decoded %q:\n got %#v\nwant %#v", b, r, j)
	}
	return true
}

// TestDecodeRawIngestEnvelopes: every envelope ingest writes, for every
// driver, takes the fast path and decodes as encoding/json decodes it.
func TestDecodeRawIngestEnvelopes(t *testing.T) {
	t.Parallel()
	for _, b := range ingestEnvelopes(t) {
		if !sameAsJSON(t, b) {
			t.Errorf("fast path gave up on an envelope ingest writes: %s", b)
		}
	}
}

// edgeRaws are envelopes Raw.Marshal writes that exercise every field:
// escapes, non-ASCII, headers present and absent, a reason, a refund id,
// refetch, non-UTC and zero times, extreme numbers.
func edgeRaws() []envelope.Raw {
	at := time.Date(2026, 11, 29, 18, 0, 1, 123456789, time.UTC)
	full := envelope.Raw{
		Source: "st", Driver: "stripe", PaymentKey: "st:acct:<pi_&>",
		Event: provider.Event{EventID: "evt_\"quoted\"", DedupKey: "acct:evt_ü\u2028😀", PaymentID: "<pi_&>", Type: "refund.created",
			Fact: payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: -5, Currency: "USD", RefundID: "re_\\1/2",
				OccurredAt: time.Date(2024, 6, 12, 16, 45, 3, 500, time.FixedZone("BRT", -3*3600))},
			NeedsRefetch: true},
		ReceivedAt: at,
		Headers:    map[string]string{"X-Request-Id": "req\n1\t\r\b\f", "Idempotency-Key": "idem\x00\x1f\xff", "Content-Type": "application/json; charset=\"utf-8\""},
		Body:       []byte{0, 1, 2, 0xff, '"', '<'},
		Reason:     "bad \u00e9vent \ufffd <script>&",
	}
	minimal := envelope.Raw{Source: "s", PaymentKey: "s:p", Event: provider.Event{DedupKey: "d"}}
	dlq := envelope.Raw{Source: "sw", Driver: "standardwebhooks", PaymentKey: "sw:unknown", ReceivedAt: at,
		Headers: map[string]string{}, Body: []byte{}, Reason: "unprocessable payload: unknown type"}
	big := full
	big.Event.Fact.AmountMinor = 999_999_999_999_999_999
	big.Body = []byte(strings.Repeat("body ", 300))
	big.Headers = nil
	small := full
	small.Event.Fact.AmountMinor = -999_999_999_999_999_999
	small.ReceivedAt = time.Date(1, 1, 1, 0, 0, 0, 1, time.FixedZone("", 5*3600+30*60))
	small.Event.Fact.OccurredAt = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("", -(23*3600+59*60)))
	long := full // more text than the decoder holds on the stack
	long.Reason = strings.Repeat("<é", 600)
	long.Headers = map[string]string{"User-Agent": strings.Repeat("u", 1024), "X-Request-Id": "r"}
	local := minimal
	local.ReceivedAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	return []envelope.Raw{full, minimal, dlq, big, small, long, local, {}, {V: 2, Source: "s", PaymentKey: "k", Event: provider.Event{DedupKey: "d"}}}
}

// edgeInputs are hand-written records around the canonical shape: each
// either stays on the fast path or must leave it for encoding/json
// (fast false), because encoding/json reads it in a way the scanner does
// not reproduce, or rejects it.
var edgeInputs = []struct {
	in   string
	fast bool
}{
	{canonical, true},
	// Any key order, JSON whitespace, escapes in every string.
	{` { "body" : "" , "event" : { "fact" : { "occurred_at" : "2024-06-12T16:45:03.5-03:00" , "status" : "paid" } , "dedup_key" : "d" } , "payment_key" : "k" , "source" : "s" , "v" : 1 } ` + "\n\t\r", true},
	{`{"v":1,"source":"\"\\\/\b\f\n\r\t","payment_key":"\u00e9\u20AC\ud83d\ude00","event":{"dedup_key":"\ud83d"}}`, true},
	{`{"v":1,"source":"\ude00\ud83d\u0041\ud83dx","payment_key":"k","event":{"dedup_key":"\uDBFF\uDFFF\uFFFD"}}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"ü😀` + "\u2028\xef\xbf\xbd" + `"}}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"headers":{"A":"1","A":"2","\u0042":"\"x\""}}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","needs_refetch":false},"headers":{}}`, true},
	{`{"v":-0,"source":"s","payment_key":"k","event":{"dedup_key":"d"}}`, true},
	{`{"v":2,"source":"s","payment_key":"k","event":{"dedup_key":"d"}}`, true},
	{`{"v":1,"source":"","payment_key":"k","event":{"dedup_key":"d"}}`, true},
	{`{}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","fact":{"occurred_at":"0001-01-01T00:00:00Z","amount_minor":0}},"received_at":"2026-01-01T00:00:00+00:00"}`, true},
	// Times: whatever time.Time.UnmarshalJSON makes of the quoted bytes.
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"received_at":"2026-13-01T00:00:00Z"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"received_at":"2026-01-01t00:00:00z"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"received_at":"\u0032026-01-01T00:00:00Z"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"received_at":"2026-01-01T00:00:00+24:00"}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"received_at":null}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"received_at":1}`, false},
	// Keys encoding/json matches other than exactly, or ignores.
	{`{"V":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"Source":"s","source":"t","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"\u0073ource":"s","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","DEDUP_KEY":"e"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","fact":{"Status":"paid"}}}`, false},
	{`{"v":1,"source":"s","ſource":"t","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"extra":[1,{"a":null}]}`, false},
	// Duplicates, which overwrite or merge.
	{`{"v":1,"source":"s","source":"t","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"event":{"type":"t"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"headers":{"a":"1"},"headers":{"b":"2"}}`, false},
	// Nulls, which leave a field as it was. Raw.Marshal writes a nil body as null.
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":null}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":null,"headers":null,"reason":null}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":null}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","fact":{"amount_minor":null}}}`, false},
	// Numbers in other forms, or out of range, and other types.
	{`{"v":1.0,"source":"s","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1e0,"source":"s","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":01,"source":"s","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":"1","source":"s","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":-,"source":"s","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","fact":{"amount_minor":9223372036854775807}}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","fact":{"amount_minor":9223372036854775808}}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","fact":{"amount_minor":-9223372036854775808}}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","needs_refetch":"true"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d","needs_refetch":truex}}`, false},
	{`{"v":1,"source":1,"payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":"d"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"headers":{"a":1}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"headers":{"1":"","2":"","3":"","4":"","5":"","6":"","7":"","8":""}}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"headers":{"1":"","2":"","3":"","4":"","5":"","6":"","7":"","8":"","9":""}}`, false},
	// Bodies: encoding/json unquotes, then base64-decodes, skipping \r and \n.
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":"QUJD"}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":"QUI="}`, true},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":"QUI"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":"QU=I"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":"QUJD\nREVG"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":"QU\/D"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":"QUJDé"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},"body":[65]}`, false},
	// Invalid UTF-8, which encoding/json turns into U+FFFD, and control characters.
	{`{"v":1,"source":"s` + "\xff" + `","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"source":"s` + "\xed\xa0\x80" + `","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	{`{"v":1,"source":"s` + "\n" + `","payment_key":"k","event":{"dedup_key":"d"}}`, false},
	// Broken syntax.
	{``, false},
	{`null`, false},
	{`[]`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"}} {}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"},}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d\x"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d\u12"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d\'"}}`, false},
	{`{"v":1,"source":"s","payment_key":"k","event":{"dedup_key":"d"}}` + "\f", false},
	{`{"v":1 "source":"s"}`, false},
	{`{"v":1,"source":"s",}`, false},
	{`{,"v":1}`, false},
}

// canonical is a record as ingest writes it.
const canonical = `{"v":1,"source":"acme","driver":"standardwebhooks","payment_key":"acme:pay_1","event":{"event_id":"msg_1","dedup_key":"msg_1","payment_id":"pay_1","type":"payment.paid","fact":{"status":"paid","amount_minor":1050,"currency":"BRL","refund_id":"re_1","occurred_at":"2026-11-29T18:00:00Z"},"needs_refetch":true},"received_at":"2026-11-29T18:00:01.123456789Z","headers":{"Content-Type":"application/json","Webhook-Id":"msg_1"},"body":"eyJ0eXBlIjoicGF5bWVudC5wYWlkIn0=","reason":"r"}`

// TestDecodeRawEdgeCases: envelopes with every field in its unusual
// forms take the fast path; records the fast path cannot be sure of go to
// encoding/json; either way DecodeRaw returns what encoding/json does.
func TestDecodeRawEdgeCases(t *testing.T) {
	t.Parallel()
	for i, r := range edgeRaws() {
		if b := marshal(t, r); !sameAsJSON(t, b) {
			t.Errorf("edge envelope %d: fast path gave up on what Raw.Marshal writes: %s", i, b)
		}
	}
	for _, c := range edgeInputs {
		if got := sameAsJSON(t, []byte(c.in)); got != c.fast {
			t.Errorf("fast path took %q: %v, want %v", c.in, got, c.fast)
		}
	}
}

// FuzzDecodeRaw: for any bytes, DecodeRaw returns what encoding/json
// alone returns, and the fast path never takes what encoding/json reads
// otherwise.
func FuzzDecodeRaw(f *testing.F) {
	for _, b := range ingestEnvelopes(f) {
		f.Add(b)
	}
	for _, r := range edgeRaws() {
		f.Add(marshal(f, r))
	}
	for _, c := range edgeInputs {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sameAsJSON(t, b)
	})
}

// BenchmarkDecodeRaw decodes a typical ingest record, about 1.5 KB,
// with the fast path and with encoding/json.
func BenchmarkDecodeRaw(b *testing.B) {
	r := envelope.Raw{
		Source: "acme-stripe", Driver: "stripe", PaymentKey: "acme-stripe:acct_1Nv0FGQ9RKHgCVdK:pi_3MtwBwLkdIwHu7ix28a3tqPa",
		Event: provider.Event{EventID: "evt_3MtwBwLkdIwHu7ix28a3tqPa", DedupKey: "evt_3MtwBwLkdIwHu7ix28a3tqPa", PaymentID: "pi_3MtwBwLkdIwHu7ix28a3tqPa",
			Type: "payment_intent.succeeded", Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 104999, Currency: "BRL",
				OccurredAt: time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)}},
		ReceivedAt: time.Date(2026, 11, 29, 18, 0, 1, 123456789, time.UTC),
		Headers:    map[string]string{"Content-Type": "application/json; charset=utf-8", "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)"},
	}
	body := `{"id":"evt_3MtwBwLkdIwHu7ix28a3tqPa","object":"event","api_version":"2024-06-20","created":1795975200,"type":"payment_intent.succeeded","data":{"object":{"id":"pi_3MtwBwLkdIwHu7ix28a3tqPa","object":"payment_intent","amount":104999,"amount_received":104999,"currency":"brl","status":"succeeded","latest_charge":"ch_3MtwBwLkdIwHu7ix2WpzeUuB","metadata":{"order_id":"6735"}}},"livemode":false,"pending_webhooks":1,"request":{"id":"req_8Vb9kL2mQ3xZpT","idempotency_key":"8e1f2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"}}`
	for len(r.Body) < 700 {
		r.Body = append(r.Body, body...)
	}
	r.Body = r.Body[:700]
	rec := marshal(b, r)
	if !sameAsJSON(b, rec) {
		b.Fatal("the benchmark record leaves the fast path")
	}
	for _, c := range []struct {
		name   string
		decode func([]byte) (envelope.Raw, error)
	}{{"fast", envelope.DecodeRaw}, {"json", envelope.DecodeRawJSON}} {
		b.Run(fmt.Sprintf("%s/%dB", c.name, len(rec)), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(rec)))
			for b.Loop() {
				if _, err := c.decode(rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
