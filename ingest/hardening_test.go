package ingest_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/internal/topics"
)

// bodyOfSize returns a payment.paid body for paymentID padded to exactly
// size bytes with an extra "pad" field of random hex, which the producer's
// compression cannot shrink (snappy finds no repeats in it), so the
// broker's max.message.bytes is put to the test.
func bodyOfSize(t testing.TB, paymentID string, ts time.Time, size int) string {
	t.Helper()
	base := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":%q,"amount":1050,"currency":"BRL"},"pad":""}`,
		ts.UTC().Format(time.RFC3339), paymentID)
	if size < len(base) {
		t.Fatalf("body of %d bytes: the smallest is %d", size, len(base))
	}
	pad := make([]byte, (size-len(base)+1)/2)
	_, _ = rand.Read(pad)
	return base[:len(base)-2] + hex.EncodeToString(pad)[:size-len(base)] + `"}`
}

// layoutTopics creates raw, state and DLQ topics sized for sources the way
// paystream migrate does (topics.Ensure), and deletes them when the test
// ends.
func layoutTopics(t testing.TB, brokers []string, sources map[string]*source.Source) (raw, dlq string) {
	t.Helper()
	maxRecord, err := ingest.MaxRecordBytes(sources)
	if err != nil {
		t.Fatal(err)
	}
	u := uniq()
	l := topics.Layout{Raw: "raw-" + u, State: "state-" + u, DLQ: "dlq-" + u, Partitions: 3, DLQPartitions: 1, MaxMessageBytes: maxRecord}
	specs, err := l.Specs()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopics(ctx, l.Raw, l.State, l.DLQ); err != nil {
			t.Errorf("delete topics: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := topics.Ensure(ctx, adm, specs); err != nil {
		t.Fatal(err)
	}
	return l.Raw, l.DLQ
}

// TestLargestBodiesAccepted: a correctly signed body of exactly the
// source's max_body_bytes (1 MiB) is answered 200 and lands byte-exact on
// the raw topic; one more byte is 413; a 1 MiB body that is authentic but
// unprocessable lands on the DLQ. Before ingest sized its producer and the
// topics for base64 bodies, anything above about 750,000 bytes was 503
// forever (MESSAGE_TOO_LARGE).
func TestLargestBodiesAccepted(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		brokers := testenv.Kafka(t)
		sources := loadSources(t)
		raw, dlq := layoutTopics(t, brokers, sources)
		srv, err := ingest.New(ingest.Config{
			HTTPServer: server,
			Sources:    sources, Brokers: brokers, Topic: raw, DLQTopic: dlq,
			Registerer: prometheus.NewRegistry(), Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		b := &bench{brokers: brokers, raw: raw, dlq: dlq, srv: srv, url: newServer(t, srv)}
		t.Logf("max record bytes for a 1 MiB body: %d", srv.MaxRecordBytes())

		limit := int(source.DefaultMaxBodyBytes)
		now := time.Now()
		body := bodyOfSize(t, "pay_big_"+uniq(), now, limit)
		if resp, text := b.post(t, signedStandard(t, "sw", swSecret, "msg_big_"+uniq(), now, body)); resp.StatusCode != http.StatusOK {
			t.Fatalf("signed body of %d bytes (max_body_bytes): %d %s, want 200", limit, resp.StatusCode, text)
		}
		recs := consume(t, brokers, raw, 1)
		env, err := envelope.DecodeRaw(recs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(env.Body, []byte(body)) {
			t.Fatalf("raw record's body: %d bytes, not the %d sent", len(env.Body), len(body))
		}
		t.Logf("raw record of a %d-byte body: %d bytes", limit, len(recs[0].Value)+len(recs[0].Key))

		over := bodyOfSize(t, "pay_over_"+uniq(), now, limit+1)
		if resp, text := b.post(t, signedStandard(t, "sw", swSecret, "msg_over_"+uniq(), now, over)); resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("body of %d bytes: %d %s, want 413", limit+1, resp.StatusCode, text)
		}

		// Dead-lettered: authentic, 1 MiB, unknown type.
		dead := strings.Replace(bodyOfSize(t, "pay_dead_"+uniq(), now, limit), `"payment.paid"`, `"payment.odd!"`, 1)
		if resp, text := b.post(t, signedStandard(t, "sw", swSecret, "msg_dead_"+uniq(), now, dead)); resp.StatusCode != http.StatusOK {
			t.Fatalf("unprocessable body of %d bytes: %d %s, want 200", limit, resp.StatusCode, text)
		}
		if d := consume(t, brokers, dlq, 1); len(d[0].Value) < limit {
			t.Fatalf("DLQ record of %d bytes, want the 1 MiB body in it", len(d[0].Value))
		}
		if n := testenv.EndOffsetSum(t, brokers, raw); n != 1 {
			t.Errorf("raw topic has %d records, want 1", n)
		}
	})
}

// slowBody opens a connection to base and sends a signed webhook's headers
// and all of its body but the last byte, holding the request in ingest's
// handler until finish is called; finish sends the last byte and returns
// the status.
func slowBody(t *testing.T, base string, w webhook) (finish func() int) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST /webhooks/%s HTTP/1.1\r\nHost: ingest\r\nContent-Length: %d\r\n", w.source, len(w.body))
	for k, vs := range w.header {
		for _, v := range vs {
			fmt.Fprintf(&req, "%s: %s\r\n", k, v)
		}
	}
	req.WriteString("\r\n")
	req.Write(w.body[:len(w.body)-1])
	if _, err := conn.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	return func() int {
		if _, err := conn.Write(w.body[len(w.body)-1:]); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
}

// burst posts n signed webhooks at once and counts the answers by status;
// every 503 must carry Retry-After.
func burst(t *testing.T, b *bench, n int, size int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range n {
		now := time.Now()
		w := signedStandard(t, "sw", swSecret, "msg_burst_"+uniq(), now, bodyOfSize(t, "pay_burst_"+uniq(), now, size))
		wg.Go(func() {
			resp, _ := b.post(t, w)
			if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After")
			}
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return codes
}

// TestInFlightCap: with MaxInFlight requests waiting for a broker that
// does not answer, every further webhook is answered 503 with Retry-After
// at once and counted as overloaded; once the broker answers (200), webhooks
// are accepted again. A request counts once its body is in: slow bodies
// never hold a place (TestSlowBodiesDoNotStarveGateways).
func TestInFlightCap(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		const maxInFlight, extra = 4, 20
		g := newGate()
		b := setup(t, server, func(c *ingest.Config) {
			c.MaxInFlight, c.ProduceTimeout = maxInFlight, 30*time.Second
			c.KafkaOpts = []kgo.Opt{kgo.Dialer(g.dial)}
		})
		t.Cleanup(g.reopen)
		if codes := burst(t, b, 1, 200); codes[http.StatusOK] != 1 { // connects the producer
			t.Fatalf("warm-up: %v", codes)
		}
		g.shut()
		held := make(chan map[int]int, 1)
		go func() { held <- burst(t, b, maxInFlight, 200) }()
		testenv.Eventually(t, 10*time.Second, func() bool {
			v, _ := metricValue(scrape(t, b.url), "paystream_ingest_in_flight_requests", nil)
			return v == maxInFlight
		}, "%d requests waiting for the broker", maxInFlight)

		codes := burst(t, b, extra, 200)
		t.Logf("with %d requests waiting for the broker (cap %d), %d more requests: %v", maxInFlight, maxInFlight, extra, codes)
		if codes[http.StatusServiceUnavailable] != extra {
			t.Errorf("%d of %d requests over the cap answered 503, want all", codes[http.StatusServiceUnavailable], extra)
		}
		g.reopen()
		if codes := <-held; codes[http.StatusOK] != maxInFlight {
			t.Errorf("the requests that waited for the broker: %v, want %d × 200", codes, maxInFlight)
		}
		if codes := burst(t, b, 2, 200); codes[http.StatusOK] != 2 {
			t.Errorf("after the broker answered: %v, want 2 × 200", codes)
		}
		mfs := scrape(t, b.url)
		for _, c := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "overloaded"}, extra},
			{"paystream_ingest_overload_rejections_total", map[string]string{"limit": "in_flight"}, extra},
			{"paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "accepted"}, 1 + maxInFlight + 2},
			{"paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "unavailable"}, 0},
		} {
			if v, ok := metricValue(mfs, c.name, c.labels); v != c.want {
				t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
			}
		}
	})
}

