package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
)

// Event is one webhook the generator decided to send: the Step-th event
// (0 = the payment was created, 1 = paid, then refunds or repeated facts)
// of the Payment-th payment. Building an Event twice gives the same body
// and the same ids, as a gateway's retries do; only the signature of
// timestamped schemes changes, because it is made at send time.
type Event struct {
	// Seq is unique within a run; event, refund and request ids derive from it.
	Seq uint64
	// Payment is the payment's index, from 0 to the number of payments - 1.
	Payment int
	// Step is the event's position in its payment's life.
	Step int
	// OccurredAt is when the event says the fact happened.
	OccurredAt time.Time
}

// Request is a signed webhook ready to send to ingest.
type Request struct {
	// Source is the URL segment: POST /webhooks/{Source}.
	Source string
	// RawQuery is the encoded query string, without '?' (Mercado Pago's
	// data.id and type, Zoop's token with auth: query); empty for the
	// others.
	RawQuery string
	// Header carries the signature headers and Content-Type.
	Header http.Header
	// Body is the webhook body.
	Body []byte
}

// HTTPRequest returns r as a POST to baseURL (scheme, host and optional
// path prefix, e.g. http://127.0.0.1:8080).
func (r *Request) HTTPRequest(ctx context.Context, baseURL string) (*http.Request, error) {
	u := strings.TrimRight(baseURL, "/") + "/webhooks/" + r.Source
	if r.RawQuery != "" {
		u += "?" + r.RawQuery
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(r.Body))
	if err != nil {
		return nil, err
	}
	req.Header = r.Header
	return req, nil
}

// Drivers are the driver names a Builder can sign for: every driver's
// (drivers.Fixtures), sorted.
var Drivers = slices.Sorted(maps.Keys(drivers.Fixtures()))

// amountMinor is every generated payment's amount, in minor units of BRL.
const amountMinor = 100000

// idPrefixes are the event and refund id prefixes of each driver's style
// (Mercado Pago's notification ids are numbers, made apart).
var idPrefixes = map[string][2]string{
	"standardwebhooks": {"msg_", "re_"}, "hmac": {"msg_", "re_"}, "stripe": {"evt_", "re_"},
	"pagarme": {"hook_", "tran_"}, "asaas": {"evt_", "re_"}, "pagbank": {"pb_", "re_"}, "zoop": {"evt", "re_"},
}

// Builder makes signed requests for one source with its driver's payload
// format and signature scheme: the driver package's own Webhook
// (provider.FixtureFunc), so what ingest verifies is what a gateway sends.
type Builder struct {
	src     Source
	cfg     provider.Config
	webhook provider.FixtureFunc
	run     string // makes this run's ids unique: a few letters and digits
	runNum  uint64 // the same, for gateways with numeric ids
}

// NewBuilder returns a Builder for src. run distinguishes the ids of
// this run from other runs' (letters and digits, e.g. "a1b2c3"); runNum is
// the same for gateways with numeric ids.
func NewBuilder(src Source, run string, runNum uint32) (*Builder, error) {
	webhook, ok := drivers.Fixtures()[src.Driver]
	if !ok {
		return nil, fmt.Errorf("source %s: driver %q is not supported by the load generator (supported: %s)",
			src.Name, src.Driver, strings.Join(Drivers, ", "))
	}
	b := &Builder{src: src, cfg: provider.Config{Secrets: src.Secrets, Options: src.Options}, webhook: webhook, run: run, runNum: uint64(runNum)}
	// One request now names a configuration that cannot sign (no secret,
	// public keys only, hmac options) before anything is sent.
	if _, err := b.Build(Event{}, time.Now()); err != nil {
		return nil, fmt.Errorf("source %s: %w", src.Name, err)
	}
	return b, nil
}

// Source returns the source the Builder signs for.
func (b *Builder) Source() Source { return b.src }

// Build returns the request for ev, signed at now: step 0 says the payment
// was created, step 1 paid, later steps a partial refund of 1 minor unit
// each, or, for gateways whose webhooks tell no such refund (Asaas), the
// paid fact again.
func (b *Builder) Build(ev Event, now time.Time) (*Request, error) {
	if ev.Payment < 0 || ev.Step < 0 {
		return nil, errors.New("build: negative payment or step")
	}
	f := provider.Fixture{
		Kind: provider.FixtureCreated, EventID: b.eventID(ev.Seq), PaymentID: b.PaymentID(ev.Payment),
		AmountMinor: amountMinor, At: ev.OccurredAt,
	}
	switch {
	case ev.Step == 1:
		f.Kind = provider.FixturePaid
	case ev.Step > 1:
		f.Kind, f.StepMinor, f.RefundedMinor = provider.FixtureRefund, 1, int64(ev.Step-1)
		f.RefundID = b.id(idPrefixes[b.src.Driver][1], ev.Seq)
	}
	w, err := b.webhook(b.cfg, f, now)
	if errors.Is(err, provider.ErrNoFixture) && f.Kind == provider.FixtureRefund {
		f.Kind, f.Echo, f.StepMinor, f.RefundID, f.RefundedMinor = provider.FixturePaid, true, 0, "", 0
		w, err = b.webhook(b.cfg, f, now)
	}
	if err != nil {
		return nil, err
	}
	w.Header.Set("User-Agent", "paystream-loadgen")
	return &Request{Source: b.src.Name, RawQuery: w.RawQuery, Header: w.Header, Body: w.Body}, nil
}

// PaymentID returns the gateway payment id of the i-th payment, in the
// driver's style.
func (b *Builder) PaymentID(i int) string {
	n := strconv.Itoa(i)
	switch b.src.Driver {
	case "stripe":
		return "pi_lg" + b.run + "_" + n
	case "pagarme":
		return "ch_lg" + b.run + "_" + n
	case "pagbank":
		return "CHAR_LG" + strings.ToUpper(b.run) + "-" + n
	case "mercadopago":
		return strconv.FormatUint(b.runNum%900000+100000, 10) + fmt.Sprintf("%08d", i)
	case "zoop":
		return fmt.Sprintf("lg%s%016x", b.run, i)
	}
	return "pay_lg" + b.run + "_" + n
}

// eventID returns the seq-th event's id in the driver's style.
func (b *Builder) eventID(seq uint64) string {
	if b.src.Driver == "mercadopago" {
		return strconv.FormatUint(b.runNum%900000+100000, 10) + fmt.Sprintf("%012d", seq)
	}
	return b.id(idPrefixes[b.src.Driver][0], seq)
}

// id returns a string id unique in the run, with prefix.
func (b *Builder) id(prefix string, seq uint64) string {
	return prefix + "lg" + b.run + "_" + strconv.FormatUint(seq, 10)
}
