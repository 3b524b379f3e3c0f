// Package ingest is paystream's HTTP front door. It verifies each webhook's
// signature on the raw body, normalizes just enough to know the payment key
// and dedup key, and produces the webhook byte-exact to the raw topic keyed
// by payment, answering 2xx only after the broker acknowledged (acks=all,
// idempotent producer). It never touches Postgres, so a database outage
// never makes a gateway back off.
//
// Answers: 200 {"received":true} for accepted events (duplicates too), for
// authentic events that cannot be processed (kept on the DLQ topic with the
// reason) and for authentic events that assert no payment fact (kept
// nowhere); 401 for anything not authentic, before any parsing; 404 for an
// unknown source; 413 over the source's body limit; 503 with Retry-After
// when the broker does not acknowledge in time or when too many requests or
// body bytes are already in flight.
//
// Under abuse: at most MaxConns connections are open (at the cap a new one
// closes the longest-idle one, or is answered 503); an idle keep-alive
// connection costs about 24 KiB on fasthttp, 19 KiB on net/http; a body's
// first 8 KiB are the connection's and the rest is charged to
// MaxBufferedBodyBytes as it arrives, not as announced; and a request takes
// a place among MaxInFlight only once its body is in. So slow
// unauthenticated bodies hold nothing a gateway's webhook of up to 8 KiB
// needs (admission.go says why and what is left). GET /metrics is not on
// the webhook listener unless ServeMetrics asks for it.
//
// Records are sized for the largest body any source accepts: the producer's
// batch limit is envelope.MaxRecordBytes of the largest max_body_bytes (see
// MaxRecordBytes), and the raw and DLQ topics' max.message.bytes must be at
// least that (paystream migrate sets them).
package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/trace"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/tracing"
)

// Server receives webhooks.
type Server struct {
	cfg     Config
	log     *slog.Logger
	kafka   *kgo.Client
	metrics *metrics
	routes  map[string]*route // by source name
	handler http.Handler
	tracer  trace.Tracer // nil: tracing off
	// retryAfter is the Retry-After of a 503, in seconds.
	retryAfter string
	ready      atomic.Bool
	// draining is set once Serve's ctx ended: /readyz answers 503 from
	// then on, whatever Kafka's state.
	draining atomic.Bool

	maxRecordBytes int32
	inFlight       atomic.Int64 // webhook requests admitted and not yet answered
	bodyBytes      atomic.Int64 // body bytes the requests hold, as bodyBuf.charge counts them
}

// route is one source with its metric children, resolved once.
type route struct {
	src      *source.Source
	outcomes outcomeCounters
}

// New validates cfg, creates the Kafka producer and returns a Server.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// The buffered body bytes hold at least one body of the largest a
	// source accepts.
	cfg.MaxBufferedBodyBytes = max(cfg.MaxBufferedBodyBytes, largestBody(cfg.Sources)+1)
	maxRecord, err := MaxRecordBytes(cfg.Sources)
	if err != nil {
		return nil, fmt.Errorf("ingest config: %w", err)
	}
	var s *Server
	m, err := newMetrics(cfg.Registerer, func() float64 { return float64(s.bodyBytes.Load()) })
	if err != nil {
		return nil, err
	}
	routes := make(map[string]*route, len(cfg.Sources))
	for name, src := range cfg.Sources {
		routes[name] = &route{src: src, outcomes: m.forSource(name)}
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), // the idempotent producer is franz-go's default
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(cfg.Linger),
		kgo.ProducerBatchMaxBytes(maxRecord), // a batch holds at least the largest record
		kgo.RecordDeliveryTimeout(cfg.ProduceTimeout + 30*time.Second),
	}, cfg.KafkaOpts...)
	tracer := tracing.Tracer(cfg.TracerProvider, tracerName)
	if tracer != nil {
		kt := kotel.NewTracer(kotel.TracerProvider(cfg.TracerProvider), kotel.TracerPropagator(tracing.Propagator))
		opts = append(opts, kgo.WithHooks(kotel.NewKotel(kotel.WithTracer(kt)).Hooks()...))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	s = &Server{cfg: cfg, log: cfg.Logger, kafka: cl, metrics: m, routes: routes, tracer: tracer, maxRecordBytes: maxRecord,
		retryAfter: strconv.Itoa(retryAfterSeconds(cfg.RetryAfter))}
	s.handler = s.newRouter()
	return s, nil
}

// MaxRecordBytes is the largest record ingest may produce for sources:
// envelope.MaxRecordBytes of the largest max_body_bytes among them. The raw
// and DLQ topics' max.message.bytes must be at least this.
func MaxRecordBytes(sources map[string]*source.Source) (int32, error) {
	return envelope.MaxRecordBytes(largestBody(sources))
}

func largestBody(sources map[string]*source.Source) int64 {
	var n int64
	for _, src := range sources {
		n = max(n, src.MaxBodyBytes)
	}
	return n
}

