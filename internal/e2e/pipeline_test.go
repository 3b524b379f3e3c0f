package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// pipeline is ingest, processor and sink running in the test process on
// the test's own schema and topics.
type pipeline struct {
	db      *testenv.DB
	brokers []string
	raw     string
	state   string
	dlq     string
	url     string // ingest's base URL
}

type pipelineOpts struct {
	noProcessor bool
	partitions  int                  // of the raw and state topics; 3 if 0
	tracer      trace.TracerProvider // ingest's and the processor's, if set
}

func setup(t *testing.T, opts pipelineOpts) *pipeline {
	t.Helper()
	if opts.partitions == 0 {
		opts.partitions = 3
	}
	p := &pipeline{
		db:      testenv.NewDB(t),
		brokers: testenv.Kafka(t),
		raw:     testenv.Topic(t, "raw", opts.partitions),
		state:   testenv.Topic(t, "state", opts.partitions),
		dlq:     testenv.Topic(t, "dlq", 1),
	}
	sources, err := source.Parse([]byte(`
sources:
  - name: acme
    driver: standardwebhooks
    secrets: ["`+testSecret+`"]
  - name: tiny
    driver: standardwebhooks
    secrets: ["`+testSecret+`"]
    max_body_bytes: 64
`), map[string]provider.Factory{"standardwebhooks": standardwebhooks.New})
	if err != nil {
		t.Fatal(err)
	}
	p.url = serveIngest(t, ingest.Config{Sources: sources, Brokers: p.brokers, Topic: p.raw, DLQTopic: p.dlq, TracerProvider: opts.tracer})
	if !opts.noProcessor {
		runProcessor(t, p.db.Pool, processor.Config{Brokers: p.brokers, Topic: p.raw, Group: testenv.Group(t), TracerProvider: opts.tracer})
	}
	runSink(t, p.db.Pool, p.brokers, p.state)
	return p
}

