package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"go.opentelemetry.io/otel/trace"
)

// The HTTP servers Serve can run (Config.HTTPServer).
const (
	// HTTPServerFast, the default, is github.com/valyala/fasthttp for
	// POST /webhooks/{source}, and net/http's handler (through fasthttp's
	// adaptor) for everything else. It answers every webhook as net/http
	// does, for less CPU per request: it reuses each request's memory, and
	// spends fewer system calls and goroutine switches per request on a
	// keep-alive connection. Two differences: a request counts as in
	// flight once its first 8 KiB of body (or all of it, if shorter) have
	// arrived, not once its headers have; and a connection that served a
	// request keeps a read buffer of maxHeaderBytes while idle (net/http
	// keeps 4 KiB for reading and 4 KiB for writing).
	HTTPServerFast = "fasthttp"
	// HTTPServerNet is Go's net/http.
	HTTPServerNet = "net/http"
)

// maxHeaderBytes bounds a request's line and headers, on either server
// (net/http reads up to 4 KiB more before it answers 431). It is also
// fasthttp's read buffer, which each connection keeps once it served a
// request: 16 KiB, as Node.js and AWS's load balancers allow per header,
// is far above what gateways send (about 1 KiB) and keeps an idle
// connection at about 24 KiB (64 KiB kept about 76).
const maxHeaderBytes = 16 << 10

// fastServer is the fasthttp server Serve runs, on a listener wrapped by
// lim (nil: none).
func (s *Server) fastServer(lim *connLimiter) *fasthttp.Server {
	other := fasthttpadaptor.NewFastHTTPHandler(s.closingWhenDraining(s.handler))
	return &fasthttp.Server{
		Handler: func(c *fasthttp.RequestCtx) {
			if name, ok := webhookSource(c); ok {
				s.handleWebhookFast(c, s.routes[string(name)]) // the conversion allocates nothing
				return
			}
			// No other route takes a body, and the adaptor would read a
			// whole one into memory, unbounded: drop it (the handlers see
			// at most the 8 KiB fasthttp read ahead; the server discards
			// the rest or closes the connection).
			_ = c.Request.CloseBodyStream()
			other(c)
		},
		ErrorHandler: s.fastError,
		// ReadTimeout bounds the request line and headers, from their
		// first byte; once they are in, HeaderReceived gives the body
		// ReadTimeout of its own.
		ReadTimeout: s.cfg.ReadHeaderTimeout,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: s.cfg.ReadTimeout}
		},
		WriteTimeout:   s.cfg.ReadTimeout + s.cfg.ProduceTimeout + 5*time.Second,
		IdleTimeout:    s.cfg.IdleTimeout,
		ReadBufferSize: maxHeaderBytes,
		// A new connection waits for its first byte with no read buffer,
		// and an idle one keeps no write buffer.
		ReduceMemoryUsage: true,
		// The connLimiter Serve wraps the listener in enforces MaxConns;
		// fasthttp's own cap, above it, only bounds the workers of
		// connections being closed meanwhile.
		Concurrency: 2 * s.cfg.MaxConns,
		ConnState: func(c net.Conn, state fasthttp.ConnState) {
			switch {
			case lim == nil, state == fasthttp.StateNew: // waiting since Accept
			case state == fasthttp.StateIdle:
				lim.setWaiting(c, true)
			default:
				lim.setWaiting(c, false)
			}
		},
		// Bodies stream: a webhook is admitted before its body is read,
		// as on net/http (fasthttp reads up to 8 KiB of it ahead), its
		// buffer charged as the bytes arrive, and its source's limit is
		// enforced as it is read (fasthttp's MaxRequestBodySize does not
		// apply to a stream).
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		CloseOnShutdown:              true,
		SecureErrorLogMessage:        true, // no request bytes in its log lines
		Logger:                       fastLogger{s.log},
	}
}

// webhookPrefix is the path of the webhook route before the source name.
var webhookPrefix = []byte("/webhooks/")

// webhookSource returns the source name of a POST /webhooks/{source},
// read from the path as sent (the request's own bytes, valid while it is
// served). Anything else — another method or path, a name with a slash or
// a percent escape, dot segments — is for net/http's router, which
// answers it as it would on net/http.
func webhookSource(c *fasthttp.RequestCtx) ([]byte, bool) {
	if !c.IsPost() {
		return nil, false
	}
	path := c.URI().PathOriginal()
	name, ok := bytes.CutPrefix(path, webhookPrefix)
	if !ok || len(name) == 0 || bytes.ContainsAny(name, "/%?#") || bytes.Equal(name, []byte(".")) || bytes.Equal(name, []byte("..")) {
		return nil, false
	}
	return name, true
}

