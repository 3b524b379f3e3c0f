package source

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Refetch defaults and bounds.
const (
	// DefaultRefetchRate is refetch_rate when unset: requests per second to
	// the gateway's API, per source.
	DefaultRefetchRate = 10.0
	// MaxRefetchRate bounds refetch_rate.
	MaxRefetchRate = 100_000.0
	// DefaultRefetchTimeout is refetch_timeout when unset: the deadline of
	// one API request.
	DefaultRefetchTimeout = 5 * time.Second
)

// RefetchConfig is how paystream reads a source's payments back from the
// gateway's API (see provider.Refetcher). Source.Refetch holds it when
// refetching is on: the source says `refetch: true`, or its driver always
// refetches (Mercado Pago, whose webhook bodies are not signed) and the
// source sets api_token. A Mercado Pago source without any of the API keys
// loads with Source.Refetch nil: it cannot refetch, and its events (all
// marked NeedsRefetch) stay deferred.
//
// Token is a credential: String, GoString and LogValue redact it, and it is
// not marshaled to JSON. Never log it.
type RefetchConfig struct {
	// Refetcher is the source's driver, which builds the API request and
	// parses the answer into facts.
	Refetcher provider.Refetcher `json:"-"`
	// BaseURL is api_base_url; empty means the driver's default (Mercado
	// Pago's public API). Tests point it at a gatewaytest server.
	BaseURL string `json:"base_url,omitempty"`
	// Token is api_token, resolved (env:NAME and file:PATH already read):
	// the API credential, sent as a Bearer token.
	Token string `json:"-"`
	// Rate is refetch_rate, the most API requests per second for this
	// source (DefaultRefetchRate when unset).
	Rate float64 `json:"rate"`
	// Burst is refetch_burst, how many requests may go at once above Rate
	// (ceil(Rate) when unset, at least 1).
	Burst int `json:"burst"`
	// Timeout is refetch_timeout, the deadline of one request
	// (DefaultRefetchTimeout when unset).
	Timeout time.Duration `json:"timeout"`
}

// Request builds the API request for one payment: the Refetcher's
// RefetchRequest with this source's base URL and token. The caller applies
// Timeout (a context deadline or an http.Client timeout), the rate limiter
// and the circuit breaker.
func (c *RefetchConfig) Request(ctx context.Context, paymentID string) (*http.Request, error) {
	return c.Refetcher.RefetchRequest(ctx, c.BaseURL, c.Token, paymentID)
}

// String describes c without its token.
func (c RefetchConfig) String() string {
	return fmt.Sprintf("refetch{base_url=%q token=[redacted] rate=%g burst=%d timeout=%s}", c.BaseURL, c.Rate, c.Burst, c.Timeout)
}

// GoString is String, so %#v does not print the token either.
func (c RefetchConfig) GoString() string { return c.String() }

// LogValue describes c to log/slog without its token.
func (c RefetchConfig) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", c.BaseURL),
		slog.String("token", "[redacted]"),
		slog.Float64("rate", c.Rate),
		slog.Int("burst", c.Burst),
		slog.Duration("timeout", c.Timeout),
	)
}

// alwaysRefetcher is implemented by drivers whose every event must be
// refetched whatever the source says (mercadopago.Driver).
type alwaysRefetcher interface{ AlwaysRefetch() bool }

// refetchProbeID is the payment id buildRefetch builds a request for, to
// check api_base_url and api_token when the file is loaded rather than at
// the first refetch.
const refetchProbeID = "1"

// buildRefetch validates a source's refetch keys against its driver and
// returns its RefetchConfig, nil when refetching is off. Errors name the
// source and the field, never the token.
func buildRefetch(where string, fs fileSource, driver provider.Driver) (*RefetchConfig, error) {
	rf, can := driver.(provider.Refetcher)
	always := false
	if a, ok := driver.(alwaysRefetcher); ok {
		always = a.AlwaysRefetch()
	}
	switch {
	case fs.Refetch != nil && *fs.Refetch && !can:
		return nil, fmt.Errorf("%s: refetch: driver %s cannot refetch payments (it does not implement provider.Refetcher)", where, fs.Driver)
	case always && !can:
		return nil, fmt.Errorf("%s: driver %s must refetch but cannot (it does not implement provider.Refetcher)", where, fs.Driver)
	case fs.Refetch != nil && !*fs.Refetch && always:
		return nil, fmt.Errorf("%s: refetch: driver %s always refetches (its webhooks cannot be trusted alone); remove refetch: false", where, fs.Driver)
	}
	keys := []struct {
		key string
		set bool
	}{
		{"api_base_url", fs.APIBaseURL != ""},
		{"api_token", fs.APIToken != ""},
		{"refetch_rate", fs.RefetchRate != nil},
		{"refetch_burst", fs.RefetchBurst != nil},
		{"refetch_timeout", fs.RefetchTimeout != ""},
	}
	configured := false
	for _, k := range keys {
		configured = configured || k.set
	}
	switch {
	case fs.Refetch != nil && *fs.Refetch:
	case always && configured:
	case always:
		// A driver that always refetches, with no API settings at all:
		// the source loads (tools that only sign webhooks, such as the
		// load generator, need no API token) but cannot refetch; its
		// events stay deferred until refetching is configured.
		return nil, nil
	default:
		for _, k := range keys {
			if k.set {
				return nil, fmt.Errorf("%s: %s is set but refetch is off (add refetch: true)", where, k.key)
			}
		}
		return nil, nil
	}

	c := &RefetchConfig{Refetcher: rf, BaseURL: fs.APIBaseURL, Rate: DefaultRefetchRate, Timeout: DefaultRefetchTimeout}
	if fs.APIToken == "" {
		return nil, fmt.Errorf("%s: api_token: required when refetch is on (the gateway API credential: literal, env:NAME or file:PATH)", where)
	}
	token, err := resolveSecret(fs.APIToken)
	if err != nil {
		return nil, fmt.Errorf("%s: api_token: %w", where, err)
	}
	c.Token = token
	if fs.RefetchRate != nil {
		r := *fs.RefetchRate
		if !(r > 0 && r <= MaxRefetchRate) {
			return nil, fmt.Errorf("%s: refetch_rate: want a number of requests per second above 0 and at most %g", where, MaxRefetchRate)
		}
		c.Rate = r
	}
	c.Burst = max(1, int(math.Ceil(c.Rate)))
	if fs.RefetchBurst != nil {
		if *fs.RefetchBurst < 1 {
			return nil, fmt.Errorf("%s: refetch_burst: want at least 1", where)
		}
		c.Burst = *fs.RefetchBurst
	}
	if fs.RefetchTimeout != "" {
		d, err := time.ParseDuration(fs.RefetchTimeout)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%s: refetch_timeout %q: want a positive duration such as 5s", where, fs.RefetchTimeout)
		}
		c.Timeout = d
	}
	// Build one request now, so a bad URL or token fails the load, not the
	// first refetch: first with a well-formed stand-in token (a failure is
	// the URL's), then with the real one (a failure is the token's).
	if _, err := rf.RefetchRequest(context.Background(), c.BaseURL, "probe-token", refetchProbeID); err != nil {
		return nil, fmt.Errorf("%s: api_base_url: %v", where, err)
	}
	if _, err := rf.RefetchRequest(context.Background(), c.BaseURL, c.Token, refetchProbeID); err != nil {
		return nil, fmt.Errorf("%s: api_token: %v", where, err)
	}
	return c, nil
}
