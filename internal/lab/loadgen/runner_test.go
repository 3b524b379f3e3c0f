package loadgen

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
)

// verifyingServer answers like ingest without Kafka: 401 unless the real
// driver verifies the request, 200 after it parsed; it records each
// parsed event's dedup key per source.
type verifyingServer struct {
	*httptest.Server
	mu   sync.Mutex
	keys map[string]int // source/dedup key → deliveries
	bad  int
}

func newVerifyingServer(t *testing.T) *verifyingServer {
	t.Helper()
	sources, err := source.Parse([]byte(TestSourcesYAML), drivers.Factories())
	if err != nil {
		t.Fatal(err)
	}
	vs := &verifyingServer{keys: map[string]int{}}
	vs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/webhooks/")
		src, ok := sources[name]
		body, _ := io.ReadAll(r.Body)
		if !ok {
			http.NotFound(w, r)
			return
		}
		pr := &provider.Request{Header: r.Header, Query: r.URL.Query(), Body: body, Now: time.Now()}
		if err := src.Driver.Verify(pr); err != nil {
			vs.mu.Lock()
			vs.bad++
			vs.mu.Unlock()
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		ev, err := src.Driver.Parse(pr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		vs.mu.Lock()
		vs.keys[name+"/"+ev.DedupKey]++
		vs.mu.Unlock()
		_, _ = w.Write([]byte(`{"received":true}`))
	}))
	t.Cleanup(vs.Close)
	return vs
}