// handleWebhookFast is handleWebhook on fasthttp, for rt's source (nil: a
// source nobody configured).
func (s *Server) handleWebhookFast(c *fasthttp.RequestCtx, rt *route) {
	ctx := context.Background()
	a := answerOK
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.startSpan(ctx)
		defer func() { endSpan(span, a.status) }()
	}
	contentLength := int64(c.Request.Header.ContentLength()) // -1: chunked, unknown
	if contentLength == -2 {
		contentLength = 0 // neither Content-Length nor chunked: no body, as net/http reads it
	}
	a = s.webhook(ctx, rt, func(rt *route, buf *bodyBuf) ([]byte, error) {
		// Over the limit, it reads up to the limit as net/http does, so
		// that a client still writing its body reads the 413 rather than
		// a connection reset.
		limit := rt.src.MaxBodyBytes
		if stream := c.RequestBodyStream(); stream != nil {
			return readBody(newMaxBytesReader(stream, limit), contentLength, limit, buf)
		}
		body := c.PostBody() // no stream: the body was read ahead whole, within bodyAllowance
		if int64(len(body)) > limit {
			return nil, &http.MaxBytesError{Limit: limit}
		}
		if err := buf.charge(max(int64(len(body))-bodyAllowance, 0)); err != nil {
			return nil, err
		}
		return body, nil
	}, func() request {
		return request{header: fastHeader(&c.Request.Header), query: string(c.URI().QueryString()),
			gone: func() bool { return connGone(c.Conn()) }}
	})
	if a.close || s.draining.Load() {
		c.SetConnectionClose()
	}
	if a.status == http.StatusServiceUnavailable {
		c.Response.Header.Set("Retry-After", s.retryAfter)
	}
	c.SetStatusCode(a.status)
	c.SetContentType("application/json")
	c.SetBody(a.body)
}

// fastHeader copies a request's headers into an http.Header, keyed as
// net/http keys them (canonical names; Host and Transfer-Encoding are not
// headers there), for the drivers and the envelope. The values share one
// backing array, their bytes one string, and the names gateways send are
// not allocated: a fixed few allocations whatever the number of headers.
func fastHeader(h *fasthttp.RequestHeader) http.Header {
	size := 0
	for _, v := range h.All() {
		size += len(v)
	}
	var sb strings.Builder
	sb.Grow(size)
	for _, v := range h.All() {
		sb.Write(v)
	}
	all := sb.String()
	out := make(http.Header, h.Len())
	values := make([]string, 0, h.Len())
	for k, v := range h.All() {
		value := all[:len(v)]
		all = all[len(v):]
		key, ok := commonHeaders[string(k)]
		if !ok {
			key = http.CanonicalHeaderKey(string(k))
		}
		if key == "Host" || key == "Transfer-Encoding" {
			continue
		}
		if prev, ok := out[key]; ok {
			out[key] = append(prev, value) // a repeated name: rare
			continue
		}
		values = append(values, value)
		out[key] = values[len(values)-1 : len(values) : len(values)]
	}
	return out
}

// commonHeaders are the header names the drivers read and clients commonly
// send, as fasthttp spells them (canonical, as net/http does): looking one
// up allocates nothing.
var commonHeaders = func() map[string]string {
	names := []string{
		"Accept", "Accept-Encoding", "Authorization", "Connection", "Content-Length", "Content-Type",
		"Host", "Idempotency-Key", "Traceparent", "Transfer-Encoding", "User-Agent",
		"Webhook-Id", "Webhook-Signature", "Webhook-Timestamp", "X-Forwarded-For", "X-Forwarded-Proto",
		"X-Request-Id", "X-Signature", "X-Hub-Signature", "X-Hub-Signature-256", "Stripe-Signature",
		"Asaas-Access-Token", "X-Authenticity-Token",
	}
	m := make(map[string]string, len(names))
	for _, n := range names {
		c := http.CanonicalHeaderKey(n)
		m[c] = c
	}
	return m
}()

// maxBytesReader reads at most limit bytes of r, then fails with
// *http.MaxBytesError, as http.MaxBytesReader does.
type maxBytesReader struct {
	r           io.Reader
	limit, left int64
}

func newMaxBytesReader(r io.Reader, limit int64) *maxBytesReader {
	return &maxBytesReader{r: r, limit: limit, left: limit}
}

func (m *maxBytesReader) Read(p []byte) (int, error) {
	if int64(len(p)) > m.left+1 {
		p = p[:m.left+1] // one byte past the limit tells it was passed
	}
	n, err := m.r.Read(p)
	if int64(n) > m.left {
		return int(m.left), &http.MaxBytesError{Limit: m.limit}
	}
	m.left -= int64(n)
	return n, err
}

// fastError answers a request fasthttp could not read, as net/http does:
// 431 for headers over maxHeaderBytes, 408 for a request not read in
// time, 501 for a transfer coding other than chunked, 400 for anything
// malformed; the connection closes after it.
func (s *Server) fastError(c *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	switch {
	case errors.As(err, &small):
		c.Error("431 Request Header Fields Too Large", http.StatusRequestHeaderFieldsTooLarge)
	case errors.As(err, &netErr) && netErr.Timeout():
		c.Error("408 Request Timeout", http.StatusRequestTimeout)
	case errors.Is(err, fasthttp.ErrUnsupportedTransferEncoding):
		c.Error("501 Not Implemented: unsupported transfer encoding", http.StatusNotImplemented)
	default:
		c.Error("400 Bad Request", http.StatusBadRequest)
	}
}

// fastLogger is fasthttp's logger: warnings in ingest's log.
type fastLogger struct{ log *slog.Logger }

func (l fastLogger) Printf(format string, args ...any) {
	l.log.Warn("http server", "error", fmt.Sprintf(format, args...))
}
