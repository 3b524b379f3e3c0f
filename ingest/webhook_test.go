package ingest_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/asaas"
	"github.com/paystream/paystream/internal/provider/mercadopago"
	"github.com/paystream/paystream/internal/provider/pagarme"
	"github.com/paystream/paystream/internal/provider/stripe"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/schemas"
)

const receivedOK = `{"received":true}`

// TestEveryDriverEndToEnd: for each driver, a webhook signed with the
// driver's Sign helper is answered exactly 200 {"received":true} and is on
// the raw topic, keyed by payment, as an envelope that validates against
// the raw-envelope schema and carries the body byte-exact, the normalized
// event, and no secret or signature.
func TestEveryDriverEndToEnd(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		cases := driverCases(t, time.Now())
		for _, c := range cases {
			resp, body := b.post(t, c.req)
			if resp.StatusCode != http.StatusOK || strings.TrimSpace(body) != receivedOK {
				t.Fatalf("%s: answer %d %q, want 200 %s", c.driver, resp.StatusCode, body, receivedOK)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s: Content-Type %q", c.driver, ct)
			}
		}
		recs := consume(t, b.brokers, b.raw, len(cases))
		if n := testenv.EndOffsetSum(t, b.brokers, b.raw); n != int64(len(cases)) {
			t.Fatalf("raw topic holds %d records, want %d", n, len(cases))
		}
		byKey := map[string][]byte{}
		for _, r := range recs {
			byKey[string(r.Key)] = r.Value
		}
		for _, c := range cases {
			t.Run(c.driver, func(t *testing.T) {
				value, ok := byKey[c.paymentKey]
				if !ok {
					t.Fatalf("no record keyed %q (keys: %v)", c.paymentKey, keys(byKey))
				}
				if err := schemas.Validate(schemas.RawEnvelope, value); err != nil {
					t.Fatalf("envelope does not validate against %s: %v\n%s", schemas.RawEnvelope, err, value)
				}
				env, err := envelope.DecodeRaw(value)
				if err != nil {
					t.Fatal(err)
				}
				if env.Source != c.req.source || env.Driver != c.driver || env.PaymentKey != c.paymentKey {
					t.Errorf("envelope source %q driver %q payment key %q", env.Source, env.Driver, env.PaymentKey)
				}
				if !bytes.Equal(env.Body, c.req.body) {
					t.Errorf("body not byte-exact:\n got %s\nwant %s", env.Body, c.req.body)
				}
				if c.dedupKey != "" && env.Event.DedupKey != c.dedupKey {
					t.Errorf("dedup key %q, want %q", env.Event.DedupKey, c.dedupKey)
				}
				if env.Event.DedupKey == "" || env.Event.PaymentID == "" || env.Event.Type == "" {
					t.Errorf("event incomplete: %+v", env.Event)
				}
				if env.Reason != "" {
					t.Errorf("reason %q on the raw topic", env.Reason)
				}
				if time.Since(env.ReceivedAt) > time.Minute || env.ReceivedAt.Location() != time.UTC {
					t.Errorf("received_at %v", env.ReceivedAt)
				}
				if env.Headers["Content-Type"] != "application/json" {
					t.Errorf("headers %v lack Content-Type", env.Headers)
				}
				// Signatures and tokens stay out of Kafka (Asaas sends its
				// secret itself).
				if bytes.Contains(value, []byte(c.secret)) {
					t.Errorf("record contains the source's secret")
				}
				for k, vs := range c.req.header {
					if strings.Contains(strings.ToLower(k), "signature") || strings.EqualFold(k, asaas.HeaderToken) || strings.EqualFold(k, "Authorization") {
						for _, v := range vs {
							if bytes.Contains(value, []byte(v)) {
								t.Errorf("record contains the %s header", k)
							}
						}
					}
				}
			})
		}
	})
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestDuplicateDeliveryIsAccepted: a redelivery is answered 200 and
// produced again; deduplication is the processor's job, in the same
// transaction as the effect.
func TestDuplicateDeliveryIsAccepted(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		now := time.Now()
		w := paidWebhook(t, "msg_dup_"+uniq(), "pay_dup", now)
		for i := range 3 {
			if resp, body := b.post(t, w); resp.StatusCode != http.StatusOK || strings.TrimSpace(body) != receivedOK {
				t.Fatalf("delivery %d: %d %q", i, resp.StatusCode, body)
			}
		}
		if n := testenv.EndOffsetSum(t, b.brokers, b.raw); n != 3 {
			t.Errorf("raw topic holds %d records, want 3", n)
		}
	})
}

