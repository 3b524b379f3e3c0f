package testenv

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a command a test runs as a subprocess, its stdout and stderr
// kept together in Output.
type Process struct {
	Name   string
	Cmd    *exec.Cmd
	Output *SyncBuffer
	// LogTail, when above 0, limits the output logged for a failed test
	// to its last LogTail bytes (for a chatty process). Defaults to 0: all.
	LogTail int

	done chan struct{} // closed once the process exited
	err  error         // Cmd.Wait's result, set before done closes
}

// StartProcess starts cmd, its stdout and stderr written to the returned
// Process's Output, killed (SIGKILL) if the test binary dies first. When the
// test ends, a process still running gets SIGTERM and, grace later, SIGKILL
// (grace 0: SIGKILL at once); if the test failed its output is logged,
// under name.
func StartProcess(t testing.TB, name string, cmd *exec.Cmd, grace time.Duration) *Process {
	t.Helper()
	p := &Process{Name: name, Cmd: cmd, Output: &SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Output, p.Output
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if p.Exited() == nil {
			if grace > 0 {
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
			select {
			case <-p.done:
			case <-time.After(grace):
				_ = cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			out := p.Output.String()
			if p.LogTail > 0 && len(out) > p.LogTail {
				out = "…" + out[len(out)-p.LogTail:]
			}
			t.Logf("%s output:\n%s", name, out)
		}
	})
	return p
}

// Done is closed once the process exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is Cmd.Wait's result once [Process.Done] is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Exited returns nil while the process runs and, once it exited, an error
// saying so with its exit status: for wait loops that must stop when the
// process they wait on died.
func (p *Process) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v)", p.Name, p.err)
	default:
		return nil
	}
}

// WaitHTTP waits until GET url answers 200 (a readiness probe), failing
// the test if the process exits first or timeout passes.
func (p *Process) WaitHTTP(t testing.TB, url string, timeout time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	WaitFor(t, timeout, func() error {
		if err := p.Exited(); err != nil {
			t.Fatalf("testenv: %v before GET %s answered 200", err, url)
		}
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	})
}

// Terminate sends SIGTERM and waits at most deadline for the exit. It fails
// the test unless the process exited with status 0 within it, with no data
// race and no panic in its output, and returns how long the exit took.
func (p *Process) Terminate(t testing.TB, deadline time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("%s: SIGTERM: %v", p.Name, err)
	}
	select {
	case <-p.done:
	case <-time.After(deadline):
		t.Fatalf("%s still running %s after SIGTERM", p.Name, deadline)
	}
	took := time.Since(start)
	if p.err != nil {
		t.Errorf("%s after SIGTERM: %v, want exit status 0", p.Name, p.err)
	}
	if out := p.Output.String(); strings.Contains(out, "DATA RACE") || strings.Contains(out, "panic:") {
		t.Errorf("%s reported a data race or a panic", p.Name)
	}
	return took
}

// Environ is the test process's environment without its PAYSTREAM_*
// settings (the stack's `env` exports some), plus extra ("KEY=value"): for
// a paystream subprocess configured by its flags and extra alone.
func Environ(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYSTREAM_") {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

// FreeAddr returns a loopback address ("127.0.0.1:port") with a port
// nothing listens on now, for a child process to listen on (FreePorts).
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePorts(t, 1)))
}

// FreePorts returns the first of n consecutive loopback ports nothing
// listens on now, for a child process to listen on.
//
// They are drawn below the kernel's ephemeral range (ephemeralLow), not
// asked of the kernel with ":0": between this check and the child's bind,
// the kernel hands ephemeral ports to every outgoing connection and ":0"
// listener on the machine — the tests running in parallel open thousands
// — and one of them taking the port made the child exit with "address
// already in use". Below the range only another FreePorts can take it,
// about one chance in ten thousand per pair of calls.
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	low := ephemeralLow()
	for range 100 {
		base := low - portSpan + rand.IntN(portSpan-n)
		if portsFree(base, n) {
			return base
		}
	}
	t.Fatalf("testenv: no %d free ports in a row in %d-%d after 100 draws", n, low-portSpan, low-1)
	return 0
}

// portsFree reports whether n ports from base can be listened on now.
func portsFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}

// portSpan is how many ports below the ephemeral range FreePorts draws
// from.
const portSpan = 10000

// ephemeralLow is the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), or Linux's default 32768 when it cannot
// be read or leaves no portSpan of unprivileged ports below it.
func ephemeralLow() int {
	const fallback = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return fallback
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return fallback
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil || low-portSpan < 1024 {
		return fallback
	}
	return low
}

// SyncBuffer is a bytes.Buffer safe for a process's writes and the test's
// reads at once.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
