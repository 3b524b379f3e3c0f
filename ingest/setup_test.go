package ingest_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/provider/asaas"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/provider/hmac"
	"github.com/paystream/paystream/internal/provider/mercadopago"
	"github.com/paystream/paystream/internal/provider/pagarme"
	"github.com/paystream/paystream/internal/provider/pagbank"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/provider/stripe"
	"github.com/paystream/paystream/internal/provider/zoop"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.Wrap(m),
		// net/http's keep-alive connections of http.DefaultTransport outlive tests.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// fasthttp's worker-pool cleaner sleeps MaxIdleWorkerDuration (10s)
		// between rounds and sees the server stopped only when it wakes.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		// fasthttp's Date header clock: one per process, started once.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}

// Secrets of the test sources, one source per driver.
const (
	swSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	stSecret = "whsec_stripe_test_4eC39HqLyjWDarjtT1zdp7dc"
	hmSecret = "hmac-secret-7f3a"
	pmSecret = "sk_test_pagarme_0123456789"
	asToken  = "asaas-token-5d2c-not-in-any-record"
	pbToken  = "5F2A3D4E-0B1C-4D2E-9F8A-7B6C5D4E3F2A"
	mpSecret = "mp-webhook-secret-8e1f"
	zpPass   = "zoop-password-not-in-any-record"
	zpMkt    = "3249465a7753536b62545a6a684b0000"
)

var sourcesYAML = `
sources:
  - name: sw
    driver: standardwebhooks
    secrets: ["` + swSecret + `"]
  - name: st
    driver: stripe
    secrets: ["` + stSecret + `"]
  - name: hm
    driver: hmac
    secrets: ["` + hmSecret + `"]
    options: {header: X-Hub-Signature-256, algorithm: sha256, prefix: "sha256=", encoding: hex, id_header: X-GitHub-Delivery, dedup_on_id_header: "true"}
  - name: pm
    driver: pagarme
    secrets: ["` + pmSecret + `"]
  - name: as
    driver: asaas
    secrets: ["` + asToken + `"]
  - name: pb
    driver: pagbank
    secrets: ["` + pbToken + `"]
  - name: mp
    driver: mercadopago
    secrets: ["` + mpSecret + `"]
  - name: zp
    driver: zoop
    account: ` + zpMkt + `
    secrets: ["paystream:` + zpPass + `"]
  - name: tiny
    driver: standardwebhooks
    secrets: ["` + swSecret + `"]
    max_body_bytes: 64
`

// bench is the ingest under test with its own topics and registry.
type bench struct {
	brokers []string
	raw     string
	dlq     string
	srv     *ingest.Server
	url     string
}

// setup starts an ingest on the test broker with fresh raw and DLQ topics,
// served by Serve on the HTTP server named, /metrics on its listener
// (scrape); cfg, when set, adjusts the config.
func setup(t testing.TB, server string, cfg func(*ingest.Config)) *bench {
	t.Helper()
	b := &bench{brokers: testenv.Kafka(t), raw: testenv.Topic(t, "raw", 3), dlq: testenv.Topic(t, "dlq", 1)}
	c := ingest.Config{
		Sources:    loadSources(t),
		Brokers:    b.brokers,
		Topic:      b.raw,
		DLQTopic:   b.dlq,
		Registerer: prometheus.NewRegistry(),
		Logger:     testLogger(t),
		HTTPServer: server,
		// The tests scrape the listener they post to.
		ServeMetrics: true,
	}
	if cfg != nil {
		cfg(&c)
	}
	srv, err := ingest.New(c)
	if err != nil {
		t.Fatal(err)
	}
	b.srv, b.url = srv, newServer(t, srv)
	return b
}

// testLogger writes to the test's output, shown when it fails or with -v.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func loadSources(t testing.TB) map[string]*source.Source {
	t.Helper()
	sources, err := source.Parse([]byte(sourcesYAML), drivers.Factories())
	if err != nil {
		t.Fatal(err)
	}
	return sources
}