// TestUnprocessableIsDeadLettered: authentic payloads that cannot be
// normalized are answered 200 (so the gateway stops retrying) and kept on
// the DLQ with the reason, byte-exact; nothing reaches the raw topic.
func TestUnprocessableIsDeadLettered(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		now := time.Now()
		ts := now.UTC().Format(time.RFC3339)
		cases := []struct {
			name, body, reason string
		}{
			{"unknown type", fmt.Sprintf(`{"type":"payment.teleported","timestamp":%q,"data":{"payment_id":"p1"}}`, ts), "unknown type"},
			{"missing payment id", fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"amount":1,"currency":"BRL"}}`, ts), "missing payment_id"},
			{"bad amount", fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"p3","amount":10.5,"currency":"BRL"}}`, ts), "amount"},
			{"not JSON", `this is not json`, "JSON"},
		}
		sent := map[string]string{} // webhook-id → reason
		for _, c := range cases {
			id := "msg_dlq_" + uniq()
			sent[id] = c.reason
			resp, body := b.post(t, signedStandard(t, "sw", swSecret, id, now, c.body))
			if resp.StatusCode != http.StatusOK || strings.TrimSpace(body) != receivedOK {
				t.Fatalf("%s: answer %d %q, want 200 %s", c.name, resp.StatusCode, body, receivedOK)
			}
		}
		recs := consume(t, b.brokers, b.dlq, len(cases))
		for _, r := range recs {
			if err := schemas.Validate(schemas.RawEnvelope, r.Value); err != nil {
				t.Errorf("DLQ record does not validate: %v\n%s", err, r.Value)
			}
			// DecodeRaw refuses a DLQ envelope (it has no dedup key): read it
			// as plain JSON.
			var env envelope.Raw
			if err := jsonUnmarshal(r.Value, &env); err != nil {
				t.Fatal(err)
			}
			raw := struct {
				Reason  string
				Headers map[string]string
			}{env.Reason, env.Headers}
			id := raw.Headers["Webhook-Id"]
			want, ok := sent[id]
			if !ok {
				t.Fatalf("DLQ record for unknown webhook id %q", id)
			}
			delete(sent, id)
			if string(r.Key) != "sw:unknown" {
				t.Errorf("%s: key %q, want sw:unknown", id, r.Key)
			}
			if !strings.Contains(raw.Reason, want) || !strings.Contains(raw.Reason, provider.ErrUnprocessable.Error()) {
				t.Errorf("%s: reason %q, want it to say %q", id, raw.Reason, want)
			}
			if env.Source != "sw" || len(env.Body) == 0 {
				t.Errorf("%s: envelope %+v", id, env)
			}
		}
		if len(sent) != 0 {
			t.Errorf("not dead-lettered: %v", sent)
		}
		if n := testenv.EndOffsetSum(t, b.brokers, b.raw); n != 0 {
			t.Errorf("raw topic holds %d records, want 0", n)
		}
		mfs := scrape(t, b.url)
		if v, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "dead_lettered"}); v != float64(len(cases)) {
			t.Errorf("dead_lettered requests = %v, want %d", v, len(cases))
		}
	})
}

