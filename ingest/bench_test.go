package ingest_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
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
// allocs/op and B/op are the handler's and the producer's.
func BenchmarkWebhook(b *testing.B) {
	bn := setup(b, nil)
	h := bn.srv.Handler()
	now := time.Now()
	w := signedStandard(b, "sw", swSecret, "msg_bench", now, paidBody("pay_bench", now))
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dw := &discardWriter{h: http.Header{}}
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/webhooks/sw", bytes.NewReader(w.body))
			req.Header = w.header
			clear(dw.h)
			h.ServeHTTP(dw, req)
			if dw.code != http.StatusOK {
				b.Fatalf("status %d", dw.code)
			}
		}
	})
}
