package ingest

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/source"
)

// Config configures a Server.
type Config struct {
	// Addr is the listen address of Run. Defaults to 127.0.0.1:8080.
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
	// Linger is how long the producer waits for more records of a
	// partition before sending them in one request. A little lingering
	// makes batches, which costs the broker far less CPU per webhook than
	// one request each, for that much added latency. Defaults to 2ms; a
	// negative value sends each record at once.
	Linger time.Duration
	// ReadHeaderTimeout bounds how long a client may take to send the
	// request headers (slow-loris protection). Defaults to 5s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds how long a client may take to send the whole
	// request, body included. Defaults to 15s.
	ReadTimeout time.Duration
	// MaxInFlight is how many webhook requests whose body is in may be
	// handled at once (verifying, waiting for the broker); more are
	// answered 503 with Retry-After at once. A request whose body is still
	// arriving does not count: MaxConns, MaxBufferedBodyBytes and
	// ReadTimeout bound those. Defaults to DefaultMaxInFlight.
	MaxInFlight int
	// MaxBufferedBodyBytes is how many body bytes the webhook requests
	// may hold together beyond the first 8 KiB of each (which MaxConns
	// bounds), counting each body's buffer as it grows with the bytes that
	// arrived (doubling, at most to its Content-Length + 1), until the
	// request is answered. A request whose buffer cannot grow under it is
	// answered 503 with Retry-After and its connection closed. A request
	// also holds about 1.4 times its body in its envelope until the broker
	// acknowledges, so ingest's memory for bodies is about 2.4 times this.
	// Defaults to DefaultMaxBufferedBodyBytes; it is raised to the largest
	// source's max_body_bytes + 1 if lower, so that every allowed body can
	// get in.
	MaxBufferedBodyBytes int64
	// MaxConns is how many connections may be open at once. A new
	// connection beyond it closes the connection that has waited longest
	// for a request (idle keep-alive, or new and silent) and takes its
	// place; when every connection is serving a request it is answered 503
	// with Retry-After and closed. Each connection that served a request
	// keeps about 24 KiB while idle on fasthttp, 19 KiB on net/http, and
	// one reading a body up to 8 KiB more. Defaults to DefaultMaxConns.
	MaxConns int
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request. Keep it above the idle timeout of the load balancers
	// in front (AWS ALB: 60s), so that they, not ingest, close idle
	// connections: a request racing ingest's close fails. Defaults to
	// 90s.
	IdleTimeout time.Duration
	// ShutdownGrace is how long Serve keeps serving after ctx ends, with
	// /readyz already answering 503, so that load balancers stop routing
	// new requests here before the listener closes. Zero closes at once.
	ShutdownGrace time.Duration
	// ShutdownTimeout bounds the drain after the grace: the requests in
	// flight finishing (each produced and answered, or answered 503) and
	// the producer flushing. Defaults to ProduceTimeout + 5s.
	ShutdownTimeout time.Duration
	// ServeMetrics also serves GET /metrics (the Gatherer) on the webhook
	// listener, which gateways and anyone else reach. Defaults to false:
	// the operator serves the Registerer on a listener of its own
	// (paystream ingest --metrics-addr).
	ServeMetrics bool
	// KafkaOpts are extra franz-go options (TLS, SASL, metrics hooks); they
	// override ingest's own.
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
	// HTTPServer is the HTTP server Serve runs: HTTPServerFast (the
	// default) or HTTPServerNet. Handler is net/http's either way.
	HTTPServer string
	// TracerProvider traces each webhook: a server span per request, and
	// kotel's producer hook starts the record's publish span under it and
	// writes its W3C traceparent header on the raw record. Nil or a no-op
	// provider turns tracing off, at no cost.
	TracerProvider trace.TracerProvider
}

// Config defaults.
const (
	DefaultLinger               = 2 * time.Millisecond
	DefaultMaxInFlight          = 2048
	DefaultMaxBufferedBodyBytes = 256 << 20
	// DefaultMaxConns keeps idle connections to about 240 MiB on fasthttp.
	DefaultMaxConns = 10000
)

// withDefaults returns c with each field left at its zero value set to
// the default its comment states.
func (c Config) withDefaults() Config {
	c.Addr = cmp.Or(c.Addr, "127.0.0.1:8080")
	c.Topic = cmp.Or(c.Topic, envelope.TopicRaw)
	c.DLQTopic = cmp.Or(c.DLQTopic, envelope.TopicDLQ)
	c.ProduceTimeout = cmp.Or(c.ProduceTimeout, 5*time.Second)
	c.RetryAfter = cmp.Or(c.RetryAfter, 5*time.Second)
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, 5*time.Second)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, 15*time.Second)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, 90*time.Second)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, c.ProduceTimeout+5*time.Second)
	switch {
	case c.Linger == 0:
		c.Linger = DefaultLinger
	case c.Linger < 0:
		c.Linger = 0
	}
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.MaxBufferedBodyBytes = cmp.Or(c.MaxBufferedBodyBytes, DefaultMaxBufferedBodyBytes)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.Registerer = cmp.Or[prometheus.Registerer](c.Registerer, prometheus.NewRegistry())
	if c.Gatherer == nil {
		c.Gatherer = prometheus.DefaultGatherer
		if g, ok := c.Registerer.(prometheus.Gatherer); ok {
			c.Gatherer = g
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.HTTPServer = cmp.Or(c.HTTPServer, HTTPServerFast)
	return c
}

// validate reports the first field of c (defaults applied) whose value
// cannot work, by name.
func (c *Config) validate() error {
	switch {
	case len(c.Sources) == 0:
		return errors.New("ingest config: Sources is required")
	case len(c.Brokers) == 0:
		return errors.New("ingest config: Brokers is required")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"ProduceTimeout", c.ProduceTimeout},
		{"RetryAfter", c.RetryAfter},
		{"ReadHeaderTimeout", c.ReadHeaderTimeout},
		{"ReadTimeout", c.ReadTimeout},
		{"IdleTimeout", c.IdleTimeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("ingest config: %s must not be negative", d.name)
		}
	}
	switch {
	case c.ShutdownGrace < 0 || c.ShutdownTimeout < 0:
		return errors.New("ingest config: ShutdownGrace and ShutdownTimeout must not be negative")
	case c.HTTPServer != HTTPServerNet && c.HTTPServer != HTTPServerFast:
		return fmt.Errorf("ingest config: HTTPServer %q: want %q or %q", c.HTTPServer, HTTPServerNet, HTTPServerFast)
	case c.MaxInFlight < 0 || c.MaxBufferedBodyBytes < 0 || c.MaxConns < 0:
		return errors.New("ingest config: MaxInFlight, MaxBufferedBodyBytes and MaxConns must not be negative")
	}
	return nil
}