// TestIrrelevantIsAcknowledgedNotKept: authentic events asserting no
// payment fact are answered exactly 200 and produced nowhere, and counted
// with outcome "irrelevant".
func TestIrrelevantIsAcknowledgedNotKept(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		now := time.Now()
		at := now.UTC().Format(time.RFC3339)
		asBody := `{"id":"evt_upd_` + uniq() + `","event":"PAYMENT_UPDATED","dateCreated":"2024-06-12 16:45:03","payment":{"object":"payment","id":"pay_x","value":10.00}}`
		mpBody := `{"action":"merchant_order.updated","data":{"id":"3607377642"},"id":7,"type":"merchant_order"}`
		pmBody := `{"id":"hook_upd_` + uniq() + `","type":"charge.updated","created_at":"` + at + `","data":{"id":"ch_1","amount":1,"currency":"BRL"}}`
		stBody := fmt.Sprintf(`{"id":"evt_rp_%s","object":"event","created":%d,"type":"refund.created","data":{"object":{"id":"re_2","object":"refund","amount":500,"currency":"usd","payment_intent":"pi_1","status":"pending"}}}`, uniq(), now.Unix())
		reqID := "req-" + uniq()
		irrelevant := []webhook{
			{source: "as", header: http.Header{"Asaas-Access-Token": {asaas.Sign(asToken)}}, body: []byte(asBody)},
			{source: "mp", query: url.Values{mercadopago.QueryDataID: {"3607377642"}, "type": {"merchant_order"}},
				header: http.Header{"X-Request-Id": {reqID}, "X-Signature": {mercadopago.Sign(mpSecret, "3607377642", reqID, now)}}, body: []byte(mpBody)},
			{source: "pm", header: http.Header{pagarme.HeaderSignature: {pagarme.Sign(pmSecret, []byte(pmBody))}}, body: []byte(pmBody)},
			{source: "st", header: http.Header{stripe.HeaderSignature: {stripe.Sign(stSecret, now, []byte(stBody))}}, body: []byte(stBody)},
		}
		for _, w := range irrelevant {
			resp, body := b.post(t, w)
			if resp.StatusCode != http.StatusOK || strings.TrimSpace(body) != receivedOK {
				t.Fatalf("%s: answer %d %q, want 200 %s", w.source, resp.StatusCode, body, receivedOK)
			}
		}
		// A processable webhook afterwards proves the producer works, so the
		// counts below are not an artifact of a broken setup.
		if resp, _ := b.post(t, paidWebhook(t, "msg_ok_"+uniq(), "pay_ok", now)); resp.StatusCode != http.StatusOK {
			t.Fatalf("valid webhook: %d", resp.StatusCode)
		}
		if n := testenv.EndOffsetSum(t, b.brokers, b.raw); n != 1 {
			t.Errorf("raw topic holds %d records, want only the valid one", n)
		}
		if n := testenv.EndOffsetSum(t, b.brokers, b.dlq); n != 0 {
			t.Errorf("DLQ holds %d records, want 0", n)
		}
		mfs := scrape(t, b.url)
		for _, w := range irrelevant {
			if v, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": w.source, "outcome": "irrelevant"}); v != 1 {
				t.Errorf("%s: irrelevant requests = %v, want 1", w.source, v)
			}
			if v, ok := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": w.source, "outcome": "dead_lettered"}); ok && v != 0 {
				t.Errorf("%s: dead_lettered = %v, want 0", w.source, v)
			}
		}
	})
}

