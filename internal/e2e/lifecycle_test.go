package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/testenv"
)

// answer is what one webhook request of the load got.
type answer struct {
	id      string
	status  int   // 0 when the request failed
	err     error // the transport error, if any
	refused bool  // the connection was refused: the listener was closed
	at      time.Time
}

// TestIngestSIGTERMDrains sends SIGTERM to `paystream ingest` (the binary)
// while 16 clients post signed webhooks as fast as it answers, and checks
// the drain: /readyz answers 503 first while webhooks are still answered
// 200 during --shutdown-grace; no answer is a 5xx other than 503, and no
// 503 comes before the signal; the process exits 0; and every webhook
// answered 2xx is on the raw topic exactly once. Connections refused once
// the listener closed are counted apart, as are other transport errors
// (a request racing the close of its idle keep-alive connection): neither
// was answered, so the gateway retries.
func TestIngestSIGTERMDrains(t *testing.T) {
	testenv.SkipIfShort(t)
	eachHTTPServer(t, func(t *testing.T, server string) {
		brokers := testenv.Kafka(t)
		raw, dlq := testenv.Topic(t, "raw", 3), testenv.Topic(t, "dlq", 1)
		sources := acmeSources(t, t.TempDir())
		addr := testenv.FreeAddr(t)
		base := "http://" + addr
		const grace = 2 * time.Second
		cmd := exec.Command(binary, "ingest", "--kafka-brokers", strings.Join(brokers, ","), "--raw-topic", raw, "--dlq-topic", dlq,
			"--sources", sources, "--http-addr", addr, "--metrics-addr", "127.0.0.1:0", "--shutdown-grace", grace.String(), "--http-server", server, "--log-format", "json")
		cmd.Env = testenv.Environ()
		ing := testenv.StartProcess(t, "paystream ingest", cmd, 0)
		exited := ing.Done()
		ing.WaitHTTP(t, base+"/readyz", time.Minute)

		// Readiness, polled on fresh connections until the process exits: when
		// it first answered 503.
		var notReadyAt atomic.Pointer[time.Time]
		var watch sync.WaitGroup
		watch.Go(func() {
			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for {
				select {
				case <-exited:
					return
				case <-time.After(5 * time.Millisecond):
				}
				resp, err := client.Get(base + "/readyz")
				if err != nil {
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable && notReadyAt.Load() == nil {
					now := time.Now()
					notReadyAt.Store(&now)
				}
			}
		})

		// The load: each client posts unique webhooks on keep-alive
		// connections until the process exited.
		var (
			mu      sync.Mutex
			answers []answer
			ok      atomic.Int64
			load    sync.WaitGroup
		)
		for c := range 16 {
			load.Go(func() {
				client := &http.Client{Timeout: 30 * time.Second}
				for n := 0; ; n++ {
					select {
					case <-exited:
						return
					default:
					}
					a := postWebhook(client, base, fmt.Sprintf("msg_%d_%d", c, n))
					if a.status == http.StatusOK {
						ok.Add(1)
					}
					mu.Lock()
					answers = append(answers, a)
					mu.Unlock()
				}
			})
		}
		testenv.Eventually(t, time.Minute, func() bool { return ok.Load() >= 500 }, "500 webhooks answered 200 before SIGTERM")

		signaled := time.Now()
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Fatalf("paystream ingest still running a minute after SIGTERM")
		}
		exitedAt := time.Now()
		load.Wait()
		watch.Wait()
		if err := ing.Err(); err != nil {
			t.Errorf("paystream ingest after SIGTERM: %v, want exit status 0", err)
		}

		notReady := notReadyAt.Load()
		if notReady == nil {
			t.Fatalf("/readyz never answered 503 during the drain")
		}
		var before, during, refused, otherErrs, unavailable int
		accepted := map[string]bool{}
		for _, a := range answers {
			switch {
			case a.refused:
				refused++
			case a.err != nil:
				otherErrs++
				t.Logf("transport error (not refused) at +%s: %v", a.at.Sub(signaled).Round(time.Millisecond), a.err)
			case a.status == http.StatusOK:
				accepted[a.id] = true
				if a.at.After(*notReady) {
					during++
				} else {
					before++
				}
			case a.status == http.StatusServiceUnavailable:
				unavailable++
				if a.at.Before(signaled) {
					t.Errorf("webhook %s answered 503 before SIGTERM", a.id)
				}
			default:
				t.Errorf("webhook %s answered %d, want 200 or (draining) 503", a.id, a.status)
			}
		}
		if during == 0 {
			t.Errorf("no webhook answered 200 after /readyz dropped: the grace did not keep serving")
		}

		// Every webhook answered 200 is on the raw topic exactly once.
		onTopic := map[string]int{}
		for _, r := range testenv.ReadCommitted(t, brokers, raw) {
			env, err := envelope.DecodeRaw(r.Value)
			if err != nil {
				t.Fatalf("raw record %d/%d: %v", r.Partition, r.Offset, err)
			}
			onTopic[env.Event.EventID]++
		}
		lost, dup := 0, 0
		for id := range accepted {
			switch onTopic[id] {
			case 0:
				lost++
			case 1:
			default:
				dup++
			}
		}
		if lost > 0 || dup > 0 {
			t.Errorf("of %d webhooks answered 200: %d not on the raw topic, %d on it more than once", len(accepted), lost, dup)
		}

		drained := drainedLog(t, ing.Output.String())
		t.Logf("SIGTERM → /readyz 503 after %s; exit after %s (grace %s; server's drain %s, %d requests in flight at close)",
			notReady.Sub(signaled).Round(time.Millisecond), exitedAt.Sub(signaled).Round(time.Millisecond), grace,
			drained.duration.Round(time.Millisecond), drained.inFlight)
		t.Logf("answers: %d × 200 before readiness dropped, %d × 200 after (during the drain), %d × 503, %d refused, %d other transport errors; %d records on the raw topic for %d accepted webhooks",
			before, during, unavailable, refused, otherErrs, len(onTopic), len(accepted))
	})
}

