package loadgen

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/paystream/paystream/internal/provider/standardwebhooks"
)

// The events of a Lifecycle payment, in the order they are first sent.
const (
	// StepCreated is payment.created: the payment becomes pending.
	StepCreated = iota
	// StepPaid is payment.paid: the amount is captured.
	StepPaid
	// StepRefunded is payment.refunded with a refund id: the whole amount
	// is refunded.
	StepRefunded
	// StepLateCreated is a second payment.created, with its own event id
	// and the creation's timestamp, arriving after the refund: the rules
	// ignore it as stale, so it makes no transition.
	StepLateCreated
	// LifecycleSteps is the number of distinct events of a payment.
	LifecycleSteps
)

// LifecycleTransitions is the number of transitions a Lifecycle payment
// makes: created, paid and refunded each make one; the late created none.
const LifecycleTransitions = 3

// LifecycleConfig configures a Lifecycle.
type LifecycleConfig struct {
	// Builder signs the deliveries; its source must use the
	// standardwebhooks driver. Required.
	Builder *Builder
	// Payments is the number of payments; each has LifecycleSteps
	// distinct events. Required.
	Payments int
	// Repeats is the fraction of deliveries, in [0, 1), that re-send an
	// event already delivered (same webhook-id and body, a fresh
	// signature), drawn from the last few thousand events sent. Defaults
	// to 0.
	Repeats float64
	// BodyBytes pads every body with a "metadata" object (random letters,
	// so compression does not erase it) to about this many bytes. Bodies
	// are never shortened. Defaults to 0: no padding.
	BodyBytes int
	// Seed chooses which deliveries are repeats and of what; the same
	// Seed gives the same schedule. Defaults to 1.
	Seed uint64
	// Start is when the first payment was created, the base of the
	// bodies' timestamps. Defaults to an hour before NewLifecycle.
	Start time.Time
}

// Lifecycle is a fixed schedule of Standard Webhooks deliveries: every
// payment goes created → paid → refunded → a late created, payments
// advancing in turn (all the creations, then all the captures, and so on),
// with a fixed fraction of the deliveries re-sending a recent event as
// gateways' retries do. Delivery i is the same request (but for its
// signature, made at send time) whichever target it is sent to, so two
// targets driven by one Lifecycle receive the same workload. It implements
// Schedule and is safe for concurrent use.
type Lifecycle struct {
	b        *Builder
	secret   string // the source's signing secret
	cfg      LifecycleConfig
	payments int
	// events[i] is the index, in first-sent order, of the event delivery i
	// carries: step events[i] / payments of payment events[i] % payments.
	events []int32
	repeat []bool
}

