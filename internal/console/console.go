// Package console is `paystream console`: a read-only web console for
// support staff and operators. It shows a payment's story (its deliveries
// and their outcomes, its transitions and their state event ids, its
// ledger movements), the work that is stuck (held payments, quarantined
// and deferred deliveries, dead-lettered webhooks with the command that
// replays each) and the pipeline's health (per partition: owner, stored
// offset, lag, last commit; the relay's slot lag; what retention left).
//
// It writes nothing: its Postgres sessions are read-only
// (default_transaction_read_only, and docs/console.md's role has SELECT
// only), it never produces to Kafka, and no page has a form that posts,
// so there is nothing for a cross-site request to forge. Pages are
// server-rendered html/template with no script; every list is a keyset
// page, never a count(*) or an OFFSET over the deliveries table.
//
// It lives under internal/ because nothing but cmd/paystream should build
// on its handlers: it is an operator's view of the schema, which changes
// with it, not an API.
package console

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/dlq"
)

// Config configures a Server.
type Config struct {
	// Auth says who may read the console. Required.
	Auth Auth
	// Brokers are the Kafka seed brokers, for the health page's lag and
	// owners and the DLQ. Defaults to none: those sections say Kafka is
	// not configured.
	Brokers []string
	// KafkaOpts are extra franz-go options (TLS, SASL).
	KafkaOpts []kgo.Opt
	// Group is the processor's consumer group. Defaults to
	// "paystream-processor".
	Group string
	// RawTopic is the raw webhook topic. Defaults to
	// "paystream.webhooks.raw.v1".
	RawTopic string
	// DLQTopic is the dead-letter topic. Defaults to
	// "paystream.webhooks.dlq.v1".
	DLQTopic string
	// ReplaysTopic records which DLQ records were replayed. Defaults to
	// dlq.DefaultReplaysTopic.
	ReplaysTopic string
	// SourcesFile is the sources file the stuck page's replay commands
	// name (`paystream dlq replay` re-parses with its driver). Defaults to
	// "sources.yaml".
	SourcesFile string
	// DLQWindow is how far back the stuck page reads the DLQ topic.
	// Defaults to 7 days.
	DLQWindow time.Duration
	// ShowBodies shows each delivery's kept webhook body on the payment
	// page. Bodies hold customers' personal data: off unless an operator
	// turns it on. Defaults to false.
	ShowBodies bool
	// PageSize is how many rows a list shows. Defaults to 50.
	PageSize int
	// Timeout bounds the reads of one page (Postgres statements and Kafka
	// requests). Defaults to 10s.
	Timeout time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the console's metrics. Defaults to none.
	Registerer prometheus.Registerer
}

// Server serves the console. It is an http.Handler; Close it.
type Server struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	auth    *authenticator
	metrics *metrics
	pages   map[string]*template.Template
	router  chi.Router

	kcl *kgo.Client
	adm *kadm.Client
	dlq *dlq.Tool
}

//go:embed templates/*.html
var templateFS embed.FS

// New validates cfg and returns a Server reading pool. Its sessions should
// be read-only: see docs/console.md for the role. Kafka clients are created
// here and connect lazily.
func New(pool *pgxpool.Pool, cfg Config) (*Server, error) {
	if pool == nil {
		return nil, errors.New("console: no database pool")
	}
	if err := cfg.Auth.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, pool: pool, log: cfg.Logger, auth: &authenticator{auth: cfg.Auth}, metrics: m, pages: pages}
	if len(cfg.Brokers) > 0 {
		opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.KafkaOpts...)
		if s.kcl, err = kgo.NewClient(opts...); err != nil {
			return nil, fmt.Errorf("console: kafka client: %w", err)
		}
		s.adm = kadm.NewClient(s.kcl)
		s.dlq, err = dlq.Open(dlq.Config{Brokers: cfg.Brokers, KafkaOpts: cfg.KafkaOpts, DLQTopic: cfg.DLQTopic,
			RawTopic: cfg.RawTopic, ReplaysTopic: cfg.ReplaysTopic})
		if err != nil {
			s.kcl.Close()
			return nil, fmt.Errorf("console: %w", err)
		}
	}
	s.router = s.routes()
	return s, nil
}

