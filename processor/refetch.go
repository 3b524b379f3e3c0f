package processor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/source"
)

// maxRefetchBody bounds a gateway API answer.
const maxRefetchBody = 1 << 20

// errNoRefetch means the source cannot refetch.
var errNoRefetch = errors.New("source has no refetch configured")

// errGatewayNotFound means the gateway's API does not know the payment.
var errGatewayNotFound = errors.New("refetch: gateway does not know the payment (404)")

// refetcher reads payments back from gateways' APIs, always outside any
// database transaction, through a per-source rate limiter, a per-request
// timeout and a per-source circuit breaker, so a slow or failing gateway
// costs bounded time and is left alone while it recovers.
type refetcher struct {
	sources  map[string]*source.RefetchConfig
	client   *http.Client
	limiters map[string]*rate.Limiter
	breakers map[string]*gobreaker.CircuitBreaker[[]payment.Fact]
	log      *slog.Logger
	metrics  *metrics
}

func newRefetcher(sources map[string]*source.RefetchConfig, client *http.Client, log *slog.Logger, m *metrics) *refetcher {
	r := &refetcher{
		sources:  sources,
		client:   client,
		limiters: map[string]*rate.Limiter{},
		breakers: map[string]*gobreaker.CircuitBreaker[[]payment.Fact]{},
		log:      log,
		metrics:  m,
	}
	for name, cfg := range sources {
		r.limiters[name] = rate.NewLimiter(rate.Limit(cfg.Rate), max(cfg.Burst, 1))
		r.breakers[name] = gobreaker.NewCircuitBreaker[[]payment.Fact](gobreaker.Settings{
			Name:        name,
			MaxRequests: 1,
			Interval:    time.Minute,
			Timeout:     30 * time.Second,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 5 },
			// A well-formed "no" (an unusable answer, an unknown payment)
			// says the data is bad, not that the gateway is down.
			IsExcluded: func(err error) bool {
				return errors.Is(err, provider.ErrUnprocessable) || errors.Is(err, errGatewayNotFound)
			},
			OnStateChange: func(name string, from, to gobreaker.State) {
				log.Warn("refetch circuit breaker", "source", name, "from", from.String(), "to", to.String())
			},
		})
	}
	return r
}

// can reports whether source refetches.
func (r *refetcher) can(sourceName string) bool {
	return r != nil && r.sources[sourceName] != nil
}

// fetch asks source's gateway for the payment's current facts.
func (r *refetcher) fetch(ctx context.Context, sourceName, paymentID string) ([]payment.Fact, error) {
	cfg := r.sources[sourceName]
	if cfg == nil {
		return nil, errNoRefetch
	}
	start := time.Now()
	outcome := "ok"
	defer func() {
		r.metrics.refetches.WithLabelValues(sourceName, outcome).Inc()
		r.metrics.refetchSeconds.Observe(time.Since(start).Seconds())
	}()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if err := r.limiters[sourceName].Wait(ctx); err != nil {
		outcome = "rate_limited"
		return nil, fmt.Errorf("refetch rate limit: %w", err)
	}
	facts, err := r.breakers[sourceName].Execute(func() ([]payment.Fact, error) {
		req, err := cfg.Request(ctx, paymentID)
		if err != nil {
			return nil, fmt.Errorf("build refetch request: %w", err)
		}
		resp, err := r.client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("refetch: %w", err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxRefetchBody))
		if err != nil {
			return nil, fmt.Errorf("read refetch answer: %w", err)
		}
		if resp.StatusCode == http.StatusNotFound {
			return nil, errGatewayNotFound
		}
		if resp.StatusCode/100 != 2 {
			return nil, fmt.Errorf("refetch: gateway answered %d", resp.StatusCode)
		}
		if c, ok := cfg.Refetcher.(provider.RefetchChecker); ok {
			return c.ParseRefetchFor(paymentID, body)
		}
		return cfg.Refetcher.ParseRefetch(body)
	})
	switch {
	case errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests):
		outcome = "breaker_open"
	case err != nil:
		outcome = "error"
	}
	if err != nil {
		r.log.Warn("refetch failed", "source", sourceName, "error", err)
		return nil, err
	}
	return facts, nil
}
