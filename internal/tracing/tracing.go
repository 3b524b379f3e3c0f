// Package tracing holds what paystream's components share to trace a
// webhook end to end with OpenTelemetry: whether tracing is on, the
// propagation format (W3C trace context: the traceparent and tracestate
// headers), and the conversions between a span's context and the headers
// of a Kafka record or a state event.
//
// Tracing is off when a component's TracerProvider is nil or OpenTelemetry's
// no-op provider: the component then starts no span and reads or writes no
// trace header, so it costs nothing.
package tracing

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/paystream/paystream/internal/statelog"
)

// Propagator is the format trace context travels in, between components
// and to the state topic's consumers: W3C trace context.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracer returns tp's tracer named name, or nil when tracing is off (tp is
// nil or a no-op provider).
func Tracer(tp trace.TracerProvider, name string) trace.Tracer {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	return tp.Tracer(name)
}

// RecordContext returns the span context a Kafka record's headers carry,
// invalid when they carry none.
func RecordContext(headers []kgo.RecordHeader) trace.SpanContext {
	return trace.SpanContextFromContext(Propagator.Extract(context.Background(), recordHeaders(headers)))
}

// StateHeaders returns the headers that carry ctx's span context on a
// state event, nil when ctx has no valid span context.
func StateHeaders(ctx context.Context) []statelog.Header {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	var c stateHeaders
	Propagator.Inject(ctx, &c)
	return c
}

// recordHeaders reads a Kafka record's headers as a propagation carrier.
type recordHeaders []kgo.RecordHeader

func (h recordHeaders) Get(key string) string {
	for _, rh := range h {
		if rh.Key == key {
			return string(rh.Value)
		}
	}
	return ""
}

func (recordHeaders) Set(string, string) {} // read only

func (h recordHeaders) Keys() []string {
	keys := make([]string, len(h))
	for i, rh := range h {
		keys[i] = rh.Key
	}
	return keys
}

// stateHeaders collects a state event's headers as a propagation carrier.
type stateHeaders []statelog.Header

func (h *stateHeaders) Get(key string) string {
	for _, sh := range *h {
		if sh.Key == key {
			return string(sh.Value)
		}
	}
	return ""
}

func (h *stateHeaders) Set(key, value string) {
	*h = append(*h, statelog.Header{Key: key, Value: []byte(value)})
}

func (h *stateHeaders) Keys() []string {
	keys := make([]string, len(*h))
	for i, sh := range *h {
		keys[i] = sh.Key
	}
	return keys
}
