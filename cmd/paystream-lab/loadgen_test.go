package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
)

const loadgenSources = `
sources:
  - name: acme
    driver: standardwebhooks
    secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
  - name: st
    driver: stripe
    secrets: ["whsec_stripe_test_4eC39HqLyjWDarjtT1zdp7dc"]
  - name: as
    driver: asaas
    secrets: ["asaas-token-5d2c"]
`

// verifier answers 200 to requests the real driver of their source
// verifies, 401 to the others, counting both.
func verifier(t *testing.T, sourcesYAML string) (url string, ok, bad *atomic.Int64) {
	t.Helper()
	sources, err := source.Parse([]byte(sourcesYAML), drivers.Factories())
	if err != nil {
		t.Fatal(err)
	}
	ok, bad = new(atomic.Int64), new(atomic.Int64)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		src, found := sources[strings.TrimPrefix(r.URL.Path, "/webhooks/")]
		if !found {
			http.NotFound(w, r)
			return
		}
		req := &provider.Request{Header: r.Header, Query: r.URL.Query(), Body: body, Now: time.Now()}
		if src.Driver.Verify(req) != nil {
			bad.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if _, err := src.Driver.Parse(req); err != nil {
			bad.Add(1)
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		ok.Add(1)
		_, _ = w.Write([]byte(`{"received":true}`))
	}))
	t.Cleanup(hs.Close)
	return hs.URL, ok, bad
}

func writeSources(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sources.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLoadgenCommand: `paystream-lab loadgen` sends the requested number of
// requests, every one verified by the real driver, and prints a JSON report
// that says so; --source restricts the sources.
func TestLoadgenCommand(t *testing.T) {
	t.Parallel()
	url, ok, bad := verifier(t, loadgenSources)
	path := writeSources(t, loadgenSources)
	r := lab.Run(t, nil, "loadgen", "--sources", path, "--url", url, "-n", "60", "-c", "4", "--duplicates", "0.1", "--json")
	if r.Code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	var rep struct {
		Requests int64              `json:"requests"`
		Status   map[string]int64   `json:"status"`
		Latency  map[string]float64 `json:"latency_ms"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("stdout is not a JSON report: %v\n%s", err, r.Stdout)
	}
	if rep.Requests != 60 || rep.Status["200"] != 60 || rep.Latency["p99"] <= 0 {
		t.Errorf("report %+v, want 60 × 200", rep)
	}
	if ok.Load() != 60 || bad.Load() != 0 {
		t.Errorf("server verified %d and rejected %d, want 60 and 0", ok.Load(), bad.Load())
	}
	if !strings.Contains(r.Stderr, "acme (standardwebhooks), st (stripe), as (asaas)") {
		t.Errorf("stderr does not name the sources:\n%s", r.Stderr)
	}
	for _, secret := range []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "asaas-token-5d2c"} {
		if strings.Contains(r.Stdout+r.Stderr, secret) {
			t.Errorf("output contains a secret")
		}
	}

	// One source, text report.
	r = lab.Run(t, nil, "loadgen", "--sources", path, "--url", url, "--source", "st", "-n", "5", "-q")
	if r.Code != 0 || !strings.Contains(r.Stdout, "200: 5") || !strings.Contains(r.Stdout, "p99 ") || r.Stderr != "" {
		t.Errorf("--source st -q: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}

	// fasthttp's client: every request verified too.
	before := ok.Load()
	r = lab.Run(t, nil, "loadgen", "--sources", path, "--url", url, "--client", "fasthttp", "-n", "30", "-c", "4", "-q")
	if r.Code != 0 || !strings.Contains(r.Stdout, "200: 30") || ok.Load()-before != 30 || bad.Load() != 0 {
		t.Errorf("--client fasthttp: exit %d, server verified %d and rejected %d\nstdout: %s\nstderr: %s", r.Code, ok.Load()-before, bad.Load(), r.Stdout, r.Stderr)
	}
}

func TestLoadgenUsageErrors(t *testing.T) {
	t.Parallel()
	path := writeSources(t, loadgenSources)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--source", "nope", "-n", "1"}, "--source nope"},
		{[]string{"--duplicates", "1", "-n", "1"}, "--duplicates"},
		{[]string{"--rate", "fast", "-n", "1"}, "rate"},
		{[]string{"-c", "0", "-n", "1"}, "--concurrency"},
		{[]string{"--client", "curl", "-n", "1"}, "--client"},
	} {
		r := lab.Run(t, nil, append([]string{"loadgen", "--sources", path, "--url", "http://127.0.0.1:1"}, c.args...)...)
		if r.Code == 0 || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("loadgen %v: exit %d, stderr %q, want an error about %s", c.args, r.Code, r.Stderr, c.want)
		}
	}
	if r := lab.Run(t, nil, "loadgen", "-n", "1"); r.Code == 0 || !strings.Contains(r.Stderr, "--sources") {
		t.Errorf("loadgen without sources: exit %d, stderr %q", r.Code, r.Stderr)
	}
}

func TestRateFlag(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"0": 0, "500": 500, "500/s": 500, "30000/m": 500, "1.5/s": 1.5, "7200/h": 2} {
		var r rateFlag
		if err := r.UnmarshalText([]byte(in)); err != nil || float64(r) != want {
			t.Errorf("rate %q = %v, %v; want %v", in, float64(r), err, want)
		}
	}
	for _, in := range []string{"", "fast", "-1", "10/d", "NaN", "1e12"} {
		var r rateFlag
		if err := r.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("rate %q accepted as %v", in, float64(r))
		}
	}
}

// TestProgressPrinter: on a terminal one line is rewritten in place and
// cleared at the end; otherwise each snapshot is a plain line.
func TestProgressPrinter(t *testing.T) {
	t.Parallel()
	snap := loadgen.Snapshot{Elapsed: 1500 * time.Millisecond, Sent: 4200, Errors: 3, RPS: 2800, P99: 12300 * time.Microsecond}
	var tty bytes.Buffer
	p, interval := progressPrinter(&tty, true)
	p(snap)
	p(loadgen.Snapshot{Final: true})
	if interval >= time.Second || !strings.HasPrefix(tty.String(), "\r\x1b[K") || strings.Contains(tty.String(), "\n") ||
		!strings.Contains(tty.String(), "sent 4200  2800 req/s  errors 3  p99 12.3ms") || !strings.HasSuffix(tty.String(), "\r\x1b[K") {
		t.Errorf("terminal progress %q (interval %v)", tty.String(), interval)
	}
	var plain bytes.Buffer
	p, _ = progressPrinter(&plain, false)
	p(snap)
	p(snap)
	p(loadgen.Snapshot{Final: true})
	if lines := strings.Split(strings.TrimSpace(plain.String()), "\n"); len(lines) != 2 || strings.Contains(plain.String(), "\r") || strings.Contains(plain.String(), "\x1b") {
		t.Errorf("plain progress %q, want two plain lines", plain.String())
	}
}
