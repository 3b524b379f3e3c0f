package processor

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/paystream/paystream/internal/tracing"
)

// tracerName names the processor's spans' instrumentation scope.
const tracerName = "github.com/paystream/paystream/processor"

// maxBatchLinks bounds the links of a batch span: the SDK's default limit,
// past which it drops them anyway.
const maxBatchLinks = 128

// startBatchSpan starts the span of one batch transaction. A batch has as
// many parents as records, so the span is a root linked to the trace
// context each record carries (the first maxBatchLinks of them). With
// tracing off it returns ctx and its (no-op) span, reading no header.
func (p *Processor) startBatchSpan(ctx context.Context, batch []*kgo.Record) (context.Context, trace.Span) {
	if p.tracer == nil || len(batch) == 0 {
		return ctx, trace.SpanFromContext(ctx)
	}
	links := make([]trace.Link, 0, min(len(batch), maxBatchLinks))
	for _, rec := range batch {
		if len(links) == maxBatchLinks {
			break
		}
		if sc := tracing.RecordContext(rec.Headers); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return p.tracer.Start(ctx, "process batch",
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", batch[0].Topic),
			attribute.Int("messaging.destination.partition.id", int(batch[0].Partition)),
			attribute.Int("messaging.batch.message_count", len(batch)),
		))
}

// endBatchSpan ends a batch transaction's span with its outcome.
func endBatchSpan(span trace.Span, out batchOutcome, err error) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "batch not committed")
	} else {
		span.SetAttributes(attribute.Int("paystream.batch.applied", out.applied), attribute.Bool("paystream.batch.slow", out.slow))
	}
}