// withDefaults returns c with each field left at its zero value set to
// the default its comment states; a negative DLQWindow, PageSize or
// Timeout takes the default too.
func (c Config) withDefaults() Config {
	c.Group = cmp.Or(c.Group, "paystream-processor")
	c.RawTopic = cmp.Or(c.RawTopic, "paystream.webhooks.raw.v1")
	c.DLQTopic = cmp.Or(c.DLQTopic, "paystream.webhooks.dlq.v1")
	c.ReplaysTopic = cmp.Or(c.ReplaysTopic, dlq.DefaultReplaysTopic)
	c.SourcesFile = cmp.Or(c.SourcesFile, "sources.yaml")
	c.DLQWindow = cmp.Or(max(c.DLQWindow, 0), 7*24*time.Hour)
	c.PageSize = cmp.Or(max(c.PageSize, 0), 50)
	c.Timeout = cmp.Or(max(c.Timeout, 0), 10*time.Second)
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.Registerer = cmp.Or[prometheus.Registerer](c.Registerer, prometheus.NewRegistry())
	return c
}

// Close releases the Kafka clients (not the pool, which is the caller's).
func (s *Server) Close() {
	if s.kcl != nil {
		s.kcl.Close()
		s.dlq.Close()
	}
}

// ServeHTTP serves the console.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.router.ServeHTTP(w, r) }

func (s *Server) routes() chi.Router {
	r := chi.NewRouter()
	// Probes: unauthenticated and say nothing but "ok".
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.Group(func(r chi.Router) {
		r.Use(s.secure)
		r.Get("/", s.page("search", s.search))
		r.Get("/payment", s.page("payment", s.payment))
		r.Get("/stuck", s.page("stuck", s.stuck))
		r.Get("/stuck/{list}", s.page("stuck_list", s.stuckList))
		r.Get("/health", s.page("health", s.health))
	})
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "not found", http.StatusNotFound) })
	r.MethodNotAllowed(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "the console is read-only", http.StatusMethodNotAllowed)
	})
	return r
}

// secure authenticates every request and sets the headers that keep pages
// out of frames and caches and forbid any script.
func (s *Server) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		user, why := s.auth.user(r)
		if user == "" {
			if s.cfg.Auth.BasicFile != "" {
				h.Set("WWW-Authenticate", `Basic realm="paystream console", charset="UTF-8"`)
			}
			s.metrics.observe("auth", http.StatusUnauthorized, 0)
			s.log.Info("console request refused", "path", r.URL.Path, "remote", r.RemoteAddr, "why", why)
			http.Error(w, "unauthorized: "+why, http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

type userKey struct{}

func userOf(ctx context.Context) string {
	u, _ := ctx.Value(userKey{}).(string)
	return u
}

// httpError is an error with the status code its page answers.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// page runs fill under the page timeout and renders its result with the
// template name, or an error page.
func (s *Server) page(name string, fill func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
		defer cancel()
		r = r.WithContext(ctx)
		data, err := fill(r)
		code := http.StatusOK
		var redirect *redirectTo
		switch {
		case errors.As(err, &redirect):
			http.Redirect(w, r, redirect.url, http.StatusSeeOther)
			s.metrics.observe(name, http.StatusSeeOther, time.Since(start).Seconds())
			return
		case err != nil:
			code = http.StatusInternalServerError
			var he *httpError
			if errors.As(err, &he) {
				code = he.code
			} else {
				s.log.Error("console page failed", "page", name, "error", err)
			}
			name, data = "error", errorPage{Code: code, Message: err.Error()}
		}
		s.render(w, r, code, name, data)
		s.metrics.observe(name, code, time.Since(start).Seconds())
	}
}

// redirectTo is fill's way to answer with a redirect.
type redirectTo struct{ url string }

func (r *redirectTo) Error() string { return "redirect to " + r.url }

type errorPage struct {
	Code    int
	Message string
}

// layout is what every page's template gets: the page's own data and the
// frame's.
type layout struct {
	Title string
	User  string
	Now   time.Time
	Nav   string
	Data  any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, code int, name string, data any) {
	t, ok := s.pages[name]
	if !ok {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	title := pageTitles[name]
	if p, ok := data.(titled); ok {
		title = p.title()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if err := t.ExecuteTemplate(w, "layout", layout{Title: title, User: userOf(r.Context()), Now: s.cfg.Now(), Nav: navOf[name], Data: data}); err != nil {
		s.log.Error("render console page", "page", name, "error", err)
	}
}

type titled interface{ title() string }

var pageTitles = map[string]string{
	"search": "Search", "payment": "Payment", "stuck": "Stuck work", "stuck_list": "Stuck work",
	"health": "Health", "error": "Error",
}

var navOf = map[string]string{"search": "search", "payment": "search", "stuck": "stuck", "stuck_list": "stuck", "health": "health"}

func parseTemplates() (map[string]*template.Template, error) {
	base, err := template.New("base").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse layout: %w", err)
	}
	out := map[string]*template.Template{}
	for name := range pageTitles {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}