// TestBufferedBodyBytesCap: bodies whose buffers would pass
// MaxBufferedBodyBytes beyond their first 8 KiB are answered 503 while slow
// bodies hold it; bodies within 8 KiB still get in.
func TestBufferedBodyBytesCap(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		sources, err := source.Parse([]byte(`
sources:
  - name: sw
    driver: standardwebhooks
    secrets: ["`+swSecret+`"]
    max_body_bytes: 16384
`), drivers.Factories())
		if err != nil {
			t.Fatal(err)
		}
		// Each body of 16,000 bytes holds 16,001 - 8,192 = 7,809 bytes of
		// the cap: two slow ones fit, a third does not.
		const size, budget = 16000, 20000
		b := setup(t, server, func(c *ingest.Config) { c.Sources, c.MaxBufferedBodyBytes = sources, budget })
		var finishes []func() int
		for range 2 {
			now := time.Now()
			finishes = append(finishes, slowBody(t, b.url, signedStandard(t, "sw", swSecret, "msg_slow_"+uniq(), now, bodyOfSize(t, "pay_slow_"+uniq(), now, size))))
		}
		testenv.Eventually(t, 10*time.Second, func() bool {
			mfs := scrape(t, b.url)
			reading, _ := metricValue(mfs, "paystream_ingest_reading_requests", nil)
			held, _ := metricValue(mfs, "paystream_ingest_buffered_body_bytes", nil)
			return reading == 2 && held == 2*(size+1-8192)
		}, "2 slow requests holding their bytes")
		big := burst(t, b, 10, size)
		small := burst(t, b, 3, 500)
		t.Logf("with 2 × %d body bytes held (cap %d): 10 × %d bytes → %v; 3 × 500 bytes → %v", size, budget, size, big, small)
		if big[http.StatusServiceUnavailable] != 10 {
			t.Errorf("%v for bodies over the budget, want 10 × 503", big)
		}
		if small[http.StatusOK] != 3 {
			t.Errorf("%v for bodies within 8 KiB, want 3 × 200", small)
		}
		for i, finish := range finishes {
			if code := finish(); code != http.StatusOK {
				t.Errorf("slow request %d: %d, want 200", i, code)
			}
		}
		mfs := scrape(t, b.url)
		if v, _ := metricValue(mfs, "paystream_ingest_overload_rejections_total", map[string]string{"limit": "body_bytes"}); v != 10 {
			t.Errorf("body_bytes rejections = %v, want 10", v)
		}
		if v, _ := metricValue(mfs, "paystream_ingest_buffered_body_bytes", nil); v != 0 {
			t.Errorf("%v body bytes held once every request was answered, want 0", v)
		}
	})
}

