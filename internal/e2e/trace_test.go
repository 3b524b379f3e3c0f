package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/internal/tracing"
)

// TestOneTraceFromWebhookToStateEvent: with tracing on, one webhook makes
// one trace across the pipeline, on the real broker and Postgres. Ingest's
// server span is the root; kotel's publish span is its child and its
// traceparent is on the raw record; the processor's batch span links to
// that publish span; the state record the sink relays carries the batch
// span's traceparent, so a consumer continues the trace.
func TestOneTraceFromWebhookToStateEvent(t *testing.T) {
	testenv.SkipIfShort(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })

	p := setup(t, pipelineOpts{partitions: 1, tracer: tp})

	now := time.Now()
	body := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_traced","amount":1050,"currency":"BRL"}}`,
		now.UTC().Format(time.RFC3339))
	if code := p.post(t, "acme", "msg_traced", now, body, nil); code != http.StatusOK {
		t.Fatalf("webhook: status %d, want 200", code)
	}
	state := consumeAll(t, p.brokers, p.state, 1, time.Minute)
	if len(state) != 1 {
		t.Fatalf("state records = %d, want 1", len(state))
	}

	// Spans end just after the work they time: the state record may be
	// read before the last of them ended.
	var server, publish, batch sdktrace.ReadOnlySpan
	testenv.Eventually(t, 30*time.Second, func() bool {
		server, publish, batch = nil, nil, nil
		for _, s := range spans.Ended() {
			switch s.SpanKind() {
			case trace.SpanKindServer:
				server = s
			case trace.SpanKindProducer:
				publish = s
			case trace.SpanKindConsumer:
				batch = s
			}
		}
		return server != nil && publish != nil && batch != nil
	}, "ingest, publish and batch spans ended")

	if server.Parent().IsValid() {
		t.Errorf("ingest span has parent %s, want a root", server.Parent().SpanID())
	}
	traceID := server.SpanContext().TraceID()
	if publish.Parent().SpanID() != server.SpanContext().SpanID() || publish.SpanContext().TraceID() != traceID {
		t.Errorf("publish span %s: parent %s, want the ingest span %s", publish.SpanContext().SpanID(), publish.Parent().SpanID(), server.SpanContext().SpanID())
	}
	raw := consumeAll(t, p.brokers, p.raw, 1, time.Minute)
	if len(raw) != 1 {
		t.Fatalf("raw records = %d, want 1", len(raw))
	}
	if sc := tracing.RecordContext(raw[0].Headers); !sc.Equal(publish.SpanContext().WithRemote(true)) {
		t.Errorf("raw record's traceparent names %s/%s, want the publish span %s/%s", sc.TraceID(), sc.SpanID(), traceID, publish.SpanContext().SpanID())
	}

	linked := false
	for _, l := range batch.Links() {
		if l.SpanContext.TraceID() == traceID && l.SpanContext.SpanID() == publish.SpanContext().SpanID() {
			linked = true
		}
	}
	if !linked {
		t.Errorf("batch span links %v, want one to the webhook's trace %s", batch.Links(), traceID)
	}
	sc := tracing.RecordContext(state[0].Headers)
	if !sc.IsValid() {
		t.Fatalf("state record headers %v: no valid traceparent", state[0].Headers)
	}
	if sc.TraceID() != batch.SpanContext().TraceID() || sc.SpanID() != batch.SpanContext().SpanID() {
		t.Errorf("state record's traceparent names %s/%s, want the batch span %s/%s",
			sc.TraceID(), sc.SpanID(), batch.SpanContext().TraceID(), batch.SpanContext().SpanID())
	}
}
