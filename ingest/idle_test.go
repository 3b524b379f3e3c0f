package ingest_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/testenv"
)

// idleClientsEnv tells TestIdleClientsHelper, run as a child process, where
// to connect and how many connections to hold: "addr n".
const idleClientsEnv = "PAYSTREAM_TEST_IDLE_CLIENTS"

// TestIdleConnectionsMemory: 20,000 clients each open a keep-alive
// connection to ingest, send one request (GET /healthz) and go idle. Ingest
// holds at most MaxConns of them (10,000, the default), each new one past
// it closing the longest-idle, its heap and goroutine stacks grow by less
// than 480 MiB (measured: about 20 KiB per connection held on net/http, 28
// on fasthttp under the race detector), and a gateway's webhook on a new
// connection is still answered 200. Before the cap and the smaller read
// buffer, ingest held every connection, fasthttp with a 64 KiB read buffer
// each: 1.5 GiB for 19,982 (RLIMIT_NOFILE 20,000 stopped the rest), and
// the gateway could not connect.
//
// The clients live in two child processes (this test binary, running
// TestIdleClientsHelper), so that this process, whose memory is measured,
// holds only ingest's end of each connection. Not parallel: no other test
// runs while it measures.
func TestIdleConnectionsMemory(t *testing.T) {
	testenv.SkipIfShort(t)
	const clients, children = 20000, 2
	const bound = 480 << 20 // heap + stacks
	// Ingest's ends of the connections and each child's: raise the limit
	// as far as allowed (the children inherit it).
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	if need := uint64(max(clients/children, ingest.DefaultMaxConns) + 1000); lim.Cur < need {
		t.Fatalf("RLIMIT_NOFILE %d (hard %d): the test needs %d open files in each process", lim.Cur, lim.Max, need)
	}
	for _, server := range servers {
		t.Run(strings.ReplaceAll(server, "/", ""), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			b := setup(t, server, func(c *ingest.Config) { c.Registerer, c.ServeMetrics = reg, false })
			addr := strings.TrimPrefix(b.url, "http://")
			before := heapAndStacks()
			rss0 := rss(t)

			var served, failed atomic.Int64
			var wg sync.WaitGroup
			for range children {
				cmd := exec.Command(os.Args[0], "-test.run=^TestIdleClientsHelper$", "-test.count=1")
				cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", idleClientsEnv, addr, clients/children))
				stdin, err := cmd.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				stdout, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					stdin.Close() // the child closes its connections and exits
					if err := cmd.Wait(); err != nil {
						t.Errorf("idle clients: %v", err)
					}
				})
				wg.Go(func() {
					sc := bufio.NewScanner(stdout)
					for sc.Scan() {
						var ok, bad int64
						if _, err := fmt.Sscanf(sc.Text(), "idle clients: %d served, %d failed", &ok, &bad); err == nil {
							served.Add(ok)
							failed.Add(bad)
							go func() { _, _ = io.Copy(io.Discard, stdout) }()
							return
						}
					}
					t.Errorf("idle clients exited without reporting: %v", sc.Err())
				})
			}
			wg.Wait()

			mfs := gather(t, reg)
			held, _ := metricValue(mfs, "paystream_ingest_connections_open", nil)
			closed, _ := metricValue(mfs, "paystream_ingest_connections_at_limit_total", map[string]string{"action": "closed_idle"})
			refused, _ := metricValue(mfs, "paystream_ingest_connections_at_limit_total", map[string]string{"action": "refused"})
			after := heapAndStacks()
			grew := after - before
			t.Logf("%s: %d clients (%d served, %d failed): %v connections held, %v longest-idle closed, %v refused; heap + stacks grew %.1f MiB (%.1f KiB per connection held), RSS %.1f MiB",
				server, clients, served.Load(), failed.Load(), held, closed, refused, float64(grew)/(1<<20), float64(grew)/1024/max(held, 1), float64(rss(t)-rss0)/(1<<20))
			if served.Load() != clients {
				t.Errorf("%d of %d clients served, want all (each request answered before its connection went idle)", served.Load(), clients)
			}
			if held > ingest.DefaultMaxConns {
				t.Errorf("%v connections held, want at most %d", held, ingest.DefaultMaxConns)
			}
			if grew > bound {
				t.Errorf("heap + stacks grew %d MiB, want under %d MiB", grew>>20, bound>>20)
			}
			now := time.Now()
			if resp, body := b.post(t, paidWebhook(t, "msg_idle_"+uniq(), "pay_idle_"+uniq(), now)); resp.StatusCode != http.StatusOK {
				t.Errorf("gateway with %v idle connections open: %d %s, want 200", held, resp.StatusCode, body)
			}
		})
	}
}

// heapAndStacks is the process's heap and goroutine stacks in use, after
// a collection.
func heapAndStacks() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse + ms.StackInuse)
}

// rss is the process's resident set, from /proc (0 elsewhere).
func rss(t testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Log("no VmRSS in /proc/self/status")
	return 0
}

// TestIdleClientsHelper is TestIdleConnectionsMemory's child process, not a
// test: it opens n keep-alive connections to addr, sends GET /healthz on
// each and reads the answer, prints how many were served, and holds the
// connections idle until its standard input closes.
func TestIdleClientsHelper(t *testing.T) {
	spec := os.Getenv(idleClientsEnv)
	if spec == "" {
		t.Skip("the child process of TestIdleConnectionsMemory")
	}
	var addr string
	var n int
	if _, err := fmt.Sscanf(spec, "%s %d", &addr, &n); err != nil {
		t.Fatalf("%s=%q: %v", idleClientsEnv, spec, err)
	}
	conns := make([]net.Conn, n)
	var served, failed atomic.Int64
	next := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range next {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					failed.Add(1)
					continue
				}
				conns[i] = c
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: ingest\r\n\r\n"); err != nil {
					failed.Add(1)
					continue
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				_ = c.SetDeadline(time.Time{})
				if resp.StatusCode == http.StatusOK {
					served.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	fmt.Printf("idle clients: %d served, %d failed\n", served.Load(), failed.Load())
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}
