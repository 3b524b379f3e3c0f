package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/paystream/paystream/internal/testenv"
)

// TestStartTracingOffWithoutEndpoint: with no OTLP endpoint in the
// environment the provider is the no-op one, which the components take as
// tracing off.
func TestStartTracingOffWithoutEndpoint(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	tp, stop, err := startTracing(t.Context(), slog.New(slog.DiscardHandler), "paystream-test")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, ok := tp.(noop.TracerProvider); !ok {
		t.Fatalf("provider %T, want noop.TracerProvider", tp)
	}
}

// TestStartTracingExportsToEndpoint: with OTEL_EXPORTER_OTLP_ENDPOINT set,
// a span ended before exit reaches the endpoint as an OTLP/HTTP export
// when the shutdown function flushes.
func TestStartTracingExportsToEndpoint(t *testing.T) {
	var exports atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			if b, _ := io.ReadAll(r.Body); len(b) > 0 {
				exports.Add(1)
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")

	tp, stop, err := startTracing(t.Context(), slog.New(slog.DiscardHandler), "paystream-test")
	if err != nil {
		t.Fatal(err)
	}
	_, span := tp.Tracer("test").Start(t.Context(), "work")
	span.End()
	stop()
	if n := exports.Load(); n == 0 {
		t.Fatal("no OTLP export reached the endpoint after shutdown")
	}
}

// TestKafkaMetricsOnRegistry: a client given kafkaMetrics reports its
// broker connections on the injected registry as
// paystream_{component}_kafka_*, and unregisters them when closed, so the
// component's next client can register again.
func TestKafkaMetricsOnRegistry(t *testing.T) {
	brokers := testenv.Kafka(t)
	reg := prometheus.NewRegistry()
	for range 2 {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kafkaMetrics(reg, "ingest"))
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Ping(t.Context()); err != nil {
			t.Fatal(err)
		}
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range families {
			if f.GetName() == "paystream_ingest_kafka_connects_total" && len(f.GetMetric()) > 0 {
				found = true
			}
		}
		cl.Close()
		if !found {
			t.Fatal("paystream_ingest_kafka_connects_total not on the registry after a ping")
		}
	}
}