// postWebhook posts one signed payment.paid webhook with id as its
// webhook-id and payment id.
func postWebhook(client *http.Client, base, id string) answer {
	now := time.Now()
	body := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":%q,"amount":1000,"currency":"BRL"}}`,
		now.UTC().Format(time.RFC3339), id)
	req, err := signedRequest(base, "acme", id, now, body)
	if err != nil {
		return answer{id: id, err: err, at: time.Now()}
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{id: id, err: err, refused: errors.Is(err, syscall.ECONNREFUSED), at: time.Now()}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return answer{id: id, status: resp.StatusCode, at: time.Now()}
}

// drained is what ingest's "ingest drained" log line says.
type drained struct {
	duration time.Duration
	inFlight int64
}

// drainedLog finds ingest's "ingest drained" line in its JSON logs.
func drainedLog(t *testing.T, logs string) drained {
	t.Helper()
	for line := range strings.Lines(logs) {
		var l struct {
			Msg      string  `json:"msg"`
			Seconds  float64 `json:"seconds"`
			InFlight int64   `json:"in_flight_at_close"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "ingest drained" {
			return drained{duration: time.Duration(l.Seconds * float64(time.Second)), inFlight: l.InFlight}
		}
	}
	t.Errorf("ingest logged no \"ingest drained\" line")
	return drained{}
}

// eachHTTPServer runs f as a parallel subtest for each HTTP server `paystream
// ingest --http-server` offers.
func eachHTTPServer(t *testing.T, f func(t *testing.T, server string)) {
	t.Parallel()
	for _, server := range []string{ingest.HTTPServerNet, ingest.HTTPServerFast} {
		t.Run(strings.ReplaceAll(server, "/", ""), func(t *testing.T) {
			t.Parallel()
			f(t, server)
		})
	}
}
