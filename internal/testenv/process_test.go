package testenv

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestProcess(t *testing.T) {
	t.Parallel()
	t.Run("TerminateWaitsForTheExit", func(t *testing.T) {
		t.Parallel()
		// Exits 0 on SIGTERM after saying so.
		p := StartProcess(t, "sh", exec.Command("sh", "-c", `trap 'echo bye; exit 0' TERM; echo hi; while :; do sleep 0.05; done`), 0)
		WaitFor(t, 10*time.Second, func() error {
			if strings.Contains(p.Output.String(), "hi") {
				return nil
			}
			if err := p.Exited(); err != nil {
				return err
			}
			return errors.New("no output yet")
		})
		if err := p.Exited(); err != nil {
			t.Fatalf("Exited while running: %v", err)
		}
		p.Terminate(t, 10*time.Second)
		if err := p.Exited(); err == nil {
			t.Error("Exited = nil after the exit")
		}
		if out := p.Output.String(); out != "hi\nbye\n" {
			t.Errorf("output %q", out)
		}
	})
	t.Run("WaitHTTPStopsAtTheExit", func(t *testing.T) {
		t.Parallel()
		p := StartProcess(t, "false", exec.Command("false"), 0)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
		defer srv.Close()
		start := time.Now()
		fatals, _ := runFake(t, func(tb testing.TB) { p.WaitHTTP(tb, srv.URL, time.Minute) })
		if len(fatals) != 1 || !strings.Contains(fatals[0], "false exited") {
			t.Errorf("fatals = %q, want one saying the process exited", fatals)
		}
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("WaitHTTP gave up after %s, not at the exit", took)
		}
	})
	t.Run("ExitedReportsAFailedExit", func(t *testing.T) {
		t.Parallel()
		p := StartProcess(t, "false", exec.Command("false"), time.Second)
		<-p.Done()
		if p.Err() == nil || p.Exited() == nil {
			t.Errorf("false: Err %v, Exited %v; want both non-nil", p.Err(), p.Exited())
		}
	})
}

func TestEnvironDropsPaystreamSettings(t *testing.T) {
	t.Setenv("PAYSTREAM_TEST_X", "1")
	env := Environ("PAYSTREAM_Y=2")
	for _, kv := range env {
		if strings.HasPrefix(kv, "PAYSTREAM_TEST_X=") {
			t.Errorf("Environ kept %s", kv)
		}
	}
	if env[len(env)-1] != "PAYSTREAM_Y=2" {
		t.Errorf("Environ's last entry %q, want the extra one", env[len(env)-1])
	}
}
