// Package reconcile checks that what paystream stored agrees with itself
// and with the outside world, and reports every disagreement (drift). It
// writes nothing; `paystream reconcile` runs it.
//
// The checks:
//
//   - Ledger: each payment's ledger movements must add up, per account and
//     currency, to the balances its state implies (payment.State.Balances:
//     a paid payment's capture sits in gateway_receivable and
//     merchant_payable, a refunded one nets to zero, an open dispute sits in
//     dispute_reserve, ...), and its transitions must run 1..version with
//     the indexed columns equal to the state.
//   - Waiting: payments held (a quarantined event waits for replay) or with
//     deferred events, for longer than OlderThan.
//   - State events: every transition recorded since Since must have its
//     state event "{payment key}:{version}" on the state topic, read as a
//     read_committed consumer does; an event id seen twice is drift too.
//   - DLQ: the dead-letter records produced since Since that `paystream dlq
//     replay` never replayed (it records each replay on a compacted topic,
//     package dlq).
//   - Gateway (optional): the payments not in a final status of the sources
//     that can refetch are read back from their gateway's API; facts the
//     gateway knows and paystream never applied mean webhooks that never
//     arrived. Gateways' APIs only fetch one payment, so this is one request
//     per open payment, rate limited like the processor's refetches.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/dlq"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/store"
)

// Config configures Run.
type Config struct {
	// DB is where paystream's schema lives. Required.
	DB store.DB
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// KafkaOpts are extra franz-go options (TLS, SASL).
	KafkaOpts []kgo.Opt
	// StateTopic and DLQTopic are the topics to read. Required.
	StateTopic, DLQTopic string
	// ReplaysTopic is where `paystream dlq replay` records its replays.
	// Defaults to dlq.DefaultReplaysTopic.
	ReplaysTopic string
	// OlderThan is how long a payment may wait (held or deferred) before it
	// is drift. Defaults to one hour.
	OlderThan time.Duration
	// Since bounds the state-event, DLQ and gateway checks to what happened
	// in the last Since. Defaults to 24 hours.
	Since time.Duration
	// Settle leaves out transitions younger than this from the state-event
	// check: the sink relays them a moment after they commit. Zero judges
	// every transition (use it only when the sink has caught up).
	Settle time.Duration
	// Gateway holds the refetch configuration of the sources to sweep; nil
	// or empty skips the gateway sweep.
	Gateway map[string]*source.RefetchConfig
	// GatewayLimit is the most payments the sweep reads back. Defaults to
	// 1000.
	GatewayLimit int
	// HTTPClient makes the gateway requests. Defaults to a client with no
	// overall timeout (each request has its source's Timeout).
	HTTPClient *http.Client
	// Progress receives a line per step and, on long steps, a line every
	// few seconds. Nil discards them.
	Progress io.Writer
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Report is what Run found. Its JSON form is `paystream reconcile --json`.
type Report struct {
	CheckedAt time.Time `json:"checked_at"`
	// Since is the start of the window of the state-event, DLQ and
	// gateway checks.
	Since time.Time `json:"since"`
	// OlderThan is how long a payment may wait before it is drift.
	OlderThan string `json:"older_than"`

	Ledger      LedgerCheck      `json:"ledger"`
	Waiting     WaitingCheck     `json:"waiting"`
	StateEvents StateEventsCheck `json:"state_events"`
	DLQ         DLQCheck         `json:"dlq"`
	// Gateway is nil when the sweep did not run.
	Gateway *GatewayCheck `json:"gateway,omitempty"`
}

// Drift reports whether any check found drift.
func (r *Report) Drift() bool {
	return r.Ledger.Drifted > 0 || len(r.Waiting.Payments) > 0 ||
		r.StateEvents.Missing > 0 || len(r.StateEvents.Duplicated) > 0 || r.DLQ.NotReplayed > 0 ||
		(r.Gateway != nil && len(r.Gateway.Drift) > 0)
}

// LedgerCheck is the result of the ledger check.
type LedgerCheck struct {
	// Payments is how many payments were checked.
	Payments int `json:"payments_checked"`
	// Drifted is how many of them disagree with their state.
	Drifted int `json:"drifted"`
	// Drift lists them (at most maxListed).
	Drift []PaymentDrift `json:"drift"`
}

// WaitingCheck is the result of the waiting check.
type WaitingCheck struct {
	// Payments are those waiting longer than OlderThan (at most
	// maxListed), oldest first.
	Payments []store.Waiting `json:"payments"`
}

// Defaults and bounds.
const (
	DefaultOlderThan    = time.Hour
	DefaultSince        = 24 * time.Hour
	DefaultGatewayLimit = 1000
	// maxListed bounds each list in a report; counts are not bounded.
	maxListed = 1000
	// pageSize is how many payments one ledger-check round trip reads.
	pageSize = 1000
	// progressEvery is how often a long step reports progress.
	progressEvery = 5 * time.Second
)

// Run runs every check and returns the report. An error means a check
// could not run (a store or broker unreachable), not that it found drift:
// see Report.Drift.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	now := cfg.Now()
	r := &Report{CheckedAt: now.UTC(), Since: now.Add(-cfg.Since).UTC(), OlderThan: cfg.OlderThan.String()}
	p := progress{w: cfg.Progress}

	p.step("ledger: checking every payment's movements against its state")
	var err error
	if r.Ledger, err = checkLedger(ctx, cfg.DB, &p); err != nil {
		return nil, err
	}
	p.step("waiting: payments held or deferred for longer than %s", cfg.OlderThan)
	waiting, err := store.WaitingSince(ctx, cfg.DB, now.Add(-cfg.OlderThan), maxListed)
	if err != nil {
		return nil, err
	}
	r.Waiting.Payments = nonNil(waiting)

	kcl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.KafkaOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer kcl.Close()
	p.step("state events: transitions since %s against %s (read_committed)", r.Since.Format(time.RFC3339), cfg.StateTopic)
	if r.StateEvents, err = checkStateEvents(ctx, cfg, kcl, r.Since, now.Add(-cfg.Settle), &p); err != nil {
		return nil, err
	}
	p.step("dlq: records on %s since %s never replayed", cfg.DLQTopic, r.Since.Format(time.RFC3339))
	if r.DLQ, err = checkDLQ(ctx, cfg, r.Since, &p); err != nil {
		return nil, err
	}
	if len(cfg.Gateway) > 0 {
		p.step("gateway: reading open payments back from their gateway's API")
		g, err := sweepGateway(ctx, cfg, r.Since, &p)
		if err != nil {
			return nil, err
		}
		r.Gateway = &g
	}
	return r, nil
}

