package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/paystream/paystream/internal/provider"
)

// Answers, encoded once.
var (
	answerReceived     = []byte(`{"received":true}` + "\n")
	answerUnknown      = []byte(`{"error":"unknown source"}` + "\n")
	answerUnreadable   = []byte(`{"error":"could not read body"}` + "\n")
	answerTimeout      = []byte(`{"error":"body not received in time"}` + "\n")
	answerUnauthorized = []byte(`{"error":"signature verification failed"}` + "\n")
	answerUnavailable  = []byte(`{"error":"event store unavailable, retry later"}` + "\n")
	answerOverloaded   = []byte(`{"error":"too many requests in flight, retry later"}` + "\n")
	answerUnencodable  = []byte(`{"error":"could not encode event"}` + "\n")
	answerHealthy      = []byte(`{"ok":true}` + "\n")
	answerReady        = []byte(`{"ready":true}` + "\n")
	answerNotReady     = []byte(`{"error":"kafka unreachable","ready":false}` + "\n")
	answerNotFound     = []byte(`{"error":"not found"}` + "\n")
	jsonContentType    = []string{"application/json"}
)

// answer is what a webhook request is answered: status and body, with
// Retry-After on a 503 and, when close is set, Connection: close.
type answer struct {
	status int
	body   []byte
	close  bool
}

var answerOK = answer{status: http.StatusOK, body: answerReceived}

// handleWebhook is POST /webhooks/{source} on net/http (see fast.go for
// the same on fasthttp): everything that depends on the HTTP server is
// here, the rest is shared.
func (s *Server) handleWebhook(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	a := answerOK
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.startSpan(ctx)
		defer func() { endSpan(span, a.status) }()
	}
	a = s.webhook(ctx, s.routes[chi.URLParam(r, "source")], func(rt *route, buf *bodyBuf) ([]byte, error) {
		return readBody(http.MaxBytesReader(w, r.Body, rt.src.MaxBodyBytes), r.ContentLength, rt.src.MaxBodyBytes, buf)
	}, func() request {
		return request{header: r.Header, query: r.URL.RawQuery, gone: func() bool { return r.Context().Err() != nil }}
	})
	if a.close {
		w.Header().Set("Connection", "close")
	}
	if a.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", s.retryAfter)
	}
	writeBody(w, a.status, a.body)
}

// request is what the shared path needs of a webhook request besides its
// body: its headers, its raw query, and whether its client hung up (a
// server that cannot tell leaves gone nil).
type request struct {
	header http.Header
	query  string
	gone   func() bool
}

// webhook handles one webhook to rt's source (nil: a source nobody
// configured): it reads its body into a bodyBuf with read (which must stop
// at the route's max_body_bytes with an *http.MaxBytesError, and charge the
// buffer as it grows), admits it, then verifies, parses and produces it, and
// says what to answer. req is called once reading the body is over.
func (s *Server) webhook(ctx context.Context, rt *route,
	read func(*route, *bodyBuf) ([]byte, error), req func() request,
) answer {
	if rt == nil {
		s.metrics.requests.WithLabelValues("unknown", outcomeUnknownSource).Inc()
		return answer{status: http.StatusNotFound, body: answerUnknown}
	}
	buf := s.getBody()
	defer putBody(buf) // its charge released
	s.metrics.reading.Inc()
	body, err := read(rt, buf)
	s.metrics.reading.Dec()
	r := req()
	if err != nil {
		return s.unreadable(rt, err, r.gone)
	}
	s.metrics.bodyBytes.Observe(float64(len(body)))
	if limit := s.admit(); limit != "" {
		rt.outcomes[outcomeOverloaded].Inc()
		s.metrics.overloaded.WithLabelValues(limit).Inc()
		return answer{status: http.StatusServiceUnavailable, body: answerOverloaded}
	}
	defer s.inFlight.Add(-1)
	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()
	return s.accept(ctx, rt, r, body)
}

