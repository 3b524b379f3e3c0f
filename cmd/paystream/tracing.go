package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracingShutdownTimeout bounds the flush of the spans still buffered at exit.
const tracingShutdownTimeout = 5 * time.Second

// startTracing returns the tracer provider of a service command and the
// function that flushes and stops it on exit. Tracing is on when
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set: spans are batched and exported with OTLP over HTTP, configured by the
// standard OTEL_EXPORTER_OTLP_* variables (headers, timeout, TLS),
// sampled per OTEL_TRACES_SAMPLER (default: every trace) and named
// OTEL_SERVICE_NAME, else service. Otherwise it is the no-op provider, with
// which the components trace nothing.
func startTracing(ctx context.Context, log *slog.Logger, service string) (trace.TracerProvider, func(), error) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return noop.NewTracerProvider(), func() {}, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	name := cmp.Or(os.Getenv("OTEL_SERVICE_NAME"), service)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
	)
	log.Info("tracing on: exporting spans with OTLP over HTTP", "service", name)
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: spans not flushed at exit", "error", err)
		}
	}, nil
}

// kafkaMetrics registers, on reg, franz-go's client metrics (kprom:
// connections, bytes and records produced and fetched, request latencies,
// buffered records, by broker and topic) of the one Kafka client it is
// given to, as paystream_{component}_kafka_*. Each client needs its own:
// two live clients of one component would register the same names.
func kafkaMetrics(reg prometheus.Registerer, component string) kgo.Opt {
	return kgo.WithHooks(kprom.NewMetrics("paystream", kprom.Registerer(reg), kprom.Subsystem(component+"_kafka")))
}