// MaxRecordBytes is the producer's batch limit, the function
// MaxRecordBytes of s's sources.
func (s *Server) MaxRecordBytes() int32 { return s.maxRecordBytes }

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) newRouter() http.Handler {
	r := chi.NewRouter()
	r.Post("/webhooks/{source}", s.handleWebhook)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { writeBody(w, http.StatusOK, answerHealthy) })
	r.Get("/readyz", s.handleReady)
	if s.cfg.ServeMetrics {
		r.Handle("/metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) { writeBody(w, http.StatusNotFound, answerNotFound) })
	return r
}

// Run serves on cfg.Addr until ctx is canceled, then drains (see Serve)
// and returns.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an existing listener. It closes the Kafka client when
// it returns.
//
// When ctx ends it drains, in this order: /readyz answers 503 at once
// (and every response asks its client to close the connection); requests are
// still served for ShutdownGrace, so load balancers see the drop and stop
// routing here; then the listener closes and the requests in flight finish
// — each answered 200 once the broker acknowledged, or 503 — and the
// producer flushes, all within ShutdownTimeout.
//
// Connections are capped at MaxConns (see Config.MaxConns).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	lim := newConnLimiter(ln, s.cfg.MaxConns, s.metrics, s.retryAfter)
	if s.cfg.HTTPServer == HTTPServerFast {
		srv := s.fastServer(lim)
		return s.serve(ctx, lim, HTTPServerFast, srv.Serve, srv.ShutdownWithContext)
	}
	srv := &http.Server{
		Handler:           s.closingWhenDraining(s.handler),
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.ReadTimeout + s.cfg.ProduceTimeout + 5*time.Second,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ConnState: func(c net.Conn, state http.ConnState) {
			switch state {
			case http.StateNew: // waiting since Accept
			case http.StateIdle:
				lim.setWaiting(c, true)
			default:
				lim.setWaiting(c, false)
			}
		},
	}
	return s.serve(ctx, lim, HTTPServerNet, srv.Serve, srv.Shutdown)
}

// serve runs an HTTP server (serveFn, named name) on ln and the readiness
// loop until ctx ends, then drains through shutdown.
func (s *Server) serve(ctx context.Context, ln net.Listener, name string,
	serveFn func(net.Listener) error, shutdown func(context.Context) error,
) error {
	loopCtx, stopLoop := context.WithCancel(ctx)
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		s.readinessLoop(loopCtx)
	}()
	defer func() {
		stopLoop()
		<-loopDone
		s.kafka.Close()
	}()
	errc := make(chan error, 1)
	go func() { errc <- serveFn(ln) }()
	s.log.Info("ingest listening", "addr", ln.Addr().String(), "http_server", name)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	return s.drain(shutdown)
}

// drain stops the server as Serve describes; shutdown closes its listener
// and waits for the requests in flight.
func (s *Server) drain(shutdown func(context.Context) error) error {
	start := time.Now()
	s.draining.Store(true)
	s.log.Info("ingest draining: not ready, still serving", "grace", s.cfg.ShutdownGrace)
	if s.cfg.ShutdownGrace > 0 {
		grace := time.NewTimer(s.cfg.ShutdownGrace)
		<-grace.C
	}
	inFlight := s.inFlight.Load()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: requests still in flight after %s: %w", s.cfg.ShutdownTimeout, err)
	}
	// Every request is answered. Those answered 503 after the produce
	// timeout may have left records in the producer's buffer: give them
	// their chance (the gateway retries them anyway; a record written late
	// is a duplicate the processor ignores).
	if err := s.kafka.Flush(shutdownCtx); err != nil {
		s.log.Warn("producer not flushed at shutdown; its records were answered 503", "error", err)
	}
	s.log.Info("ingest drained", "in_flight_at_close", inFlight, "seconds", time.Since(start).Seconds())
	return nil
}

// Close releases the Kafka client of a Server used only through Handler.
func (s *Server) Close() { s.kafka.Close() }

func (s *Server) readinessLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := s.kafka.Ping(pctx)
		cancel()
		s.ready.Store(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// closingWhenDraining answers with "Connection: close" once draining, so
// each keep-alive connection closes after its next response instead of
// being cut under a request when the listener closes. (Closing idle
// connections at once would fail the requests racing onto them.)
func (s *Server) closingWhenDraining(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// answerDraining is /readyz's answer once the server is shutting down.
var answerDraining = []byte(`{"error":"shutting down","ready":false}` + "\n")

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeBody(w, http.StatusServiceUnavailable, answerDraining)
		return
	}
	if !s.ready.Load() {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.kafka.Ping(ctx); err != nil {
			writeBody(w, http.StatusServiceUnavailable, answerNotReady)
			return
		}
		s.ready.Store(true)
	}
	writeBody(w, http.StatusOK, answerReady)
}