func (cfg *Config) defaults() error {
	switch {
	case cfg.DB == nil:
		return errors.New("reconcile config: DB is required")
	case len(cfg.Brokers) == 0:
		return errors.New("reconcile config: Brokers is required")
	case cfg.StateTopic == "" || cfg.DLQTopic == "":
		return errors.New("reconcile config: StateTopic and DLQTopic are required")
	case cfg.OlderThan < 0 || cfg.Since < 0 || cfg.Settle < 0 || cfg.GatewayLimit < 0:
		return errors.New("reconcile config: durations and limits must not be negative")
	}
	if cfg.ReplaysTopic == "" {
		cfg.ReplaysTopic = dlq.DefaultReplaysTopic
	}
	if cfg.OlderThan == 0 {
		cfg.OlderThan = DefaultOlderThan
	}
	if cfg.Since == 0 {
		cfg.Since = DefaultSince
	}
	if cfg.GatewayLimit == 0 {
		cfg.GatewayLimit = DefaultGatewayLimit
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return nil
}

// checkLedger pages through every payment, checking each page's ledger
// sums and transitions in two more round trips.
func checkLedger(ctx context.Context, db store.DB, p *progress) (LedgerCheck, error) {
	out := LedgerCheck{Drift: []PaymentDrift{}}
	after := ""
	for {
		page, err := store.PaymentsAfter(ctx, db, after, pageSize)
		if err != nil || len(page) == 0 {
			return out, err
		}
		keys := make([]string, len(page))
		for i, row := range page {
			keys[i] = row.PaymentKey
		}
		balances, err := store.LedgerBalances(ctx, db, keys)
		if err != nil {
			return out, err
		}
		spans, err := store.TransitionSpans(ctx, db, keys)
		if err != nil {
			return out, err
		}
		for _, row := range page {
			d, ok := CheckPayment(row, balances[row.PaymentKey], spans[row.PaymentKey])
			if ok {
				continue
			}
			out.Drifted++
			if len(out.Drift) < maxListed {
				out.Drift = append(out.Drift, d)
			}
		}
		out.Payments += len(page)
		after = keys[len(keys)-1]
		p.tick("ledger: %d payments checked, %d drifted", out.Payments, out.Drifted)
	}
}

// progress writes progress lines: every step, and a step's ticks at most
// every progressEvery.
type progress struct {
	w    io.Writer
	last time.Time
}

func (p *progress) step(format string, args ...any) {
	if p.w != nil {
		fmt.Fprintf(p.w, "reconcile: "+format+"\n", args...)
		p.last = time.Now()
	}
}

func (p *progress) tick(format string, args ...any) {
	if p.w != nil && time.Since(p.last) >= progressEvery {
		p.step(format, args...)
	}
}

// nonNil makes an empty list marshal as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
