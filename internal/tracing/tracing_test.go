package tracing

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestTracerOffForNoop: nil and the no-op provider mean tracing off; an SDK
// provider gives a tracer.
func TestTracerOffForNoop(t *testing.T) {
	if Tracer(nil, "x") != nil || Tracer(noop.NewTracerProvider(), "x") != nil {
		t.Fatal("a tracer for a nil or no-op provider, want nil")
	}
	if Tracer(sdktrace.NewTracerProvider(), "x") == nil {
		t.Fatal("no tracer for an SDK provider")
	}
}

// TestStateHeadersRoundTrip: a span's context written as state event
// headers reads back, once they are a Kafka record's, as the same context;
// a context without a span writes no header.
func TestStateHeadersRoundTrip(t *testing.T) {
	if h := StateHeaders(context.Background()); h != nil {
		t.Fatalf("headers %v without a span, want none", h)
	}
	ctx, span := sdktrace.NewTracerProvider().Tracer("x").Start(context.Background(), "batch")
	defer span.End()
	var rec []kgo.RecordHeader
	for _, h := range StateHeaders(ctx) {
		rec = append(rec, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if len(rec) != 1 || rec[0].Key != "traceparent" {
		t.Fatalf("headers %v, want one traceparent", rec)
	}
	if got, want := RecordContext(rec), span.SpanContext().WithRemote(true); !got.Equal(want) {
		t.Fatalf("read back %v, want %v", got, want)
	}
}
