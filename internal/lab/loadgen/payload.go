package loadgen

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider/asaas"
	"github.com/paystream/paystream/internal/provider/hmac"
	"github.com/paystream/paystream/internal/provider/mercadopago"
	"github.com/paystream/paystream/internal/provider/pagarme"
	"github.com/paystream/paystream/internal/provider/pagbank"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/provider/stripe"
	"github.com/paystream/paystream/internal/provider/zoop"
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

// Drivers are the driver names a Builder can sign for.
var Drivers = []string{"standardwebhooks", "stripe", "hmac", "pagarme", "asaas", "pagbank", "mercadopago", "zoop"}

// amountMinor is every generated payment's amount, in minor units of BRL.
const amountMinor = 100000

// Builder makes signed requests for one source with its driver's payload
// format and signature scheme, using the driver package's own Sign helper.
type Builder struct {
	src    Source
	secret string
	run    string // makes this run's ids unique: a few letters and digits
	runNum uint64 // the same, for gateways with numeric ids
	build  func(b *Builder, ev Event, now time.Time) (*Request, error)
}

// NewBuilder returns a Builder for src. run distinguishes the ids of
// this run from other runs' (letters and digits, e.g. "a1b2c3"); runNum is
// the same for gateways with numeric ids.
func NewBuilder(src Source, run string, runNum uint32) (*Builder, error) {
	if len(src.Secrets) == 0 {
		return nil, fmt.Errorf("source %s: no secret to sign with", src.Name)
	}
	b := &Builder{src: src, secret: src.Secrets[0], run: run, runNum: uint64(runNum)}
	switch src.Driver {
	case "standardwebhooks":
		b.secret = ""
		for _, s := range src.Secrets {
			if strings.HasPrefix(s, standardwebhooks.PrefixSecret) || strings.HasPrefix(s, standardwebhooks.PrefixPrivateKey) {
				b.secret = s
				break
			}
		}
		if b.secret == "" {
			return nil, fmt.Errorf("source %s: only public keys (%s…) configured: cannot sign", src.Name, standardwebhooks.PrefixPublicKey)
		}
		b.build = (*Builder).standardWebhooks
	case "hmac":
		if src.Options[hmac.OptionHeader] == "" {
			return nil, fmt.Errorf("source %s: hmac option %q is required", src.Name, hmac.OptionHeader)
		}
		if _, err := hmac.Sign(b.secret, src.Options[hmac.OptionAlgorithm], "", src.Options[hmac.OptionEncoding], nil); err != nil {
			return nil, fmt.Errorf("source %s: %w", src.Name, err)
		}
		b.build = (*Builder).hmac
	case "stripe":
		b.build = (*Builder).stripe
	case "pagarme":
		b.build = (*Builder).pagarme
	case "asaas":
		b.build = (*Builder).asaas
	case "pagbank":
		b.build = (*Builder).pagbank
	case "mercadopago":
		b.build = (*Builder).mercadoPago
	case "zoop":
		b.build = (*Builder).zoop
	default:
		return nil, fmt.Errorf("source %s: driver %q is not supported by the load generator (supported: %s)",
			src.Name, src.Driver, strings.Join(Drivers, ", "))
	}
	return b, nil
}

// Source returns the source the Builder signs for.
func (b *Builder) Source() Source { return b.src }