// unreadable is the answer to a body that could not be read whole.
func (s *Server) unreadable(rt *route, err error, gone func() bool) answer {
	if errors.Is(err, errBodyBytes) {
		// The rest of the body is not read: the connection closes.
		rt.outcomes[outcomeOverloaded].Inc()
		s.metrics.overloaded.WithLabelValues(limitBodyBytes).Inc()
		return answer{status: http.StatusServiceUnavailable, body: answerOverloaded, close: true}
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		rt.outcomes[outcomeTooLarge].Inc()
		return answer{status: http.StatusRequestEntityTooLarge, close: true,
			body: []byte(`{"error":"body too large","limit_bytes":` + strconv.FormatInt(rt.src.MaxBodyBytes, 10) + "}\n")}
	}
	// Every path answers: a handler that returns without writing makes
	// the server answer 200 for a webhook nobody kept.
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		// Too slow to send its body within ReadTimeout (net/http also
		// cancels the request's context then): cut it off.
		rt.outcomes[outcomeTimeout].Inc()
		return answer{status: http.StatusRequestTimeout, body: answerTimeout, close: true}
	case (gone != nil && gone()) || errors.Is(err, io.ErrUnexpectedEOF):
		// Hung up mid-body: most likely nobody reads this answer.
		rt.outcomes[outcomeClientGone].Inc()
		return answer{status: http.StatusBadRequest, body: answerUnreadable, close: true}
	default:
		rt.outcomes[outcomeBadRequest].Inc()
		return answer{status: http.StatusBadRequest, body: answerUnreadable, close: true}
	}
}

