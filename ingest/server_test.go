package ingest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/testenv"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// newServer runs srv's Serve (on the HTTP server its config names) on a
// loopback listener until the test ends, and returns its URL. Serve closes
// srv's Kafka client when it returns.
func newServer(t testing.TB, srv *ingest.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// servers are the HTTP servers ingest can run.
var servers = []string{ingest.HTTPServerNet, ingest.HTTPServerFast}

// eachServer runs f as a parallel subtest for each HTTP server.
func eachServer(t *testing.T, f func(t *testing.T, server string)) {
	t.Parallel()
	for _, server := range servers {
		t.Run(strings.ReplaceAll(server, "/", ""), func(t *testing.T) {
			t.Parallel()
			f(t, server)
		})
	}
}

func TestHealthAndReady(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		checkGet(t, b.url+"/healthz", http.StatusOK, "/healthz", `"ok":true`)
		checkGet(t, b.url+"/readyz", http.StatusOK, "/readyz with the broker", `"ready":true`)
		checkGet(t, b.url+"/nope", http.StatusNotFound, "/nope")
	})
}

// TestMetricsExposeEveryInstrument: /metrics shows requests by source and
// outcome, signature failures by reason, the produce latency and body size
// histograms and the in-flight gauge, with the values the requests made.
func TestMetricsExposeEveryInstrument(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		now := time.Now()
		body := paidBody("pay_m", now)
		for range 2 {
			if resp, _ := b.post(t, signedStandard(t, "sw", swSecret, "msg_m_"+uniq(), now, body)); resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		if resp, _ := b.post(t, signedStandard(t, "sw", "whsec_Zm9yZ2Vk", "msg_m_bad", now, body)); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("forged: status %d", resp.StatusCode)
		}
		mfs := scrape(t, b.url)
		checks := []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "accepted"}, 2},
			{"paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "unauthorized"}, 1},
			{"paystream_ingest_requests_total", map[string]string{"source": "st", "outcome": "accepted"}, 0}, // pre-declared per source
			{"paystream_ingest_signature_failures_total", map[string]string{"source": "sw", "reason": "bad_signature"}, 1},
			{"paystream_ingest_produce_seconds", nil, 2},
			{"paystream_ingest_body_bytes", nil, 3},
			{"paystream_ingest_in_flight_requests", nil, 0},
		}
		for _, c := range checks {
			v, ok := metricValue(mfs, c.name, c.labels)
			if !ok || v != c.want {
				t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
			}
		}
		// The body-size histogram saw the body's size.
		h := mfs["paystream_ingest_body_bytes"].GetMetric()[0].GetHistogram()
		if want := 3 * float64(len(body)); h.GetSampleSum() != want {
			t.Errorf("body bytes sum = %v, want %v", h.GetSampleSum(), want)
		}
		if mfs["paystream_ingest_produce_seconds"].GetMetric()[0].GetHistogram().GetSampleSum() <= 0 {
			t.Error("produce latency sum is zero")
		}
	})
}

// TestConfigValidation: New names the missing or bad field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	sources := loadSources(t)
	for _, c := range []struct {
		cfg  ingest.Config
		want string
	}{
		{ingest.Config{Brokers: []string{"x:1"}}, "Sources"},
		{ingest.Config{Sources: sources}, "Brokers"},
		{ingest.Config{Sources: sources, Brokers: []string{"x:1"}, ProduceTimeout: -1}, "ProduceTimeout"},
		{ingest.Config{Sources: sources, Brokers: []string{"x:1"}, ReadTimeout: -1}, "ReadTimeout"},
		{ingest.Config{Sources: sources, Brokers: []string{"x:1"}, HTTPServer: "nginx"}, "HTTPServer"},
	} {
		srv, err := ingest.New(c.cfg)
		if err == nil {
			srv.Close()
			t.Errorf("New accepted a config without a valid %s", c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("New error %q does not name %s", err, c.want)
		}
	}
}

// TestServeTimeouts: Run/Serve drop a client that is too slow to send its
// headers (ReadHeaderTimeout) or its body (ReadTimeout), so slow clients
// cannot hold connections; and Serve drains on cancel.
func TestServeTimeouts(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		const timeout = 300 * time.Millisecond
		srv, err := ingest.New(ingest.Config{
			HTTPServer: server, Sources: loadSources(t), Brokers: testenv.Kafka(t),
			ReadHeaderTimeout: timeout, ReadTimeout: 2 * timeout,
			Registerer: prometheus.NewRegistry(), Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		addr := strings.TrimPrefix(newServer(t, srv), "http://")

		// closedWithin sends partial, then reports how long the server took to
		// end the connection (answering 408 or just closing it).
		closedWithin := func(partial string) time.Duration {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, partial); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			rd := bufio.NewReader(conn)
			for {
				if _, err := rd.ReadByte(); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Fatalf("connection still open after 5s with %q sent", partial)
					}
					return time.Since(start)
				}
			}
		}
		if d := closedWithin("POST /webhooks/sw HTTP/1.1\r\nHost: x\r\nWebhook-Id: slow"); d < timeout/2 || d > 3*time.Second {
			t.Errorf("slow headers: connection ended after %v, want about %v", d, timeout)
		}
		if d := closedWithin("POST /webhooks/sw HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"type\":"); d < timeout || d > 4*time.Second {
			t.Errorf("slow body: connection ended after %v, want about %v", d, 2*timeout)
		}
		// The server still answers normal requests.
		checkGet(t, "http://"+addr+"/healthz", http.StatusOK, "/healthz")
	})
}

// TestOtherRoutesDoNotReadBodies: a request with a large body to a route
// other than the webhooks' (here POST /healthz, 100 MiB announced, 64 KiB
// sent) is answered at once without its body being read: no route but the
// webhooks' takes a body, and none may buffer one.
func TestOtherRoutesDoNotReadBodies(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		conn, err := net.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		req := "POST /healthz HTTP/1.1\r\nHost: ingest\r\nContent-Length: 104857600\r\n\r\n" + strings.Repeat("x", 64<<10)
		go func() { _, _ = io.WriteString(conn, req) }() // the rest never comes
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer within 5s: %v (the server waits for the body)", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST /healthz: %d, want 405", resp.StatusCode)
		}
	})
}