func allBuilders(t *testing.T) []*Builder {
	t.Helper()
	var bs []*Builder
	for _, src := range testSources(t) {
		b, err := NewBuilder(src, "rt", 7)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	return bs
}

// senders are the two ways to send, by name: net/http (Run's default, a
// nil Sender) and fasthttp's client.
func senders(t *testing.T, url string, conns int) map[string]Sender {
	t.Helper()
	fast, err := NewFastSender(url, conns, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]Sender{"net/http": nil, "fasthttp": fast}
}

// eachSender runs test once with each sender against vs, one after the
// other, vs's counts reset before each.
func eachSender(t *testing.T, vs *verifyingServer, test func(*testing.T, Sender)) {
	t.Helper()
	for name, sender := range senders(t, vs.URL, 8) {
		t.Run(name, func(t *testing.T) {
			vs.mu.Lock()
			vs.keys, vs.bad = map[string]int{}, 0
			vs.mu.Unlock()
			test(t, sender)
		})
	}
}

// TestRunCountsEveryAnswer: a run of N requests over every driver gets N
// verified 200s, whichever client sends them (so both send the headers,
// query and body each driver signs); the duplicates it reports are exactly
// the deliveries the server saw twice or more, and the report shows the
// counts.
func TestRunCountsEveryAnswer(t *testing.T) {
	t.Parallel()
	vs := newVerifyingServer(t)
	eachSender(t, vs, func(t *testing.T, sender Sender) { testRunCountsEveryAnswer(t, vs, sender) })
}

func testRunCountsEveryAnswer(t *testing.T, vs *verifyingServer, sender Sender) {
	gen, err := NewGenerator(GeneratorConfig{Builders: allBuilders(t), Payments: 40, Duplicates: 0.2, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	var snaps []Snapshot
	res, err := Run(t.Context(), Config{
		URL: vs.URL, Generator: gen, Concurrency: 8, Requests: 400, Sender: sender,
		Progress: func(s Snapshot) { snaps = append(snaps, s) }, ProgressInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 400 || res.Status[200] != 400 || res.OK() != 400 || res.Failed() != 0 {
		t.Fatalf("sent %d, status %v, want 400 × 200", res.Sent, res.Status)
	}
	if vs.bad != 0 {
		t.Fatalf("server rejected %d signatures", vs.bad)
	}
	var repeats int64
	for _, n := range vs.keys {
		repeats += int64(n - 1)
	}
	if repeats != res.Duplicates {
		t.Errorf("server saw %d repeated deliveries, result reports %d duplicates", repeats, res.Duplicates)
	}
	if res.Duplicates < 40 || res.Duplicates > 130 {
		t.Errorf("duplicates = %d of 400, want about 20%%", res.Duplicates)
	}
	if res.Latency.Count() != 400 || res.Latency.Quantile(0.99) <= 0 {
		t.Errorf("latency count %d p99 %v", res.Latency.Count(), res.Latency.Quantile(0.99))
	}
	if len(snaps) == 0 || !snaps[len(snaps)-1].Final || snaps[len(snaps)-1].Sent != 400 {
		t.Errorf("last progress snapshot = %+v, want a final one with 400 sent", snaps)
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests    400 ", "200: 400", "p50 ", "p99 ", "duplicates  "} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
	raw, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Requests int64              `json:"requests"`
		Status   map[string]int64   `json:"status"`
		Latency  map[string]float64 `json:"latency_ms"`
	}
	if err := json.Unmarshal(raw, &decoded); err != nil {
		t.Fatal(err)
	}
	if decoded.Requests != 400 || decoded.Status["200"] != 400 || decoded.Latency["p99"] <= 0 {
		t.Errorf("JSON report = %s", raw)
	}
}

// TestRunRespectsRate: at 200 requests/s for 1s, no more than the rate
// allows are sent (the burst is 10ms worth: 2 requests), whatever the
// concurrency.
func TestRunRespectsRate(t *testing.T) {
	t.Parallel()
	vs := newVerifyingServer(t)
	gen, err := NewGenerator(GeneratorConfig{Builders: allBuilders(t)[:1]})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(t.Context(), Config{URL: vs.URL, Generator: gen, Concurrency: 16, Rate: 200, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent > 202 {
		t.Errorf("sent %d in %v at 200/s, want at most 202", res.Sent, res.Elapsed)
	}
	if res.Sent < 100 {
		t.Errorf("sent only %d in %v at 200/s", res.Sent, res.Elapsed)
	}
}

// TestRunCountsTransportErrors: a target that is not there gives counted
// errors, not a failed run.
func TestRunCountsTransportErrors(t *testing.T) {
	t.Parallel()
	vs := newVerifyingServer(t)
	url := vs.URL
	vs.Close()
	gen, err := NewGenerator(GeneratorConfig{Builders: allBuilders(t)[:1]})
	if err != nil {
		t.Fatal(err)
	}
	for name, sender := range senders(t, url, 2) {
		res, err := Run(t.Context(), Config{URL: url, Generator: gen, Concurrency: 2, Requests: 10, Sender: sender})
		if err != nil {
			t.Fatal(err)
		}
		if res.Sent != 10 || res.Failed() != 10 || res.Errors["connection refused"] != 10 {
			t.Errorf("%s: sent %d failed %d errors %v, want 10 refused", name, res.Sent, res.Failed(), res.Errors)
		}
	}
}

func TestRunConfigErrors(t *testing.T) {
	t.Parallel()
	gen, err := NewGenerator(GeneratorConfig{Builders: allBuilders(t)[:1]})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"no URL":       {Generator: gen, Requests: 1},
		"no generator": {URL: "http://x", Requests: 1},
		"no end":       {URL: "http://x", Generator: gen},
		"bad rate":     {URL: "http://x", Generator: gen, Requests: 1, Rate: -1},
	} {
		if _, err := Run(t.Context(), cfg); err == nil {
			t.Errorf("%s: Run accepted the config", name)
		}
	}
}

// TestGeneratorAdvancesPayments: payments advance in turn through their
// steps, and a duplicate is an event already sent.
func TestGeneratorAdvancesPayments(t *testing.T) {
	t.Parallel()
	g, err := NewGenerator(GeneratorConfig{Builders: allBuilders(t)[:1], Payments: 3, Duplicates: 0.5, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	sent := map[uint64]Event{}
	now := time.Now()
	var dups int
	for range 300 {
		ev, dup := g.next(now)
		if dup {
			dups++
			if prev, ok := sent[ev.Seq]; !ok || prev != ev {
				t.Fatalf("duplicate %+v was never sent", ev)
			}
			continue
		}
		if _, ok := sent[ev.Seq]; ok {
			t.Fatalf("seq %d reused", ev.Seq)
		}
		if want := int(ev.Seq % 3); ev.Payment != want {
			t.Fatalf("seq %d went to payment %d, want %d", ev.Seq, ev.Payment, want)
		}
		if want := int(ev.Seq / 3); ev.Step != want {
			t.Fatalf("seq %d has step %d, want %d", ev.Seq, ev.Step, want)
		}
		sent[ev.Seq] = ev
	}
	if dups < 110 || dups > 190 {
		t.Errorf("%d duplicates of 300 at 0.5", dups)
	}
	for _, bad := range []GeneratorConfig{{}, {Builders: allBuilders(t), Duplicates: 1}, {Builders: allBuilders(t), Payments: -1}} {
		if _, err := NewGenerator(bad); err == nil {
			t.Errorf("NewGenerator(%+v) accepted", bad)
		}
	}
}

// TestFastSenderTimesOut: an answer later than the timeout is a counted
// "timeout", and a URL that is not http(s) is refused up front.
func TestFastSenderTimesOut(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	fast, err := NewFastSender(slow.URL, 2, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	gen, err := NewGenerator(GeneratorConfig{Builders: allBuilders(t)[:1]})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(t.Context(), Config{URL: slow.URL, Generator: gen, Concurrency: 2, Requests: 4, Sender: fast})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 4 || res.Errors["timeout"] != 4 {
		t.Errorf("sent %d errors %v, want 4 timeouts", res.Sent, res.Errors)
	}
	for _, bad := range []string{"127.0.0.1:8080", "ftp://x", "http://"} {
		if _, err := NewFastSender(bad, 1, time.Second); err == nil {
			t.Errorf("NewFastSender(%q) accepted it", bad)
		}
	}
}