// accept verifies, parses and produces a webhook whose body was read
// whole, and says what to answer.
func (s *Server) accept(ctx context.Context, rt *route, r request, body []byte) answer {
	src := rt.src
	var query url.Values // nil without a query: drivers only read it
	if r.query != "" {
		query, _ = url.ParseQuery(r.query) // as net/http's URL.Query: bad pairs dropped
	}
	req := &provider.Request{Header: r.header, Query: query, Body: body, Now: s.cfg.Now()}
	if err := src.Driver.Verify(req); err != nil {
		reason := provider.ReasonBadSignature
		var ve *provider.VerifyError
		if errors.As(err, &ve) {
			reason = ve.Reason
		}
		s.metrics.signatureFailures.WithLabelValues(src.Name, reason).Inc()
		rt.outcomes[outcomeUnauthorized].Inc()
		// Debug: a forger or a scanner must not be able to flood the
		// logs; the signature-failure counter is what to alert on.
		s.log.Debug("webhook rejected", "source", src.Name, "reason", reason)
		return answer{status: http.StatusUnauthorized, body: answerUnauthorized}
	}

	ev, err := src.Driver.Parse(req)
	if errors.Is(err, provider.ErrIrrelevant) {
		// Authentic and well-formed, but it asserts no payment fact (a
		// Mercado Pago merchant_order, an Asaas PAYMENT_UPDATED): nothing
		// to keep, nothing for the gateway to retry.
		rt.outcomes[outcomeIrrelevant].Inc()
		s.log.Debug("webhook irrelevant", "source", src.Name, "reason", err.Error())
		return answerOK
	}
	msg := envelopeFields{
		source:     src.Name,
		driver:     src.DriverName,
		receivedAt: req.Now.UTC(),
		header:     r.header,
		body:       body,
	}
	topic, o := s.cfg.Topic, outcomeAccepted
	if err != nil {
		// Authentic but unprocessable: answer 200 so the gateway stops
		// retrying, and keep it on the DLQ with the reason.
		topic, o = s.cfg.DLQTopic, outcomeDLQ
		msg.reason = err.Error()
		msg.paymentKey = src.Name + ":unknown"
		s.log.Warn("webhook dead-lettered", "source", src.Name, "reason", msg.reason)
	} else {
		msg.event = &ev
		msg.paymentKey = src.PaymentKey(ev.PaymentID)
	}
	p := getPending()
	p.buf = append(p.buf[:0], msg.paymentKey...)
	p.buf, err = appendEnvelope(p.buf, &msg)
	if err != nil {
		putPending(p)
		rt.outcomes[outcomeBadRequest].Inc()
		s.log.Warn("webhook not encodable", "source", src.Name, "error", err)
		return answer{status: http.StatusBadRequest, body: answerUnencodable}
	}
	p.rec = kgo.Record{Topic: topic, Key: p.buf[:len(msg.paymentKey)], Value: p.buf[len(msg.paymentKey):]}
	if s.tracer != nil {
		// kotel's producer hook starts the publish span under the
		// request's and injects its traceparent into the record. The
		// record outlives a client hanging up: its context never ends.
		p.rec.Context = context.WithoutCancel(ctx)
	}
	// The answer waits for the broker whatever the client does: net/http
	// cancels the request's context when the client closes its sending
	// side, and a 200 must never go out before the acknowledgement.
	if err := s.produce(p); err != nil {
		if r.gone != nil && r.gone() {
			// The client went away and the broker did not answer in time:
			// not a sign the broker is down. The record may still be
			// written; the gateway's retry is then a duplicate.
			rt.outcomes[outcomeClientGone].Inc()
			s.log.Debug("client gone, broker did not acknowledge", "source", src.Name, "topic", topic, "error", err)
		} else {
			rt.outcomes[outcomeUnavailable].Inc()
			s.log.Warn("produce failed", "source", src.Name, "topic", topic, "error", err)
		}
		return answer{status: http.StatusServiceUnavailable, body: answerUnavailable}
	}
	rt.outcomes[o].Inc()
	return answerOK
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// pending is one record on its way to the broker: the record, its key and
// value bytes, the promise that reports the acknowledgement and the timer
// that bounds the wait for it. It is reused once the promise has run, never
// before (the client holds the record until then).
type pending struct {
	rec     kgo.Record
	buf     []byte
	done    chan error
	promise func(*kgo.Record, error)
	timer   *time.Timer // stopped while pooled; Reset never sees a stale tick (Go ≥ 1.23 timers)
}

var pendingPool = sync.Pool{New: func() any {
	p := &pending{done: make(chan error, 1), buf: make([]byte, 0, 4096), timer: time.NewTimer(time.Hour)}
	p.timer.Stop()
	p.promise = func(_ *kgo.Record, err error) { p.done <- err }
	return p
}}

func getPending() *pending { return pendingPool.Get().(*pending) }

func putPending(p *pending) {
	if cap(p.buf) > 1<<20 {
		return // keep the pool's memory bounded
	}
	p.rec = kgo.Record{}
	pendingPool.Put(p)
}

// produce waits for the broker's acknowledgement of p.rec, at most
// ProduceTimeout. A record that times out may still be written later; the
// gateway's retry is then a duplicate, which the processor ignores. When the
// producer's buffer is full (the broker has been unreachable for a while)
// it fails at once instead of queueing the request.
//
// The record is produced with a context of its own: a client hanging up
// must not cancel it (canceling can fail the records batched with it).
func (s *Server) produce(p *pending) error {
	start := time.Now()
	s.kafka.TryProduce(context.Background(), &p.rec, p.promise)
	p.timer.Reset(s.cfg.ProduceTimeout)
	select {
	case err := <-p.done:
		p.timer.Stop()
		s.metrics.produceSeconds.Observe(time.Since(start).Seconds())
		putPending(p)
		return err
	case <-p.timer.C:
		// p stays with the client, which still holds p.rec: not pooled.
		return fmt.Errorf("broker did not acknowledge within %s", s.cfg.ProduceTimeout)
	}
}

// Body buffers: most webhooks are a few KiB, so one pooled buffer per
// request avoids growing a fresh slice for each. Buffers over 64 KiB are
// not kept: a request is charged what it may fill of its buffer beyond
// bodyAllowance before its first byte, which must stay small.
var bodyPool = sync.Pool{New: func() any { return &bodyBuf{b: make([]byte, 0, bodyAllowance)} }}

func (s *Server) getBody() *bodyBuf {
	b := bodyPool.Get().(*bodyBuf)
	b.s = s
	return b
}

// putBody releases b's charge and pools it.
func putBody(b *bodyBuf) {
	b.release()
	if cap(b.b) > maxPooledBuffer {
		return
	}
	b.b, b.s = b.b[:0], nil
	bodyPool.Put(b)
}

const maxPooledBuffer = 64 << 10

// readBody reads r (already limited to limit bytes by a MaxBytesReader)
// into *buf, growing it as the bytes arrive — doubling, up to the announced
// length + 1 when there is one (+1: EOF seen without growing) — and
// charging the buffer before each growth: first what the body may fill of
// the buffer it starts with beyond bodyAllowance, then each growth. The
// returned slice aliases buf.b.
func readBody(r io.Reader, contentLength, limit int64, buf *bodyBuf) ([]byte, error) {
	b := buf.b[:0]
	ceiling := limit + 1
	if contentLength >= 0 && contentLength < limit {
		ceiling = contentLength + 1
	}
	cost := func(size int64) int64 { return max(size-bodyAllowance, 0) }
	held := min(int64(cap(b)), ceiling) // what the body may fill of b
	if err := buf.charge(cost(held)); err != nil {
		return nil, err
	}
	for {
		if len(b) == cap(b) {
			n := max(min(2*int64(cap(b)), ceiling), int64(cap(b))+512)
			if err := buf.charge(cost(n) - cost(held)); err != nil {
				return nil, err
			}
			held = n
			nb := make([]byte, len(b), n)
			copy(nb, b)
			b = nb
			buf.b = b
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			buf.b = b
			if errors.Is(err, io.EOF) {
				return b, nil
			}
			return nil, err
		}
	}
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