// gate is a Kafka dialer whose connections stop writing while it is shut,
// as a broker that stopped reading would look to the producer.
type gate struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) shut() { g.mu.Lock(); g.open = make(chan struct{}); g.mu.Unlock() }

func (g *gate) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *gate) wait() {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	<-ch
}

func (g *gate) dial(ctx context.Context, network, host string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return gatedConn{c, g}, nil
}

type gatedConn struct {
	net.Conn
	g *gate
}

func (c gatedConn) Write(p []byte) (int, error) { c.g.wait(); return c.Conn.Write(p) }

// TestClientGoneIsNotUnavailable: a client that hangs up while ingest
// waits for the broker is counted as client_gone, not as unavailable (the
// alerting outcome): the broker did nothing wrong. Ingest still waits for
// the broker (up to ProduceTimeout) before it counts: the request's context
// also ends when a client merely closes its sending side, and no answer may
// go out before the broker did.
func TestClientGoneIsNotUnavailable(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		g := newGate()
		b := setup(t, server, func(c *ingest.Config) {
			c.ProduceTimeout = 2 * time.Second
			c.KafkaOpts = []kgo.Opt{kgo.Dialer(g.dial)}
		})
		t.Cleanup(g.reopen) // before Serve returns: let the held record go
		now := time.Now()
		if resp, _ := b.post(t, paidWebhook(t, "msg_warm_"+uniq(), "pay_warm_"+uniq(), now)); resp.StatusCode != http.StatusOK {
			t.Fatalf("warm-up: %d", resp.StatusCode)
		}
		g.shut()
		ctx, cancel := context.WithCancel(context.Background())
		w := paidWebhook(t, "msg_gone_"+uniq(), "pay_gone_"+uniq(), now)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/webhooks/sw", bytes.NewReader(w.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = w.header
		done := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		// Hang up once the request waits on the broker.
		testenv.Eventually(t, 10*time.Second, func() bool {
			v, _ := metricValue(scrape(t, b.url), "paystream_ingest_in_flight_requests", nil)
			return v == 1
		}, "the request waiting for the broker")
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("client: %v, want canceled", err)
		}
		testenv.WaitFor(t, 10*time.Second, func() error {
			mfs := scrape(t, b.url)
			gone, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "client_gone"})
			unavailable, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "unavailable"})
			if gone != 1 || unavailable != 0 {
				return fmt.Errorf("client_gone = %v, unavailable = %v; want 1 and 0", gone, unavailable)
			}
			return nil
		})
	})
}