// deadBroker returns the address of a port nothing listens on.
func deadBroker(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// webhook is one HTTP request to ingest.
type webhook struct {
	source string
	query  url.Values
	header http.Header
	body   []byte
}

var seq atomic.Int64

// uniq returns a suffix no other request of the test binary uses.
func uniq() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36) + strconv.FormatInt(seq.Add(1), 10)
}

// signedStandard returns a Standard Webhooks request for source carrying
// body, signed at ts with secret.
func signedStandard(t testing.TB, source, secret, id string, ts time.Time, body string) webhook {
	t.Helper()
	sig, err := standardwebhooks.Sign(secret, id, ts, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(standardwebhooks.HeaderID, id)
	h.Set(standardwebhooks.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(standardwebhooks.HeaderSignature, sig)
	return webhook{source: source, header: h, body: []byte(body)}
}

// paidWebhook is the "sw" source's payment.paid webhook id for paymentID
// at ts, signed with swSecret.
func paidWebhook(t testing.TB, id, paymentID string, ts time.Time) webhook {
	t.Helper()
	return signedStandard(t, "sw", swSecret, id, ts, paidBody(paymentID, ts))
}

func paidBody(paymentID string, ts time.Time) string {
	return fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":%q,"amount":1050,"currency":"BRL"}}`,
		ts.UTC().Format(time.RFC3339), paymentID)
}

// driverCase is one driver's happy path: a signed request and what ingest
// must produce from it.
type driverCase struct {
	driver     string
	req        webhook
	paymentKey string
	dedupKey   string // "" when derived (checked non-empty)
	secret     string // must not appear in the record
}

// driverCases returns a signed, processable webhook for every driver,
// each signed with the driver package's Sign helper.
func driverCases(t testing.TB, now time.Time) []driverCase {
	t.Helper()
	u := uniq()
	at := now.UTC().Format(time.RFC3339)
	json := func(source string, h http.Header, body string) webhook {
		h.Set("Content-Type", "application/json")
		return webhook{source: source, header: h, body: []byte(body)}
	}
	var cases []driverCase

	swID := "msg_" + u
	cases = append(cases, driverCase{"standardwebhooks", paidWebhook(t, swID, "pay_"+u, now), "sw:pay_" + u, swID, swSecret})

	stBody := fmt.Sprintf(`{"id":"evt_%s","object":"event","created":%d,"type":"payment_intent.succeeded","data":{"object":{"id":"pi_%s","object":"payment_intent","amount":2000,"amount_received":2000,"currency":"usd","status":"succeeded"}}}`, u, now.Unix(), u)
	cases = append(cases, driverCase{"stripe", json("st", http.Header{stripe.HeaderSignature: {stripe.Sign(stSecret, now, []byte(stBody))}}, stBody), "st:pi_" + u, "evt_" + u, stSecret})

	hmBody := paidBody("pay_hm_"+u, now)
	hmSig, err := hmac.Sign(hmSecret, "sha256", "sha256=", "hex", []byte(hmBody))
	if err != nil {
		t.Fatal(err)
	}
	cases = append(cases, driverCase{"hmac", json("hm", http.Header{"X-Hub-Signature-256": {hmSig}, "X-Github-Delivery": {"dlv-" + u}}, hmBody), "hm:pay_hm_" + u, "dlv-" + u, hmSecret})

	pmBody := fmt.Sprintf(`{"id":"hook_%s","type":"charge.paid","created_at":%q,"data":{"id":"ch_%s","amount":25990,"paid_amount":25990,"status":"paid","currency":"BRL"}}`, u, at, u)
	cases = append(cases, driverCase{"pagarme", json("pm", http.Header{pagarme.HeaderSignature: {pagarme.Sign(pmSecret, []byte(pmBody))}}, pmBody), "pm:ch_" + u, "hook_" + u, pmSecret})

	asBody := fmt.Sprintf(`{"id":"evt_as_%s","event":"PAYMENT_CONFIRMED","dateCreated":"2024-06-12 16:45:03","payment":{"object":"payment","id":"pay_as_%s","value":100.50,"billingType":"PIX","status":"CONFIRMED"}}`, u, u)
	cases = append(cases, driverCase{"asaas", json("as", http.Header{http.CanonicalHeaderKey(asaas.HeaderToken): {asaas.Sign(asToken)}}, asBody), "as:pay_as_" + u, "evt_as_" + u, asToken})

	pbBody := fmt.Sprintf(`{"id":"CHAR_%s","status":"PAID","created_at":%q,"paid_at":%q,"amount":{"value":1000,"currency":"BRL","summary":{"total":1000,"paid":1000,"refunded":0}}}`, u, at, at)
	cases = append(cases, driverCase{"pagbank", json("pb", http.Header{http.CanonicalHeaderKey(pagbank.HeaderSignature): {pagbank.Sign(pbToken, []byte(pbBody))}}, pbBody), "pb:CHAR_" + u, "", pbToken})

	mpID := strconv.FormatInt(now.UnixNano()%1e12, 10) + strconv.FormatInt(seq.Add(1), 10)
	mpBody := fmt.Sprintf(`{"action":"payment.created","api_version":"v1","data":{"id":%q},"date_created":%q,"id":%s,"live_mode":false,"type":"payment","user_id":"1"}`, mpID, at, mpID)
	reqID := "req-" + u
	mp := json("mp", http.Header{
		http.CanonicalHeaderKey(mercadopago.HeaderRequestID): {reqID},
		http.CanonicalHeaderKey(mercadopago.HeaderSignature): {mercadopago.Sign(mpSecret, mpID, reqID, now)},
	}, mpBody)
	mp.query = url.Values{mercadopago.QueryDataID: {mpID}, "type": {"payment"}}
	cases = append(cases, driverCase{"mercadopago", mp, "mp:" + mpID, mpID, mpSecret})

	zpBody := fmt.Sprintf(`{"id":"evt%s","type":"transaction.succeeded","resource":"event","payload":{"object":{"id":"tx%s","resource":"transaction","status":"succeeded","amount":"10.50","currency":"BRL"}},"created_at":%q}`, u, u, at)
	cases = append(cases, driverCase{"zoop", json("zp", http.Header{zoop.HeaderAuthorization: {zoop.Sign("paystream:" + zpPass)}}, zpBody), "zp:" + zpMkt + ":tx" + u, zpMkt + ":evt" + u, zpPass})
	return cases
}

// post sends w to the bench's ingest and returns the response with its
// body read.
func (b *bench) post(t testing.TB, w webhook) (*http.Response, string) {
	t.Helper()
	return postTo(t, b.url, w)
}

func postTo(t testing.TB, base string, w webhook) (*http.Response, string) {
	t.Helper()
	u := base + "/webhooks/" + w.source
	if len(w.query) > 0 {
		u += "?" + w.query.Encode()
	}
	req, err := http.NewRequest(http.MethodPost, u, bytes.NewReader(w.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = w.header.Clone()
	return do(t, req)
}

func get(t testing.TB, u string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := do(t, req)
	return resp.StatusCode, body
}

// checkGet fails the test unless GET u answers status want with a body
// holding each of contains; what names the request, and the situation it
// was made in, in the failure.
func checkGet(t testing.TB, u string, want int, what string, contains ...string) {
	t.Helper()
	code, body := get(t, u)
	ok := code == want
	for _, c := range contains {
		ok = ok && strings.Contains(body, c)
	}
	if !ok {
		t.Errorf("%s: %d %q, want %d with %q", what, code, body, want, contains)
	}
}

// do sends req and returns its response with the body read.
func do(t testing.TB, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// consume returns topic's records, failing the test unless there are at
// least want: ingest answers 200 only once the broker acknowledged them.
func consume(t testing.TB, brokers []string, topic string, want int) []*kgo.Record {
	t.Helper()
	recs := testenv.ReadCommitted(t, brokers, topic)
	if len(recs) < want {
		t.Fatalf("%d records on %s, want %d", len(recs), topic, want)
	}
	return recs
}

// scrape fetches base's /metrics and parses it.
func scrape(t testing.TB, base string) map[string]*dto.MetricFamily {
	t.Helper()
	return testenv.Scrape(t, base+"/metrics")
}

// metricValue returns the value of the counter or gauge name with exactly
// the given labels, and whether it exists; for a histogram, its count.
func metricValue(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, lp := range m.GetLabel() {
			if labels[lp.GetName()] != lp.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}