// TestNotAuthenticIsRejectedBeforeParsing: anything not authentic is 401
// and produces nothing, whatever its body — a forged body that is not even
// JSON is 401, not dead-lettered; signature failures are counted by reason.
func TestNotAuthenticIsRejectedBeforeParsing(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		now := time.Now()
		body := paidBody("pay_forged", now)
		forgedSecret := "whsec_" + "Zm9yZ2VkLXNlY3JldC1mb3ItdGVzdHM="
		cases := []struct {
			name   string
			w      webhook
			reason string
		}{
			{"wrong secret", signedStandard(t, "sw", forgedSecret, "msg_f1", now, body), provider.ReasonBadSignature},
			{"wrong secret, garbage body", signedStandard(t, "sw", forgedSecret, "msg_f2", now, "\x00not json at all"), provider.ReasonBadSignature},
			{"tampered body", func() webhook {
				w := signedStandard(t, "sw", swSecret, "msg_f3", now, body)
				w.body = bytes.Replace(w.body, []byte("1050"), []byte("9050"), 1)
				return w
			}(), provider.ReasonBadSignature},
			{"stale timestamp", signedStandard(t, "sw", swSecret, "msg_f4", now.Add(-10*time.Minute), body), provider.ReasonTimestamp},
			{"missing signature", func() webhook {
				w := signedStandard(t, "sw", swSecret, "msg_f5", now, body)
				w.header.Del("webhook-signature")
				return w
			}(), provider.ReasonMissingHeader},
			{"asaas wrong token", webhook{source: "as", header: http.Header{"Asaas-Access-Token": {"guess"}}, body: []byte(`{}`)}, provider.ReasonBadSignature},
			{"zoop wrong credential", webhook{source: "zp", header: http.Header{"Authorization": {"Basic cGF5c3RyZWFtOmd1ZXNz"}}, body: []byte(`{}`)}, provider.ReasonBadSignature},
		}
		want := map[[2]string]float64{}
		for _, c := range cases {
			resp, got := b.post(t, c.w)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s: status %d %q, want 401", c.name, resp.StatusCode, got)
			}
			want[[2]string{c.w.source, c.reason}]++
		}
		if n := testenv.EndOffsetSum(t, b.brokers, b.raw) + testenv.EndOffsetSum(t, b.brokers, b.dlq); n != 0 {
			t.Errorf("%d records produced for unauthentic requests, want 0", n)
		}
		mfs := scrape(t, b.url)
		for k, n := range want {
			if v, _ := metricValue(mfs, "paystream_ingest_signature_failures_total", map[string]string{"source": k[0], "reason": k[1]}); v != n {
				t.Errorf("signature failures{source=%s,reason=%s} = %v, want %v", k[0], k[1], v, n)
			}
		}
		if v, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "unauthorized"}); v != 5 {
			t.Errorf("sw unauthorized requests = %v, want 5", v)
		}
	})
}

// TestBodyLimitIsPerSource: a body over its source's limit is 413 and
// produces nothing; the same body to a source with the default limit is
// accepted. Unknown sources are 404.
func TestBodyLimitIsPerSource(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		now := time.Now()
		body := paidBody("pay_big", now) // > 64 bytes
		resp, got := b.post(t, signedStandard(t, "tiny", swSecret, "msg_big", now, body))
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(got, `"limit_bytes":64`) {
			t.Errorf("tiny: %d %q, want 413 with the limit", resp.StatusCode, got)
		}
		if resp, _ := b.post(t, signedStandard(t, "nobody", swSecret, "msg_x", now, body)); resp.StatusCode != http.StatusNotFound {
			t.Errorf("unknown source: %d, want 404", resp.StatusCode)
		}
		if n := testenv.EndOffsetSum(t, b.brokers, b.raw); n != 0 {
			t.Errorf("raw topic holds %d records, want 0", n)
		}
		if resp, _ := b.post(t, signedStandard(t, "sw", swSecret, "msg_big", now, body)); resp.StatusCode != http.StatusOK {
			t.Errorf("same body to sw: %d, want 200", resp.StatusCode)
		}
		mfs := scrape(t, b.url)
		if v, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "tiny", "outcome": "too_large"}); v != 1 {
			t.Errorf("too_large = %v, want 1", v)
		}
		if v, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "unknown", "outcome": "unknown_source"}); v != 1 {
			t.Errorf("unknown_source = %v, want 1", v)
		}
	})
}

