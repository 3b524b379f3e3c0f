package ingest

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName names ingest's spans' instrumentation scope.
const tracerName = "github.com/paystream/paystream/ingest"

// startSpan starts a webhook's server span, the root of its trace. A
// webhook comes from outside: its sender's trace context, if any, is not
// continued.
func (s *Server) startSpan(ctx context.Context) (context.Context, trace.Span) {
	return s.tracer.Start(ctx, "POST /webhooks/{source}",
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", http.MethodPost),
			attribute.String("http.route", "/webhooks/{source}"),
		))
}

// endSpan ends a webhook's span with the status it was answered.
func endSpan(span trace.Span, status int) {
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= http.StatusInternalServerError {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}
