// Package ingest is paystream's HTTP front door. It verifies each webhook's
// signature on the raw body, normalizes just enough to know the payment key
// and dedup key, and produces the webhook byte-exact to the raw topic keyed
// by payment, answering 2xx only after the broker acknowledged (acks=all,
// idempotent producer). It never touches Postgres, so a database outage
// never makes a gateway back off.
package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/source"
)

// Config configures a Server.
type Config struct {
	// Addr is the listen address. Defaults to 127.0.0.1:8080.
	Addr string
	// Sources are the configured webhook senders by name. Required.
	Sources map[string]*source.Source
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// Topic is the raw topic. Defaults to paystream.webhooks.raw.v1.
	Topic string
	// DLQTopic receives authentic events that cannot be processed.
	// Defaults to paystream.webhooks.dlq.v1.
	DLQTopic string
	// ProduceTimeout is how long a request waits for the broker's
	// acknowledgement before answering 503. Defaults to 5s.
	ProduceTimeout time.Duration
	// RetryAfter is the Retry-After sent with a 503, rounded up to whole
	// seconds. Defaults to 5s.
	RetryAfter time.Duration
	// ReadHeaderTimeout bounds how long a client may take to send the
	// request headers (slow-loris protection). Defaults to 5s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds how long a client may take to send the whole
	// request, body included. Defaults to 15s.
	ReadTimeout time.Duration
	// KafkaOpts are extra franz-go options (TLS, SASL, metrics hooks).
	KafkaOpts []kgo.Opt
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the server's metrics. Defaults to a private registry.
	Registerer prometheus.Registerer
	// Gatherer serves /metrics. Defaults to the Registerer when it is a
	// *prometheus.Registry, else prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Now is the clock signatures are judged against. Defaults to time.Now.
	Now func() time.Time
}

// Server receives webhooks.
type Server struct {
	cfg     Config
	log     *slog.Logger
	kafka   *kgo.Client
	metrics *metrics
	handler http.Handler
	ready   atomic.Bool
}

// New validates cfg, creates the Kafka producer and returns a Server.
func New(cfg Config) (*Server, error) {
	if len(cfg.Sources) == 0 {
		return nil, errors.New("ingest config: Sources is required")
	}
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("ingest config: Brokers is required")
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:8080"
	}
	if cfg.Topic == "" {
		cfg.Topic = envelope.TopicRaw
	}
	if cfg.DLQTopic == "" {
		cfg.DLQTopic = envelope.TopicDLQ
	}
	if cfg.ProduceTimeout == 0 {
		cfg.ProduceTimeout = 5 * time.Second
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = 5 * time.Second
	}
	if cfg.ReadHeaderTimeout == 0 {
		cfg.ReadHeaderTimeout = 5 * time.Second
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = 15 * time.Second
	}
	for name, d := range map[string]time.Duration{
		"ProduceTimeout": cfg.ProduceTimeout, "RetryAfter": cfg.RetryAfter,
		"ReadHeaderTimeout": cfg.ReadHeaderTimeout, "ReadTimeout": cfg.ReadTimeout,
	} {
		if d < 0 {
			return nil, fmt.Errorf("ingest config: %s must not be negative", name)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Gatherer == nil {
		if g, ok := cfg.Registerer.(prometheus.Gatherer); ok {
			cfg.Gatherer = g
		} else {
			cfg.Gatherer = prometheus.DefaultGatherer
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m, err := newMetrics(cfg.Registerer, cfg.Sources)
	if err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), // the idempotent producer is franz-go's default
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(cfg.ProduceTimeout + 30*time.Second),
	}, cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, kafka: cl, metrics: m}
	s.handler = s.routes()
	return s, nil
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	r.Post("/webhooks/{source}", s.handleWebhook)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, map[string]any{"ok": true}) })
	r.Get("/readyz", s.handleReady)
	r.Handle("/metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{}))
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": "not found"})
	})
	return r
}

// Run serves on cfg.Addr until ctx is canceled, then stops accepting,
// finishes in-flight requests (their produces included) and returns.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an existing listener.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.ReadTimeout + s.cfg.ProduceTimeout + 5*time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	go s.readinessLoop(ctx)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("ingest listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		s.kafka.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ProduceTimeout+5*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	s.kafka.Close()
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// Close releases the Kafka client of a Server used only through Handler.
func (s *Server) Close() { s.kafka.Close() }

func (s *Server) readinessLoop(ctx context.Context) {
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := s.kafka.Ping(pctx)
		cancel()
		s.ready.Store(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.kafka.Ping(ctx); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "error": "kafka unreachable"})
			return
		}
		s.ready.Store(true)
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}

// Request outcomes, the "outcome" label of paystream_ingest_requests_total.
const (
	outcomeAccepted      = "accepted"
	outcomeDLQ           = "dead_lettered"
	outcomeIrrelevant    = "irrelevant"
	outcomeUnauthorized  = "unauthorized"
	outcomeUnknownSource = "unknown_source"
	outcomeTooLarge      = "too_large"
	outcomeBadRequest    = "bad_request"
	outcomeUnavailable   = "unavailable"
)

