package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/store"
)

// finalStatuses are the statuses after which a gateway is not expected to
// report anything new, so the sweep leaves them out.
var finalStatuses = []string{
	string(payment.StatusFailed), string(payment.StatusCanceled),
	string(payment.StatusRefunded), string(payment.StatusDisputeLost),
}

// maxGatewayBody bounds a gateway API answer, as the processor's refetch
// does.
const maxGatewayBody = 1 << 20

// GatewayCheck is the result of the gateway sweep.
type GatewayCheck struct {
	// Payments is how many open payments were read back.
	Payments int `json:"payments_checked"`
	// Failed lists the payments whose gateway could not answer (an error,
	// a timeout); they are not drift, only unchecked.
	Failed []GatewayFailure `json:"failed"`
	// Drift lists the payments the gateway knows more about.
	Drift []GatewayDrift `json:"drift"`
}

// GatewayDrift is a payment whose gateway reports facts paystream never
// applied: webhooks that were never delivered (or never accepted).
type GatewayDrift struct {
	PaymentKey string `json:"payment_key"`
	// Status is paystream's status; GatewayStatus the status after
	// applying what the gateway says.
	Status        string `json:"status"`
	GatewayStatus string `json:"gateway_status"`
	// Missing are the kinds of the transitions the gateway's facts would
	// make, e.g. "capture", "refund".
	Missing []string `json:"missing"`
}

// GatewayFailure is a payment the sweep could not read back.
type GatewayFailure struct {
	PaymentKey string `json:"payment_key"`
	Error      string `json:"error"`
}

// sweepGateway reads each open payment of the configured sources back
// from its gateway and replays the answer on the stored state, as the
// processor's refetch would: a transition means drift.
func sweepGateway(ctx context.Context, cfg Config, since time.Time, p *progress) (GatewayCheck, error) {
	out := GatewayCheck{Failed: []GatewayFailure{}, Drift: []GatewayDrift{}}
	sources := slices.Sorted(maps.Keys(cfg.Gateway))
	open, err := store.OpenPayments(ctx, cfg.DB, sources, finalStatuses, since, cfg.GatewayLimit)
	if err != nil {
		return out, err
	}
	limiters := map[string]*rate.Limiter{}
	for name, rc := range cfg.Gateway {
		limiters[name] = rate.NewLimiter(rate.Limit(rc.Rate), max(rc.Burst, 1))
	}
	var m payment.Machine
	for i, row := range open {
		p.tick("gateway: %d of %d payments read back", i, len(open))
		rc := cfg.Gateway[row.Source]
		if err := limiters[row.Source].Wait(ctx); err != nil {
			return out, fmt.Errorf("gateway sweep: %w", err)
		}
		facts, err := fetchFacts(ctx, cfg.HTTPClient, rc, row.PaymentID)
		out.Payments++
		if err != nil {
			if ctx.Err() != nil {
				return out, fmt.Errorf("gateway sweep: %w", ctx.Err())
			}
			if len(out.Failed) < maxListed {
				out.Failed = append(out.Failed, GatewayFailure{PaymentKey: row.PaymentKey, Error: err.Error()})
			}
			continue
		}
		var st payment.State
		if err := json.Unmarshal(row.State, &st); err != nil {
			continue // the ledger check reports it
		}
		replayed := m.Replay(st, facts)
		if len(replayed.Transitions) == 0 {
			continue
		}
		d := GatewayDrift{PaymentKey: row.PaymentKey, Status: row.Status, GatewayStatus: string(replayed.State.Status)}
		for _, t := range replayed.Transitions {
			d.Missing = append(d.Missing, t.Kind)
		}
		if len(out.Drift) < maxListed {
			out.Drift = append(out.Drift, d)
		}
	}
	return out, nil
}

// errGatewayNotFound is a gateway answering 404 for a payment paystream
// knows.
var errGatewayNotFound = errors.New("gateway does not know the payment (404)")

// fetchFacts asks rc's gateway for paymentID's facts, within rc.Timeout.
func fetchFacts(ctx context.Context, client *http.Client, rc *source.RefetchConfig, paymentID string) ([]payment.Fact, error) {
	ctx, cancel := context.WithTimeout(ctx, rc.Timeout)
	defer cancel()
	req, err := rc.Request(ctx, paymentID)
	if err != nil {
		return nil, fmt.Errorf("build gateway request: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gateway request: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxGatewayBody))
	if err != nil {
		return nil, fmt.Errorf("read gateway answer: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, errGatewayNotFound
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("gateway answered %d", resp.StatusCode)
	}
	return rc.Refetcher.ParseRefetch(body)
}
