package ingest

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName names ingest's spans' instrumentation scope.
const tracerName = "github.com/paystream/paystream/ingest"

// traceWebhook is handleWebhook in a server span, the root of the
// webhook's trace. A webhook comes from outside: its sender's trace
// context, if any, is not continued.
func (s *Server) traceWebhook(w http.ResponseWriter, r *http.Request) {
	ctx, span := s.tracer.Start(r.Context(), "POST /webhooks/{source}",
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", http.MethodPost),
			attribute.String("http.route", "/webhooks/{source}"),
		))
	defer span.End()
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	s.handleWebhook(sw, r.WithContext(ctx))
	span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
	if sw.status >= http.StatusInternalServerError {
		span.SetStatus(codes.Error, http.StatusText(sw.status))
	}
}

// statusWriter remembers the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
