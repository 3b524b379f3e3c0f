package ingest_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/testenv"
)

// slowClient is an unauthenticated client sending a webhook body slowly:
// it announces a body of announce bytes, sends prefix of them at once, then
// one more byte every trickle (never, when trickle is zero), until the
// server answers or closes, or the test ends.
type slowClient struct {
	conn   net.Conn
	status atomic.Int32 // the server's answer, 0 while none
	done   chan struct{}
}

// startSlow opens a slowClient to addr's POST /webhooks/{source}, forged
// (its signature is not the source's), so nothing it sends is authentic.
func startSlow(t testing.TB, addr, source string, announce, prefix int, trickle time.Duration) *slowClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &slowClient{conn: conn, done: make(chan struct{})}
	head := fmt.Sprintf("POST /webhooks/%s HTTP/1.1\r\nHost: ingest\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"+
		"%s: msg_slow_%s\r\n%s: %d\r\n%s: v1,Zm9yZ2VkIHNpZ25hdHVyZQ==\r\n\r\n", source, announce,
		standardwebhooks.HeaderID, uniq(), standardwebhooks.HeaderTimestamp, time.Now().Unix(), standardwebhooks.HeaderSignature)
	body := []byte(`{"type":"payment.paid","pad":"` + strings.Repeat("x", prefix) + `"}`)[:prefix]
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		if _, err := conn.Write(append([]byte(head), body...)); err != nil || trickle == 0 {
			return
		}
		tk := time.NewTicker(trickle)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				if _, err := conn.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	})
	wg.Go(func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			c.status.Store(int32(resp.StatusCode))
			resp.Body.Close()
		}
		close(stop) // answered or closed: nothing more to send
		close(c.done)
	})
	t.Cleanup(func() {
		conn.Close()
		wg.Wait()
	})
	return c
}

// gather returns what reg holds, keyed as scrape keys it.
func gather(t testing.TB, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// postSigned posts n signed webhooks to b one after another, pause apart,
// and counts the answers by status.
func postSigned(t *testing.T, b *bench, n int, pause time.Duration) map[int]int {
	t.Helper()
	codes := map[int]int{}
	for range n {
		now := time.Now()
		resp, _ := b.post(t, paidWebhook(t, "msg_gw_"+uniq(), "pay_gw_"+uniq(), now))
		codes[resp.StatusCode]++
		time.Sleep(pause)
	}
	return codes
}

// TestSlowBodiesDoNotStarveGateways: 500 unauthenticated clients each
// announce a 1 MiB body (the source's max_body_bytes), send 9,000 bytes of
// it (past the 8 KiB fasthttp reads before the handler runs) and then a
// byte every half second, while a signed gateway posts 40 webhooks: each
// is answered 200, with the caps at their defaults. Before bodies were
// charged as their bytes arrive, each slow request held its announced
// megabyte of MaxBufferedBodyBytes (256 MiB) from its headers on: 256 of
// them took it all, and every gateway webhook was answered 503.
func TestSlowBodiesDoNotStarveGateways(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		const slow, gateway = 500, 40
		b := setup(t, server, func(c *ingest.Config) { c.ReadTimeout = time.Minute }) // the test outlasts the default 15s
		addr := strings.TrimPrefix(b.url, "http://")
		for range slow {
			startSlow(t, addr, "sw", 1<<20, 9000, 500*time.Millisecond)
		}
		// Each slow request is being read or was turned away.
		testenv.Eventually(t, 30*time.Second, func() bool {
			mfs := scrape(t, b.url)
			reading, _ := metricValue(mfs, "paystream_ingest_reading_requests", nil)
			over, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "overloaded"})
			return reading+over >= slow
		}, "%d slow requests being read or answered", slow)

		codes := postSigned(t, b, gateway, 50*time.Millisecond)
		mfs := scrape(t, b.url)
		reading, _ := metricValue(mfs, "paystream_ingest_reading_requests", nil)
		held, _ := metricValue(mfs, "paystream_ingest_buffered_body_bytes", nil)
		refused, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": "sw", "outcome": "overloaded"})
		t.Logf("%d slow unauthenticated bodies of 1 MiB announced: %v being read, holding %.0f bytes of the cap; %v answered 503; %d signed webhooks meanwhile: %v",
			slow, reading, held, refused, gateway, codes)
		if codes[http.StatusOK] != gateway {
			t.Errorf("signed webhooks answered %v, want %d × 200", codes, gateway)
		}
		if reading < slow {
			t.Errorf("%v requests being read after the gateway's, want the %d slow ones still there", reading, slow)
		}
	})
}

