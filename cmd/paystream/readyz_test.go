package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestMetricsListenerReadyz: the operator's listener of processor and sink
// answers /readyz from the component's readiness check (Postgres answers),
// 503 with the reason while it fails, and /healthz regardless.
func TestMetricsListenerReadyz(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()

	var down atomic.Bool
	ready := func(context.Context) error {
		if down.Load() {
			return errors.New("postgres: connection refused")
		}
		return nil
	}
	e := &env{log: slog.New(slog.DiscardHandler), reg: newRegistry()}
	serveMetricsOn(t.Context(), e, ln, ready)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz while ready = %d, want 200", code)
	}
	down.Store(true)
	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "connection refused") {
		t.Fatalf("/readyz while Postgres is down = %d %q, want 503 naming the cause", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while not ready = %d, want 200 (the process is up)", code)
	}
}