// Build returns the request for ev, signed at now.
func (b *Builder) Build(ev Event, now time.Time) (*Request, error) {
	if ev.Payment < 0 || ev.Step < 0 {
		return nil, errors.New("build: negative payment or step")
	}
	return b.build(b, ev, now)
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

// id returns a string id unique in the run, with prefix.
func (b *Builder) id(prefix string, seq uint64) string {
	return prefix + "lg" + b.run + "_" + strconv.FormatUint(seq, 10)
}

func newHeader() http.Header {
	return http.Header{"Content-Type": {"application/json"}, "User-Agent": {"paystream-loadgen"}}
}

// conventionBody is paystream's payload convention (standardwebhooks and
// hmac drivers): created, paid, then partial refunds of 1 minor unit each.
func (b *Builder) conventionBody(ev Event) []byte {
	pid := b.PaymentID(ev.Payment)
	ts := ev.OccurredAt.UTC().Format(time.RFC3339Nano)
	switch ev.Step {
	case 0:
		return fmt.Appendf(nil, `{"type":"payment.created","timestamp":%q,"data":{"payment_id":%q,"amount":%d,"currency":"BRL"}}`, ts, pid, amountMinor)
	case 1:
		return fmt.Appendf(nil, `{"type":"payment.paid","timestamp":%q,"data":{"payment_id":%q,"amount":%d,"currency":"BRL"}}`, ts, pid, amountMinor)
	}
	return fmt.Appendf(nil, `{"type":"payment.partially_refunded","timestamp":%q,"data":{"payment_id":%q,"amount":%d,"currency":"BRL","refund_id":%q,"refund_amount":1}}`,
		ts, pid, amountMinor, b.id("re_", ev.Seq))
}

func (b *Builder) standardWebhooks(ev Event, now time.Time) (*Request, error) {
	body := b.conventionBody(ev)
	id := b.id("msg_", ev.Seq)
	sig, err := standardwebhooks.Sign(b.secret, id, now, body)
	if err != nil {
		return nil, err
	}
	h := newHeader()
	h[http.CanonicalHeaderKey(standardwebhooks.HeaderID)] = []string{id}
	h[http.CanonicalHeaderKey(standardwebhooks.HeaderTimestamp)] = []string{strconv.FormatInt(now.Unix(), 10)}
	h[http.CanonicalHeaderKey(standardwebhooks.HeaderSignature)] = []string{sig}
	return &Request{Source: b.src.Name, Header: h, Body: body}, nil
}

func (b *Builder) hmac(ev Event, _ time.Time) (*Request, error) {
	body := b.conventionBody(ev)
	o := b.src.Options
	sig, err := hmac.Sign(b.secret, o[hmac.OptionAlgorithm], o[hmac.OptionPrefix], o[hmac.OptionEncoding], body)
	if err != nil {
		return nil, err
	}
	h := newHeader()
	h.Set(o[hmac.OptionHeader], sig)
	if idh := o[hmac.OptionIDHeader]; idh != "" {
		h.Set(idh, b.id("msg_", ev.Seq))
	}
	return &Request{Source: b.src.Name, Header: h, Body: body}, nil
}

func (b *Builder) stripe(ev Event, now time.Time) (*Request, error) {
	pid := b.PaymentID(ev.Payment)
	id, created := b.id("evt_", ev.Seq), ev.OccurredAt.Unix()
	var body []byte
	switch ev.Step {
	case 0:
		body = fmt.Appendf(nil, `{"id":%q,"object":"event","created":%d,"type":"payment_intent.created","data":{"object":{"id":%q,"object":"payment_intent","amount":%d,"currency":"brl","status":"requires_payment_method"}}}`,
			id, created, pid, amountMinor)
	case 1:
		body = fmt.Appendf(nil, `{"id":%q,"object":"event","created":%d,"type":"payment_intent.succeeded","data":{"object":{"id":%q,"object":"payment_intent","amount":%d,"amount_received":%d,"currency":"brl","status":"succeeded"}}}`,
			id, created, pid, amountMinor, amountMinor)
	default:
		body = fmt.Appendf(nil, `{"id":%q,"object":"event","created":%d,"type":"refund.created","data":{"object":{"id":%q,"object":"refund","amount":1,"currency":"brl","payment_intent":%q,"status":"succeeded"}}}`,
			id, created, b.id("re_", ev.Seq), pid)
	}
	h := newHeader()
	h.Set(stripe.HeaderSignature, stripe.Sign(b.secret, now, body))
	return &Request{Source: b.src.Name, Header: h, Body: body}, nil
}

func (b *Builder) pagarme(ev Event, _ time.Time) (*Request, error) {
	pid := b.PaymentID(ev.Payment)
	id, at := b.id("hook_", ev.Seq), ev.OccurredAt.UTC().Format(time.RFC3339Nano)
	var body []byte
	switch ev.Step {
	case 0:
		body = fmt.Appendf(nil, `{"id":%q,"type":"charge.pending","created_at":%q,"data":{"id":%q,"amount":%d,"status":"pending","currency":"BRL","payment_method":"pix"}}`,
			id, at, pid, amountMinor)
	case 1:
		body = fmt.Appendf(nil, `{"id":%q,"type":"charge.paid","created_at":%q,"data":{"id":%q,"amount":%d,"paid_amount":%d,"status":"paid","currency":"BRL","payment_method":"pix"}}`,
			id, at, pid, amountMinor, amountMinor)
	default:
		body = fmt.Appendf(nil, `{"id":%q,"type":"charge.partial_canceled","created_at":%q,"data":{"id":%q,"amount":%d,"paid_amount":%d,"canceled_amount":%d,"status":"paid","currency":"BRL","last_transaction":{"id":%q,"amount":1,"status":"partial_void","success":true}}}`,
			id, at, pid, amountMinor, amountMinor, ev.Step-1, b.id("tran_", ev.Seq))
	}
	h := newHeader()
	h.Set(pagarme.HeaderSignature, pagarme.Sign(b.secret, body))
	return &Request{Source: b.src.Name, Header: h, Body: body}, nil
}

// brasilia is the zone of Asaas' timestamps.
var brasilia = time.FixedZone("BRT", -3*60*60)

func (b *Builder) asaas(ev Event, _ time.Time) (*Request, error) {
	event, status := "PAYMENT_RECEIVED", "RECEIVED" // repeated facts after step 1, as Asaas sends
	switch ev.Step {
	case 0:
		event, status = "PAYMENT_CREATED", "PENDING"
	case 1:
		event, status = "PAYMENT_CONFIRMED", "CONFIRMED"
	}
	body := fmt.Appendf(nil, `{"id":%q,"event":%q,"dateCreated":%q,"payment":{"object":"payment","id":%q,"value":%d.%02d,"billingType":"PIX","status":%q}}`,
		b.id("evt_", ev.Seq), event, ev.OccurredAt.In(brasilia).Format("2006-01-02 15:04:05"),
		b.PaymentID(ev.Payment), amountMinor/100, amountMinor%100, status)
	h := newHeader()
	h.Set(asaas.HeaderToken, asaas.Sign(b.secret))
	return &Request{Source: b.src.Name, Header: h, Body: body}, nil
}

func (b *Builder) pagbank(ev Event, _ time.Time) (*Request, error) {
	status, paid, refunded := "WAITING", 0, 0
	if ev.Step >= 1 {
		status, paid, refunded = "PAID", amountMinor, ev.Step-1 // cumulative partial refunds
	}
	at := ev.OccurredAt.UTC().Format(time.RFC3339Nano)
	body := fmt.Appendf(nil, `{"id":%q,"status":%q,"created_at":%q,"paid_at":%q,"amount":{"value":%d,"currency":"BRL","summary":{"total":%d,"paid":%d,"refunded":%d}},"payment_method":{"type":"PIX"}}`,
		b.PaymentID(ev.Payment), status, at, at, amountMinor, amountMinor, paid, refunded)
	h := newHeader()
	h.Set(pagbank.HeaderSignature, pagbank.Sign(b.secret, body))
	return &Request{Source: b.src.Name, Header: h, Body: body}, nil
}

func (b *Builder) mercadoPago(ev Event, now time.Time) (*Request, error) {
	pid := b.PaymentID(ev.Payment)
	action := "payment.updated"
	if ev.Step == 0 {
		action = "payment.created"
	}
	notification := strconv.FormatUint(b.runNum%900000+100000, 10) + fmt.Sprintf("%012d", ev.Seq)
	body := fmt.Appendf(nil, `{"action":%q,"api_version":"v1","data":{"id":%q},"date_created":%q,"id":%s,"live_mode":false,"type":"payment","user_id":"0"}`,
		action, pid, ev.OccurredAt.UTC().Format("2006-01-02T15:04:05.000Z07:00"), notification)
	// Each delivery has its own x-request-id, retries included.
	requestID := fmt.Sprintf("lg%s-%d-%d", b.run, ev.Seq, now.UnixNano())
	h := newHeader()
	h.Set(mercadopago.HeaderRequestID, requestID)
	h.Set(mercadopago.HeaderSignature, mercadopago.Sign(b.secret, pid, requestID, now))
	q := url.Values{mercadopago.QueryDataID: {pid}, "type": {"payment"}}
	return &Request{Source: b.src.Name, RawQuery: q.Encode(), Header: h, Body: body}, nil
}

// zoop sends Zoop's events (created, succeeded, then voids): thin by
// design, every one is refetched; the credential is basic auth, or the
// token in the query parameter with auth: query.
func (b *Builder) zoop(ev Event, _ time.Time) (*Request, error) {
	typ := "transaction.void.succeeded"
	switch ev.Step {
	case 0:
		typ = "transaction.created"
	case 1:
		typ = "transaction.succeeded"
	}
	body := fmt.Appendf(nil, `{"id":%q,"type":%q,"resource":"event","payload":{"object":{"id":%q,"resource":"transaction","status":"succeeded","amount":"%d.%02d","currency":"BRL","payment_type":"pix"}},"created_at":%q}`,
		b.id("evt", ev.Seq), typ, b.PaymentID(ev.Payment), amountMinor/100, amountMinor%100, ev.OccurredAt.UTC().Format(time.RFC3339Nano))
	h := newHeader()
	req := &Request{Source: b.src.Name, Header: h, Body: body}
	if b.src.Options[zoop.OptionAuth] == zoop.AuthQuery {
		param := cmp.Or(b.src.Options[zoop.OptionQueryParam], zoop.DefaultQueryParam)
		req.RawQuery = url.Values{param: {b.secret}}.Encode()
	} else {
		h.Set(zoop.HeaderAuthorization, zoop.Sign(b.secret))
	}
	return req, nil
}
