package ingest_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/paystream/paystream/ingest"
)

// discardWriter is a reusable http.ResponseWriter that keeps only the
// status, so the benchmark measures the handler, not a recorder.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

// BenchmarkWebhook runs ingest's handler, signature check to broker
// acknowledgement, on the real broker, from 16×GOMAXPROCS goroutines.
// ns/op is wall time per webhook over all goroutines (broker included);
// allocs/op and B/op are the handler's and the producer's. cpu-µs/op is the
// CPU the whole test process spent per webhook (handler, producer, the
// benchmark's own request building, GC): unlike ns/op it moves little when
// other work shares the machine, so it is the number to compare.
func BenchmarkWebhook(b *testing.B) {
	bn := setup(b, ingest.HTTPServerNet, nil)
	h := bn.srv.Handler()
	now := time.Now()
	w := signedStandard(b, "sw", swSecret, "msg_bench", now, paidBody("pay_bench", now))
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	cpuBefore := processCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		dw := &discardWriter{h: http.Header{}}
		// Each request is a copy of one parsed request with a fresh body:
		// what net/http's own parsing costs is not the handler's.
		tmpl := httptest.NewRequest(http.MethodPost, "/webhooks/sw", nil)
		tmpl.Header = w.header
		tmpl.ContentLength = int64(len(w.body))
		for pb.Next() {
			req := new(http.Request)
			*req = *tmpl // shallow: headers shared, as before
			req.Body = io.NopCloser(bytes.NewReader(w.body))
			clear(dw.h)
			h.ServeHTTP(dw, req)
			if dw.code != http.StatusOK {
				b.Fatalf("status %d", dw.code)
			}
		}
	})
	b.ReportMetric(float64((processCPU(b)-cpuBefore).Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkWebhookFast is BenchmarkWebhook on fasthttp's handler: the
// same webhook, to broker acknowledgement, through the route Serve runs by
// default (each request is a copy of one parsed request, as there).
func BenchmarkWebhookFast(b *testing.B) {
	bn := setup(b, ingest.HTTPServerFast, nil)
	h := bn.srv.FastHandler()
	now := time.Now()
	w := signedStandard(b, "sw", swSecret, "msg_bench", now, paidBody("pay_bench", now))
	var tmpl fasthttp.Request
	tmpl.Header.SetMethod(http.MethodPost)
	tmpl.SetRequestURI("/webhooks/sw")
	for k, vs := range w.header {
		for _, v := range vs {
			tmpl.Header.Add(k, v)
		}
	}
	tmpl.SetBody(w.body)
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	cpuBefore := processCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		var ctx fasthttp.RequestCtx
		for pb.Next() {
			ctx.Init(&tmpl, addr, nil)
			h(&ctx)
			if code := ctx.Response.StatusCode(); code != http.StatusOK {
				b.Fatalf("status %d: %s", code, ctx.Response.Body())
			}
		}
	})
	b.ReportMetric(float64((processCPU(b)-cpuBefore).Microseconds())/float64(b.N), "cpu-µs/op")
}

// processCPU returns the user and system CPU time the process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