// TestUnavailableBrokerIs503: when the broker cannot acknowledge within
// ProduceTimeout the answer is 503 with Retry-After (whole seconds,
// rounded up), /readyz is 503, and the in-flight gauge counts the waiting
// request while it waits.
func TestUnavailableBrokerIs503(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		const produceTimeout = 1500 * time.Millisecond
		srv, err := ingest.New(ingest.Config{
			HTTPServer: server,
			Sources:    loadSources(t), Brokers: []string{deadBroker(t)},
			ProduceTimeout: produceTimeout, RetryAfter: 2500 * time.Millisecond, Logger: testLogger(t),
			ServeMetrics: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		hs := newServer(t, srv)

		now := time.Now()
		w := paidWebhook(t, "msg_503", "pay_503", now)
		type answer struct {
			resp    *http.Response
			body    string
			elapsed time.Duration
		}
		done := make(chan answer, 1)
		go func() {
			start := time.Now()
			resp, body := postTo(t, hs, w)
			done <- answer{resp, body, time.Since(start)}
		}()
		testenv.Eventually(t, produceTimeout, func() bool {
			v, _ := metricValue(scrape(t, hs), "paystream_ingest_in_flight_requests", nil)
			return v == 1
		}, "in-flight gauge at 1 while the request waits for the broker")
		a := <-done
		if a.resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("status %d %q, want 503", a.resp.StatusCode, a.body)
		}
		if got := a.resp.Header.Get("Retry-After"); got != "3" {
			t.Errorf("Retry-After %q, want 3 (2.5s rounded up)", got)
		}
		if a.elapsed < produceTimeout || a.elapsed > produceTimeout+3*time.Second {
			t.Errorf("answered after %v, want about the produce timeout %v", a.elapsed, produceTimeout)
		}
		mfs := scrape(t, hs)
		if v, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "unavailable"}); v != 1 {
			t.Errorf("unavailable = %v, want 1", v)
		}
		if v, _ := metricValue(mfs, "paystream_ingest_in_flight_requests", nil); v != 0 {
			t.Errorf("in-flight after the answer = %v, want 0", v)
		}
		checkGet(t, hs+"/readyz", http.StatusServiceUnavailable, "/readyz without a broker")
		checkGet(t, hs+"/healthz", http.StatusOK, "/healthz without a broker (the process is up)")
	})
}

// TestMissingTopicIs503: a reachable broker that cannot take the record
// (its topic does not exist; ingest never creates topics) is 503 too, while
// /readyz stays 200.
func TestMissingTopicIs503(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, func(c *ingest.Config) {
			c.Topic = "paystream-ingest-test-missing-" + uniq()
			c.ProduceTimeout = 500 * time.Millisecond
		})
		now := time.Now()
		resp, body := b.post(t, paidWebhook(t, "msg_nt", "pay_nt", now))
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "5" {
			t.Errorf("answer %d %q Retry-After %q, want 503 with the default Retry-After 5", resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
		checkGet(t, b.url+"/readyz", http.StatusOK, "/readyz with a reachable broker")
	})
}

// TestConcurrentWebhooksAllAcknowledged: many concurrent webhooks are all
// answered 200 and every one is on the topic (2xx only after the ack).
func TestConcurrentWebhooksAllAcknowledged(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		now := time.Now()
		const n = 200
		var wg sync.WaitGroup
		codes := make([]int, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, _ := b.post(t, paidWebhook(t, "msg_c"+strconv.Itoa(i)+"_"+uniq(), "pay_c"+strconv.Itoa(i%20), now))
				codes[i] = resp.StatusCode
			}()
		}
		wg.Wait()
		for i, c := range codes {
			if c != http.StatusOK {
				t.Fatalf("request %d: %d", i, c)
			}
		}
		// Every 200 was acknowledged: the records are there already, no wait.
		if got := testenv.EndOffsetSum(t, b.brokers, b.raw); got != n {
			t.Errorf("raw topic holds %d records right after %d 200s", got, n)
		}
	})
}