func (s *Server) handleWebhook(w http.ResponseWriter, r *http.Request) {
	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()

	src, ok := s.cfg.Sources[chi.URLParam(r, "source")]
	if !ok {
		s.metrics.requests.WithLabelValues("unknown", outcomeUnknownSource).Inc()
		writeJSON(w, http.StatusNotFound, map[string]any{"error": "unknown source"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, src.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.metrics.requests.WithLabelValues(src.Name, outcomeTooLarge).Inc()
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{"error": "body too large", "limit_bytes": src.MaxBodyBytes})
			return
		}
		s.metrics.requests.WithLabelValues(src.Name, outcomeBadRequest).Inc()
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "could not read body"})
		return
	}
	s.metrics.bodyBytes.Observe(float64(len(body)))

	req := &provider.Request{Header: r.Header, Query: r.URL.Query(), Body: body, Now: s.cfg.Now()}
	if err := src.Driver.Verify(req); err != nil {
		reason := provider.ReasonBadSignature
		var ve *provider.VerifyError
		if errors.As(err, &ve) {
			reason = ve.Reason
		}
		s.metrics.signatureFailures.WithLabelValues(src.Name, reason).Inc()
		s.metrics.requests.WithLabelValues(src.Name, outcomeUnauthorized).Inc()
		s.log.Info("webhook rejected", "source", src.Name, "reason", reason)
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "signature verification failed"})
		return
	}

	env := envelope.Raw{
		Source:     src.Name,
		Driver:     src.DriverName,
		ReceivedAt: req.Now.UTC(),
		Headers:    selectHeaders(r.Header),
		Body:       body,
	}
	topic, outcome := s.cfg.Topic, outcomeAccepted
	ev, err := src.Driver.Parse(req)
	if errors.Is(err, provider.ErrIrrelevant) {
		// Authentic and well-formed, but it asserts no payment fact (a
		// Mercado Pago merchant_order, an Asaas PAYMENT_UPDATED): nothing to
		// keep, nothing to retry.
		s.metrics.requests.WithLabelValues(src.Name, outcomeIrrelevant).Inc()
		s.log.Debug("webhook irrelevant", "source", src.Name, "reason", err.Error())
		writeJSON(w, http.StatusOK, map[string]any{"received": true})
		return
	}
	if err != nil {
		// Authentic but unprocessable: answer 200 so the gateway stops
		// retrying, and keep it on the DLQ with the reason.
		topic, outcome = s.cfg.DLQTopic, outcomeDLQ
		env.Reason = err.Error()
		env.PaymentKey = src.Name + ":unknown"
		s.log.Warn("webhook dead-lettered", "source", src.Name, "reason", err.Error())
	} else {
		env.Event = ev
		env.PaymentKey = src.PaymentKey(ev.PaymentID)
	}
	value, err := env.Marshal()
	if err != nil {
		s.metrics.requests.WithLabelValues(src.Name, outcomeBadRequest).Inc()
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "could not encode event"})
		return
	}
	if err := s.produce(r.Context(), topic, []byte(env.PaymentKey), value); err != nil {
		s.metrics.requests.WithLabelValues(src.Name, outcomeUnavailable).Inc()
		s.log.Warn("produce failed", "source", src.Name, "topic", topic, "error", err)
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds(s.cfg.RetryAfter)))
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": "event store unavailable, retry later"})
		return
	}
	s.metrics.requests.WithLabelValues(src.Name, outcome).Inc()
	writeJSON(w, http.StatusOK, map[string]any{"received": true})
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// produce waits for the broker's acknowledgement of one record, at most
// ProduceTimeout. A record that times out may still be written later; the
// gateway's retry is then a duplicate, which the processor ignores. When the
// producer's buffer is full (the broker has been unreachable for a while)
// it fails at once instead of queueing the request.
func (s *Server) produce(ctx context.Context, topic string, key, value []byte) error {
	start := time.Now()
	done := make(chan error, 1)
	s.kafka.TryProduce(context.WithoutCancel(ctx), &kgo.Record{Topic: topic, Key: key, Value: value}, func(_ *kgo.Record, err error) {
		done <- err
	})
	timer := time.NewTimer(s.cfg.ProduceTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		s.metrics.produceSeconds.Observe(time.Since(start).Seconds())
		return err
	case <-timer.C:
		return fmt.Errorf("broker did not acknowledge within %s", s.cfg.ProduceTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// keptHeaders are the request headers copied into the envelope: ids and
// timestamps useful for audit. Signature and token headers are not kept:
// some gateways send their secret itself (Asaas).
var keptHeaders = []string{
	"Content-Type", "User-Agent", "Webhook-Id", "Webhook-Timestamp", "X-Request-Id", "Idempotency-Key",
}

func selectHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for _, k := range keptHeaders {
		if v := h.Get(k); v != "" {
			out[k] = v
		}
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