// NewLifecycle validates cfg and builds the schedule.
func NewLifecycle(cfg LifecycleConfig) (*Lifecycle, error) {
	switch {
	case cfg.Builder == nil:
		return nil, errors.New("lifecycle config: Builder is required")
	case cfg.Builder.src.Driver != "standardwebhooks":
		return nil, fmt.Errorf("lifecycle config: source %s uses driver %q: want standardwebhooks", cfg.Builder.src.Name, cfg.Builder.src.Driver)
	case cfg.Payments <= 0:
		return nil, errors.New("lifecycle config: Payments must be positive")
	case cfg.Repeats < 0 || cfg.Repeats >= 1 || math.IsNaN(cfg.Repeats):
		return nil, fmt.Errorf("lifecycle config: Repeats %v: want a fraction in [0, 1)", cfg.Repeats)
	case cfg.Payments*LifecycleSteps > math.MaxInt32:
		return nil, errors.New("lifecycle config: too many payments")
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if cfg.Start.IsZero() {
		cfg.Start = time.Now().Add(-time.Hour)
	}
	cfg.Start = cfg.Start.UTC().Truncate(time.Millisecond)

	unique := cfg.Payments * LifecycleSteps
	repeats := RepeatsFor(unique, cfg.Repeats)
	total := unique + repeats
	secret, err := standardwebhooks.SigningSecret(cfg.Builder.cfg.Secrets)
	if err != nil {
		return nil, fmt.Errorf("lifecycle config: source %s: %w", cfg.Builder.src.Name, err)
	}
	l := &Lifecycle{b: cfg.Builder, secret: secret, cfg: cfg, payments: cfg.Payments,
		events: make([]int32, 0, total), repeat: make([]bool, 0, total)}

	// Choose exactly `repeats` of the positions 1..total-1 (the first
	// delivery has nothing to repeat) by selection sampling, and for each
	// one a recent event, as Generator does.
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	next, left := 0, repeats
	for pos := range total {
		if pos > 0 && left > 0 && rng.IntN(total-pos) < left {
			left--
			lo := max(0, next-recentEvents)
			l.events = append(l.events, int32(lo+rng.IntN(next-lo)))
			l.repeat = append(l.repeat, true)
			continue
		}
		l.events = append(l.events, int32(next))
		l.repeat = append(l.repeat, false)
		next++
	}
	return l, nil
}

// RepeatsFor returns how many repeated deliveries make them the fraction
// repeats of all deliveries when unique events are each delivered once
// more: round(unique · repeats / (1 − repeats)).
func RepeatsFor(unique int, repeats float64) int {
	return int(math.Round(float64(unique) * repeats / (1 - repeats)))
}

// Len returns the number of deliveries.
func (l *Lifecycle) Len() int { return len(l.events) }

// Payments returns the number of payments.
func (l *Lifecycle) Payments() int { return l.payments }

// Repeat reports whether delivery i re-sends an event delivered before.
func (l *Lifecycle) Repeat(i int) bool { return l.repeat[i] }

// Event returns the payment index and step of delivery i.
func (l *Lifecycle) Event(i int) (paymentIndex, step int) {
	e := int(l.events[i])
	return e % l.payments, e / l.payments
}

// EventID returns the webhook-id of delivery i: the same for a repeat as
// for the delivery it repeats.
func (l *Lifecycle) EventID(i int) string {
	return l.b.id("msg_", uint64(l.events[i]))
}

// PaymentID returns the gateway payment id of the p-th payment; the
// payment key is "{source}:{PaymentID}".
func (l *Lifecycle) PaymentID(p int) string { return l.b.PaymentID(p) }

// Request returns delivery i, signed at now.
func (l *Lifecycle) Request(i int, now time.Time) (*Request, error) {
	if i < 0 || i >= len(l.events) {
		return nil, fmt.Errorf("lifecycle: no delivery %d", i)
	}
	p, step := l.Event(i)
	body := l.body(p, step)
	id := l.EventID(i)
	sig, err := standardwebhooks.Sign(l.secret, id, now, body)
	if err != nil {
		return nil, err
	}
	h := http.Header{"Content-Type": {"application/json"}, "User-Agent": {"paystream-loadgen"}}
	h[http.CanonicalHeaderKey(standardwebhooks.HeaderID)] = []string{id}
	h[http.CanonicalHeaderKey(standardwebhooks.HeaderTimestamp)] = []string{strconv.FormatInt(now.Unix(), 10)}
	h[http.CanonicalHeaderKey(standardwebhooks.HeaderSignature)] = []string{sig}
	return &Request{Source: l.b.src.Name, Header: h, Body: body}, nil
}

// body is the payload-convention body of payment p's step: the same bytes
// every time it is asked for.
func (l *Lifecycle) body(p, step int) []byte {
	pid := l.b.PaymentID(p)
	created := l.cfg.Start.Add(time.Duration(p) * time.Millisecond)
	var b []byte
	switch step {
	case StepCreated, StepLateCreated:
		b = fmt.Appendf(nil, `{"type":"payment.created","timestamp":%q,"data":{"payment_id":%q,"amount":%d,"currency":"BRL"`,
			created.Format(time.RFC3339Nano), pid, amountMinor)
	case StepPaid:
		b = fmt.Appendf(nil, `{"type":"payment.paid","timestamp":%q,"data":{"payment_id":%q,"amount":%d,"currency":"BRL"`,
			created.Add(time.Minute).Format(time.RFC3339Nano), pid, amountMinor)
	default:
		b = fmt.Appendf(nil, `{"type":"payment.refunded","timestamp":%q,"data":{"payment_id":%q,"amount":%d,"currency":"BRL","refund_id":%q,"refund_amount":%d`,
			created.Add(2*time.Minute).Format(time.RFC3339Nano), pid, amountMinor, "re_lg"+l.b.run+"_"+strconv.Itoa(p), amountMinor)
	}
	const open, closing = `,"metadata":{"note":"`, `"}}}`
	if pad := l.cfg.BodyBytes - len(b) - len(open) - len(closing); pad > 0 {
		b = append(b, open...)
		rng := rand.New(rand.NewPCG(uint64(p), uint64(step)))
		const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "
		for range pad {
			b = append(b, letters[rng.IntN(len(letters))])
		}
		return append(b, closing...)
	}
	return append(b, "}}"...)
}