// serveIngest serves an ingest configured by cfg over HTTP until the test
// ends, and returns its base URL.
func serveIngest(t *testing.T, cfg ingest.Config) string {
	t.Helper()
	srv, err := ingest.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

// post sends a Standard Webhooks request signed with testSecret (or
// whatever sign returns) and returns the status code.
func (p *pipeline) post(t *testing.T, source, id string, ts time.Time, body string, tamper func(h http.Header)) int {
	t.Helper()
	req, err := signedRequest(p.url, source, id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	if tamper != nil {
		tamper(req.Header)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode
}

// signedRequest is a Standard Webhooks POST of body to base's
// /webhooks/{source}, signed with testSecret.
func signedRequest(base, source, id string, ts time.Time, body string) (*http.Request, error) {
	sig, err := standardwebhooks.Sign(testSecret, id, ts, []byte(body))
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, base+"/webhooks/"+source, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", fmt.Sprint(ts.Unix()))
	req.Header.Set("webhook-signature", sig)
	return req, nil
}

// consumeAll reads every record of topic from the start until want records
// arrived or timeout passed.
func consumeAll(t *testing.T, brokers []string, topic string, want int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("consume %s/%d: %v", topic, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestDuplicateDeliveriesHaveOneEffect: a signed webhook delivered three
// times, two of them concurrently, yields one processed inbox row, two
// ignored as duplicates, exactly one ledger credit and exactly one record on
// the normalized topic.
func TestDuplicateDeliveriesHaveOneEffect(t *testing.T) {
	p := setup(t, pipelineOpts{})
	now := time.Now()
	body := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_1","amount":1050,"currency":"BRL"}}`,
		now.UTC().Format(time.RFC3339))

	if code := p.post(t, "acme", "msg_dup_1", now, body, nil); code != http.StatusOK {
		t.Fatalf("first delivery: status %d, want 200", code)
	}
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Add(1)
		go func() { defer wg.Done(); codes[i] = p.post(t, "acme", "msg_dup_1", now, body, nil) }()
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Fatalf("concurrent redelivery %d: status %d, want 200", i, c)
		}
	}

	pool := p.db.Pool
	testenv.Eventually(t, 30*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM deliveries WHERE payment_key = 'acme:pay_1' AND status <> 'received'`) == 3
	}, "three deliveries processed")

	if n := count(t, pool, `SELECT count(*) FROM deliveries WHERE payment_key = 'acme:pay_1' AND status = 'processed'`); n != 1 {
		t.Errorf("processed inbox rows = %d, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM deliveries WHERE payment_key = 'acme:pay_1' AND status = 'ignored' AND reason = 'duplicate_event'`); n != 2 {
		t.Errorf("inbox rows ignored as duplicate_event = %d, want 2", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM payment_transitions WHERE payment_key = 'acme:pay_1'`); n != 1 {
		t.Errorf("transitions = %d, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM ledger_postings WHERE payment_key = 'acme:pay_1' AND amount_minor = -1050`); n != 1 {
		t.Errorf("ledger credits of 1050 = %d, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM ledger_postings WHERE payment_key = 'acme:pay_1'`); n != 2 {
		t.Errorf("ledger postings = %d, want 2 (one debit, one credit)", n)
	}
	if n := testenv.EndOffsetSum(t, p.brokers, p.raw); n != 3 {
		t.Errorf("raw topic holds %d records, want 3 (every 200 was produced)", n)
	}
	recs := consumeAll(t, p.brokers, p.state, 1, 10*time.Second)
	if n := len(committedState(t, p.brokers, p.state)); n != 1 || len(recs) != 1 {
		t.Fatalf("state topic holds %d committed records (consumed %d), want exactly 1", n, len(recs))
	}
	if got, want := string(recs[0].Key), "acme:pay_1"; got != want {
		t.Errorf("state record key = %q, want %q", got, want)
	}
	var eventID string
	for _, h := range recs[0].Headers {
		if h.Key == envelope.HeaderEventID {
			eventID = string(h.Value)
		}
	}
	if want := "acme:pay_1:1"; eventID != want {
		t.Errorf("state record event-id header = %q, want %q", eventID, want)
	}
}

// TestRejectedWebhooksProduceNothing: bad signature, stale timestamp,
// unknown source and oversized body get 401/401/404/413 and nothing reaches
// Kafka.
func TestRejectedWebhooksProduceNothing(t *testing.T) {
	p := setup(t, pipelineOpts{noProcessor: true})
	now := time.Now()
	body := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_2","amount":100,"currency":"USD"}}`,
		now.UTC().Format(time.RFC3339))
	cases := []struct {
		name   string
		source string
		ts     time.Time
		body   string
		tamper func(http.Header)
		want   int
	}{
		{"bad signature", "acme", now, body, func(h http.Header) {
			h.Set("webhook-signature", "v1,"+"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
		}, http.StatusUnauthorized},
		{"missing signature", "acme", now, body, func(h http.Header) { h.Del("webhook-signature") }, http.StatusUnauthorized},
		{"stale timestamp", "acme", now.Add(-10 * time.Minute), body, nil, http.StatusUnauthorized},
		{"future timestamp", "acme", now.Add(10 * time.Minute), body, nil, http.StatusUnauthorized},
		{"unknown source", "nobody", now, body, nil, http.StatusNotFound},
		{"oversized body", "tiny", now, body, nil, http.StatusRequestEntityTooLarge},
	}
	for _, tc := range cases {
		if got := p.post(t, tc.source, "msg_rej_"+tc.name, tc.ts, tc.body, tc.tamper); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, got, tc.want)
		}
	}
	// A valid request afterwards proves the topic and producer work, so the
	// zero below is not an artifact of a broken setup.
	if got := p.post(t, "acme", "msg_ok", now, body, nil); got != http.StatusOK {
		t.Fatalf("valid request: status %d, want 200", got)
	}
	if n := testenv.EndOffsetSum(t, p.brokers, p.raw); n != 1 {
		t.Errorf("raw topic holds %d records, want only the valid one", n)
	}
	if n := testenv.EndOffsetSum(t, p.brokers, p.dlq); n != 0 {
		t.Errorf("dlq holds %d records, want 0", n)
	}
}