// TestStringAmountDeadLettered: "amount": "1050", a JSON string where the
// Standard Webhooks convention says integer, is dead-lettered with a bad
// amount reason, not accepted.
func TestStringAmountDeadLettered(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		now := time.Now()
		body := strings.Replace(paidBody("pay_str_"+uniq(), now), `"amount":1050`, `"amount":"1050"`, 1)
		if resp, text := b.post(t, signedStandard(t, "sw", swSecret, "msg_str_"+uniq(), now, body)); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s, want 200 (dead-lettered)", resp.StatusCode, text)
		}
		rec := consume(t, b.brokers, b.dlq, 1)[0]
		var env envelope.Raw
		if err := json.Unmarshal(rec.Value, &env); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(env.Reason, "bad amount") {
			t.Errorf("DLQ reason %q, want a bad amount", env.Reason)
		}
		if n := testenv.EndOffsetSum(t, b.brokers, b.raw); n != 0 {
			t.Errorf("raw topic has %d records, want 0", n)
		}
	})
}

// TestUnauthorizedNotLoggedAtInfo: a forged webhook is counted, not logged
// at info or above, so a flood of forgeries cannot flood the logs.
func TestUnauthorizedNotLoggedAtInfo(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		var logs syncBuffer
		b := setup(t, server, func(c *ingest.Config) {
			c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		})
		now := time.Now()
		for range 3 {
			if resp, _ := b.post(t, signedStandard(t, "sw", "whsec_Zm9yZ2Vk", "msg_forged_"+uniq(), now, paidBody("pay_f", now))); resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("forged: %d, want 401", resp.StatusCode)
			}
		}
		var logged []string
		for line := range strings.Lines(logs.String()) {
			if !strings.Contains(line, `msg="ingest listening"`) {
				logged = append(logged, line)
			}
		}
		if s := strings.Join(logged, ""); s != "" {
			t.Errorf("401s logged at info or above:\n%s", s)
		}
		if v, _ := metricValue(scrape(t, b.url), "paystream_ingest_signature_failures_total", map[string]string{"source": "sw", "reason": "bad_signature"}); v != 3 {
			t.Errorf("signature failures = %v, want 3", v)
		}
	})
}

// TestMetricsOffTheWebhookListener: by default (ServeMetrics unset) the
// webhook listener, which anyone on the internet reaches, has no /metrics.
func TestMetricsOffTheWebhookListener(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, func(c *ingest.Config) { c.ServeMetrics = false })
		checkGet(t, b.url+"/metrics", http.StatusNotFound, "/metrics")
		checkGet(t, b.url+"/healthz", http.StatusOK, "/healthz")
	})
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