// TestSlowBodiesFillingCaps: slow unauthenticated bodies beyond a cap —
// 100 bodies trickling a byte a second with MaxInFlight at 40, or 30
// clients sending 200 KiB and stalling (reconnecting once answered) with
// MaxBufferedBodyBytes at 4 MiB — while a signed gateway posts 15
// webhooks: each is answered 200. A body still arriving takes no place in
// flight, and a body within 8 KiB charges nothing. Before, a request took
// its place in flight and its announced length of the cap from its headers
// on, and each of these webhooks was answered 503.
func TestSlowBodiesFillingCaps(t *testing.T) {
	cases := []struct {
		name      string
		cfg       func(*ingest.Config)
		attackers int
		prefix    int
		trickle   time.Duration
		// full says the attack holds the cap.
		full func(mfs map[string]*dto.MetricFamily) bool
	}{
		{
			name:      "in flight",
			cfg:       func(c *ingest.Config) { c.MaxInFlight = 40 },
			attackers: 100, prefix: 9000, trickle: time.Second, // 9000: past fasthttp's read-ahead, the handler runs
			full: func(mfs map[string]*dto.MetricFamily) bool {
				reading, _ := metricValue(mfs, "paystream_ingest_reading_requests", nil)
				over, _ := metricValue(mfs, "paystream_ingest_overload_rejections_total", map[string]string{"limit": "in_flight"})
				return reading+over >= 100
			},
		},
		{
			name:      "body bytes",
			cfg:       func(c *ingest.Config) { c.MaxBufferedBodyBytes = 4 << 20 },
			attackers: 30, prefix: 200 << 10, // each a 256 KiB buffer: 16 fill the cap
			full: func(mfs map[string]*dto.MetricFamily) bool {
				held, _ := metricValue(mfs, "paystream_ingest_buffered_body_bytes", nil)
				over, _ := metricValue(mfs, "paystream_ingest_overload_rejections_total", map[string]string{"limit": "body_bytes"})
				return held >= 3<<20 && over >= 1
			},
		},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			eachServer(t, func(t *testing.T, server string) {
				const gateway = 15
				b := setup(t, server, func(cfg *ingest.Config) {
					cfg.ReadTimeout = time.Minute
					c.cfg(cfg)
				})
				addr := strings.TrimPrefix(b.url, "http://")
				// Attackers: each reconnects once answered, a little later.
				stop := make(chan struct{})
				var answered sync.Map // status → *atomic.Int64
				var wg sync.WaitGroup
				for range c.attackers {
					wg.Go(func() {
						for {
							sc := startSlow(t, addr, "sw", 1<<20, c.prefix, c.trickle)
							select {
							case <-stop:
								return
							case <-sc.done:
							}
							n, _ := answered.LoadOrStore(sc.status.Load(), new(atomic.Int64))
							n.(*atomic.Int64).Add(1)
							select {
							case <-stop:
								return
							case <-time.After(100 * time.Millisecond):
							}
						}
					})
				}
				defer func() { close(stop); wg.Wait() }()
				testenv.Eventually(t, 30*time.Second, func() bool { return c.full(scrape(t, b.url)) }, "the attackers holding the cap")

				codes := postSigned(t, b, gateway, 100*time.Millisecond)
				mfs := scrape(t, b.url)
				reading, _ := metricValue(mfs, "paystream_ingest_reading_requests", nil)
				held, _ := metricValue(mfs, "paystream_ingest_buffered_body_bytes", nil)
				attackers := map[int32]int64{}
				answered.Range(func(k, v any) bool { attackers[k.(int32)] = v.(*atomic.Int64).Load(); return true })
				t.Logf("%d attackers: %v bodies being read holding %.0f bytes of the cap, attackers answered %v (0: none yet); %d signed webhooks meanwhile: %v",
					c.attackers, reading, held, attackers, gateway, codes)
				if codes[http.StatusOK] != gateway {
					t.Errorf("signed webhooks answered %v, want %d × 200", codes, gateway)
				}
				if !c.full(mfs) {
					t.Errorf("the attackers no longer held the cap after the gateway's webhooks")
				}
			})
		})
	}
}

// TestConnectionCap: with MaxConns connections open and idle, a gateway's
// new connection closes the longest-idle one and its webhook is answered
// 200; with MaxConns connections all serving requests, a new connection is
// answered 503 with Retry-After and closed. Before the cap, connections
// were unbounded: each idle one kept a 64 KiB read buffer on fasthttp.
func TestConnectionCap(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		const maxConns = 20
		reg := prometheus.NewRegistry()
		b := setup(t, server, func(c *ingest.Config) {
			c.MaxConns, c.Registerer, c.ReadTimeout = maxConns, reg, time.Minute
		})
		addr := strings.TrimPrefix(b.url, "http://")
		connsOpen := func() float64 {
			v, _ := metricValue(gather(t, reg), "paystream_ingest_connections_open", nil)
			return v
		}

		// maxConns idle keep-alive connections, each after one request.
		healthz := func(c net.Conn) {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: ingest\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		idle := make([]net.Conn, maxConns)
		for i := range idle {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			healthz(c)
			idle[i] = c
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return connsOpen() == maxConns }, "%d connections open", maxConns)
		// The server marks a connection idle after the client has read its
		// answer, so back-to-back requests can be marked out of order: a
		// second request on every other connection leaves idle[0] the
		// longest-idle by far.
		for _, c := range idle[1:] {
			healthz(c)
		}

		// A gateway on a connection of its own gets in.
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		gw := &http.Client{Transport: tr}
		now := time.Now()
		w := paidWebhook(t, "msg_cap_"+uniq(), "pay_cap_"+uniq(), now)
		req, err := http.NewRequest(http.MethodPost, b.url+"/webhooks/sw", strings.NewReader(string(w.body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = w.header
		resp, err := gw.Do(req)
		if err != nil {
			t.Fatalf("gateway with %d idle connections open: %v", maxConns, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("gateway with %d idle connections open: %d, want 200", maxConns, resp.StatusCode)
		}
		// The longest-idle connection was the one closed.
		_ = idle[0].SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := idle[0].Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("the longest-idle connection is still open (read %d, %v)", n, err)
		}
		_ = idle[1].SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := idle[1].Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("the second connection was closed too: %v", err)
		}

		// Every connection busy: a new one is refused.
		tr.CloseIdleConnections()
		for _, c := range idle {
			c.Close()
		}
		for range maxConns {
			startSlow(t, addr, "sw", 1<<20, 9000, 0)
		}
		testenv.Eventually(t, 10*time.Second, func() bool {
			v, _ := metricValue(gather(t, reg), "paystream_ingest_reading_requests", nil)
			return v == maxConns && connsOpen() == maxConns
		}, "%d slow requests being read on %d connections", maxConns, maxConns)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err = http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("connection over the cap: %v, want a 503", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "too many connections") {
			t.Errorf("connection over the cap: %d Retry-After %q %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}

		mfs := gather(t, reg)
		for _, m := range []struct {
			labels map[string]string
			want   float64
		}{
			{map[string]string{"action": "closed_idle"}, 1},
			{map[string]string{"action": "refused"}, 1},
		} {
			if v, _ := metricValue(mfs, "paystream_ingest_connections_at_limit_total", m.labels); v < m.want {
				t.Errorf("paystream_ingest_connections_at_limit_total%v = %v, want ≥ %v", m.labels, v, m.want)
			}
		}
		if v := connsOpen(); v > maxConns {
			t.Errorf("%v connections open, cap %d", v, maxConns)
		}
	})
}
