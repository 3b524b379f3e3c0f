package simulate

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/money"
	"github.com/paystream/paystream/internal/provider/asaas"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/provider/hmac"
	"github.com/paystream/paystream/internal/provider/mercadopago"
	"github.com/paystream/paystream/internal/provider/pagarme"
	"github.com/paystream/paystream/internal/provider/pagbank"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/provider/stripe"
	"github.com/paystream/paystream/internal/provider/zoop"
)

// RunIDs make a run's ids differ from other runs': Run is a few lowercase
// letters and digits, RunNum the same for gateways with numeric ids.
type RunIDs struct {
	Run    string `json:"run"`
	RunNum uint32 `json:"run_num"`
}

// numPrefix is the leading digits of a run's numeric ids.
func (x RunIDs) numPrefix() string { return strconv.FormatUint(uint64(x.RunNum)%900000+100000, 10) }

// profile is how the simulator speaks one driver: which histories its
// webhooks can tell, its ids, and each step's webhook. Adding a driver is
// one entry in profiles.
type profile struct {
	// shapes are the histories the driver's webhooks can tell without a
	// refetch the driver cannot do (Asaas and PagBank partial refunds need
	// one, so those drivers have no partial refunds here).
	shapes []Shape
	// echoes are the kinds after which the gateway sends a second event for
	// the same fact.
	echoes map[Kind]bool
	// paymentID is the p-th payment's gateway id.
	paymentID func(x RunIDs, p int) string
	// refundID is payment p's n-th refund id.
	refundID func(x RunIDs, p, n int) string
	// eventID is the id of step i of payment p's webhook.
	eventID func(x RunIDs, p, i int) string
	// build makes step i's webhook of h, signed at now.
	build func(s *signer, h *History, i int, eventID string, now time.Time) (*loadgen.Request, error)
	// gateway is the gateway API's answer for h once steps 0..upto
	// happened; nil when the driver cannot refetch. scope is the account
	// the API serves the payment under (Zoop's marketplace id), empty for
	// the others.
	gateway func(h *History, upto int, scope string) ([]byte, error)
	// refetchOnly marks drivers whose every event is refetched (their
	// webhooks assert nothing): a source of theirs that cannot refetch
	// cannot be simulated.
	refetchOnly bool
}

// allShapes is every shape, for the drivers that can tell them all.
var allShapes = []Shape{ShapePaid, ShapeAuthorizedPaid, ShapeFailed, ShapeCanceled, ShapePartialRefunds,
	ShapeRefundedByParts, ShapeFullRefund, ShapeDisputeOpen, ShapeDisputeWon, ShapeDisputeLost}

func stringIDs(prefix string) func(x RunIDs, p, i int) string {
	return func(x RunIDs, p, i int) string { return fmt.Sprintf("%ssim%s_%d_%d", prefix, x.Run, p, i) }
}

// profiles is the table of drivers the simulator speaks, by driver name.
var profiles = map[string]profile{
	"standardwebhooks": {
		shapes:    allShapes,
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("pay_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("rf_"),
		eventID:   stringIDs("msg_"),
		build:     (*signer).standardWebhooks,
		gateway:   genericGateway,
	},
	"hmac": {
		shapes:    allShapes,
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("pay_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("rf_"),
		eventID:   stringIDs("msg_"),
		build:     (*signer).hmac,
	},
	"stripe": {
		shapes:    allShapes,
		echoes:    map[Kind]bool{KindPaid: true}, // charge.succeeded after payment_intent.succeeded
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("pi_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("re_"),
		eventID:   stringIDs("evt_"),
		build:     (*signer).stripe,
	},
	"pagarme": {
		// No authorization event is mapped; Pagar.me sends no dispute outcome.
		shapes:    []Shape{ShapePaid, ShapeFailed, ShapeCanceled, ShapePartialRefunds, ShapeRefundedByParts, ShapeFullRefund, ShapeDisputeOpen},
		echoes:    map[Kind]bool{KindPaid: true}, // order.paid after charge.paid
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("ch_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("tran_"),
		eventID:   stringIDs("hook_"),
		build:     (*signer).pagarme,
	},
	"asaas": {
		// Partial refunds need a refetch Asaas cannot do; no "chargeback lost" event.
		shapes:    []Shape{ShapePaid, ShapeAuthorizedPaid, ShapeFailed, ShapeCanceled, ShapeFullRefund, ShapeDisputeOpen, ShapeDisputeWon},
		echoes:    map[Kind]bool{KindPaid: true}, // PAYMENT_RECEIVED after PAYMENT_CONFIRMED
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("pay_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("rf_"),
		eventID:   stringIDs("evt_"),
		build:     (*signer).asaas,
	},
	"pagbank": {
		// Partial refunds need a refetch; no disputes in the orders API.
		shapes:    []Shape{ShapePaid, ShapeAuthorizedPaid, ShapeFailed, ShapeCanceled, ShapeFullRefund},
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("CHAR_SIM%s-%d", strings.ToUpper(x.Run), p) },
		refundID:  stringIDs("rf_"),
		eventID:   stringIDs("pb_"), // PagBank sends no event id; the driver derives the key
		build:     (*signer).pagbank,
	},
	"mercadopago": {
		// Every event is refetched: the gateway API tells the history.
		shapes:      allShapes,
		paymentID:   func(x RunIDs, p int) string { return x.numPrefix() + fmt.Sprintf("%08d", p) },
		refundID:    func(x RunIDs, p, n int) string { return x.numPrefix() + fmt.Sprintf("%08d%d", p, n) },
		eventID:     func(x RunIDs, p, i int) string { return x.numPrefix() + fmt.Sprintf("%08d%03d", p, i) },
		build:       (*signer).mercadoPago,
		gateway:     mercadoPagoGateway,
		refetchOnly: true,
	},
	"zoop": {
		// Every event is refetched: the gateway API tells the history. Zoop
		// shows no dispute the seller won (it would stay disputed).
		shapes: []Shape{ShapePaid, ShapeAuthorizedPaid, ShapeFailed, ShapeCanceled, ShapePartialRefunds,
			ShapeRefundedByParts, ShapeFullRefund, ShapeDisputeOpen, ShapeDisputeLost},
		echoes:      map[Kind]bool{KindPaid: true}, // transaction.capture.succeeded with transaction.succeeded
		paymentID:   func(x RunIDs, p int) string { return zoopID(x, p, 0, 0) },
		refundID:    func(x RunIDs, p, n int) string { return zoopID(x, p, 2, n) },
		eventID:     func(x RunIDs, p, i int) string { return zoopID(x, p, 1, i) },
		build:       (*signer).zoop,
		gateway:     zoopGateway,
		refetchOnly: true,
	},
}

// zoopID is a Zoop id (32 hexadecimal digits) for payment p: the run's
// number, p, a tag telling transactions (0), events (1), refunds (2) and
// other history entries (3) apart, and n.
func zoopID(x RunIDs, p int, tag, n int) string {
	return fmt.Sprintf("%08x%016x%x%07x", x.RunNum, p, tag, n)
}

// signer signs one source's webhooks with the driver package's own Sign
// helper, as loadgen.Builder does. Its secrets are never logged.
type signer struct {
	src    loadgen.Source
	secret string
}

func newSigner(src loadgen.Source) (*signer, error) {
	if len(src.Secrets) == 0 {
		return nil, fmt.Errorf("source %s: no secret to sign with", src.Name)
	}
	s := &signer{src: src, secret: src.Secrets[0]}
	switch src.Driver {
	case "standardwebhooks":
		s.secret = ""
		for _, sec := range src.Secrets {
			if strings.HasPrefix(sec, standardwebhooks.PrefixSecret) || strings.HasPrefix(sec, standardwebhooks.PrefixPrivateKey) {
				s.secret = sec
				break
			}
		}
		if s.secret == "" {
			return nil, fmt.Errorf("source %s: only public keys (%s…) configured: cannot sign", src.Name, standardwebhooks.PrefixPublicKey)
		}
	case "hmac":
		if src.Options[hmac.OptionHeader] == "" {
			return nil, fmt.Errorf("source %s: hmac option %q is required", src.Name, hmac.OptionHeader)
		}
	}
	return s, nil
}

func header() http.Header {
	return http.Header{"Content-Type": {"application/json"}, "User-Agent": {"paystream-simulate"}}
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// conventionBody is paystream's payload convention (standardwebhooks, hmac).
func conventionBody(h *History, i int) []byte {
	s := h.Steps[i]
	typ := map[Kind]string{
		KindCreated: "payment.created", KindAuthorized: "payment.authorized", KindPaid: "payment.paid",
		KindFailed: "payment.failed", KindCanceled: "payment.canceled", KindFullRefund: "payment.refunded",
		KindDisputed: "payment.disputed", KindDisputeWon: "payment.dispute_won", KindDisputeLost: "payment.dispute_lost",
	}[s.Kind]
	extra := ""
	switch s.Kind {
	case KindRefund:
		typ = "payment.partially_refunded"
		if s.RefundedMinor == h.AmountMinor {
			typ = "payment.refunded"
		}
		extra = fmt.Sprintf(`,"refund_id":%q,"refund_amount":%d`, s.RefundID, s.AmountMinor)
	}
	return fmt.Appendf(nil, `{"type":%q,"timestamp":%q,"data":{"payment_id":%q,"amount":%d,"currency":%q%s}}`,
		typ, rfc3339(s.At), h.PaymentID, s.AmountMinor, Currency, extra)
}

func (s *signer) standardWebhooks(h *History, i int, id string, now time.Time) (*loadgen.Request, error) {
	body := conventionBody(h, i)
	sig, err := standardwebhooks.Sign(s.secret, id, now, body)
	if err != nil {
		return nil, err
	}
	hd := header()
	hd.Set(standardwebhooks.HeaderID, id)
	hd.Set(standardwebhooks.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	hd.Set(standardwebhooks.HeaderSignature, sig)
	return &loadgen.Request{Source: s.src.Name, Header: hd, Body: body}, nil
}

func (s *signer) hmac(h *History, i int, id string, _ time.Time) (*loadgen.Request, error) {
	body := conventionBody(h, i)
	o := s.src.Options
	sig, err := hmac.Sign(s.secret, o[hmac.OptionAlgorithm], o[hmac.OptionPrefix], o[hmac.OptionEncoding], body)
	if err != nil {
		return nil, err
	}
	hd := header()
	hd.Set(o[hmac.OptionHeader], sig)
	if idh := o[hmac.OptionIDHeader]; idh != "" {
		hd.Set(idh, id)
	}
	return &loadgen.Request{Source: s.src.Name, Header: hd, Body: body}, nil
}

func (s *signer) stripe(h *History, i int, id string, now time.Time) (*loadgen.Request, error) {
	st := h.Steps[i]
	pid, created, amt := h.PaymentID, st.At.Unix(), st.AmountMinor
	charge := "ch_" + strings.TrimPrefix(pid, "pi_")
	var typ, obj string
	switch st.Kind {
	case KindCreated:
		typ, obj = "payment_intent.created", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"currency":"brl","status":"requires_payment_method"}`, pid, amt)
	case KindAuthorized:
		typ, obj = "payment_intent.amount_capturable_updated", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"amount_capturable":%d,"currency":"brl","status":"requires_capture"}`, pid, amt, amt)
	case KindPaid:
		if st.Echo {
			typ, obj = "charge.succeeded", fmt.Sprintf(`{"id":%q,"object":"charge","amount":%d,"amount_captured":%d,"captured":true,"currency":"brl","payment_intent":%q,"status":"succeeded"}`, charge, amt, amt, pid)
		} else {
			typ, obj = "payment_intent.succeeded", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"amount_received":%d,"currency":"brl","status":"succeeded"}`, pid, amt, amt)
		}
	case KindFailed:
		typ, obj = "payment_intent.payment_failed", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"currency":"brl","status":"requires_payment_method"}`, pid, amt)
	case KindCanceled:
		typ, obj = "payment_intent.canceled", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"currency":"brl","status":"canceled"}`, pid, amt)
	case KindRefund:
		typ, obj = "refund.created", fmt.Sprintf(`{"id":%q,"object":"refund","amount":%d,"charge":%q,"currency":"brl","payment_intent":%q,"status":"succeeded"}`, st.RefundID, amt, charge, pid)
	case KindFullRefund:
		typ, obj = "charge.refunded", fmt.Sprintf(`{"id":%q,"object":"charge","amount":%d,"amount_captured":%d,"amount_refunded":%d,"captured":true,"currency":"brl","payment_intent":%q,"refunded":true,"status":"succeeded"}`, charge, h.AmountMinor, h.AmountMinor, h.AmountMinor, pid)
	case KindDisputed, KindDisputeWon, KindDisputeLost:
		status := map[Kind]string{KindDisputed: "needs_response", KindDisputeWon: "won", KindDisputeLost: "lost"}[st.Kind]
		typ = map[Kind]string{KindDisputed: "charge.dispute.created", KindDisputeWon: "charge.dispute.closed", KindDisputeLost: "charge.dispute.closed"}[st.Kind]
		obj = fmt.Sprintf(`{"id":%q,"object":"dispute","amount":%d,"charge":%q,"currency":"brl","payment_intent":%q,"status":%q}`, "dp_"+strings.TrimPrefix(pid, "pi_"), h.AmountMinor, charge, pid, status)
	default:
		return nil, fmt.Errorf("stripe: no webhook for %s", st.Kind)
	}
	body := fmt.Appendf(nil, `{"id":%q,"object":"event","api_version":"2024-06-20","created":%d,"type":%q,"data":{"object":%s}}`, id, created, typ, obj)
	hd := header()
	hd.Set(stripe.HeaderSignature, stripe.Sign(s.secret, now, body))
	return &loadgen.Request{Source: s.src.Name, Header: hd, Body: body}, nil
}

func (s *signer) pagarme(h *History, i int, id string, _ time.Time) (*loadgen.Request, error) {
	st := h.Steps[i]
	pid, at, amt := h.PaymentID, rfc3339(st.At), h.AmountMinor
	order := "or_" + strings.TrimPrefix(pid, "ch_")
	var typ, data string
	switch st.Kind {
	case KindCreated:
		typ, data = "charge.pending", fmt.Sprintf(`{"id":%q,"amount":%d,"status":"pending","currency":"BRL","payment_method":"pix"}`, pid, amt)
	case KindPaid:
		if st.Echo {
			typ, data = "order.paid", fmt.Sprintf(`{"id":%q,"status":"paid","charges":[{"id":%q,"amount":%d,"paid_amount":%d,"status":"paid","currency":"BRL"}]}`, order, pid, amt, amt)
		} else {
			typ, data = "charge.paid", fmt.Sprintf(`{"id":%q,"amount":%d,"paid_amount":%d,"status":"paid","currency":"BRL","payment_method":"pix"}`, pid, amt, amt)
		}
	case KindFailed:
		typ, data = "charge.payment_failed", fmt.Sprintf(`{"id":%q,"amount":%d,"status":"failed","currency":"BRL","payment_method":"credit_card"}`, pid, amt)
	case KindCanceled:
		typ, data = "order.canceled", fmt.Sprintf(`{"id":%q,"status":"canceled","charges":[{"id":%q,"amount":%d,"status":"canceled","currency":"BRL"}]}`, order, pid, amt)
	case KindRefund:
		typ = "charge.partial_canceled"
		if st.RefundedMinor == amt {
			typ = "charge.refunded"
		}
		data = fmt.Sprintf(`{"id":%q,"amount":%d,"paid_amount":%d,"canceled_amount":%d,"status":"paid","currency":"BRL","last_transaction":{"id":%q,"amount":%d,"status":"partial_void","success":true}}`,
			pid, amt, amt, st.RefundedMinor, st.RefundID, st.AmountMinor)
	case KindFullRefund:
		typ, data = "charge.refunded", fmt.Sprintf(`{"id":%q,"amount":%d,"paid_amount":%d,"canceled_amount":%d,"status":"refunded","currency":"BRL"}`, pid, amt, amt, amt)
	case KindDisputed:
		typ, data = "charge.chargedback", fmt.Sprintf(`{"id":%q,"amount":%d,"paid_amount":%d,"status":"chargedback","currency":"BRL"}`, pid, amt, amt)
	default:
		return nil, fmt.Errorf("pagarme: no webhook for %s", st.Kind)
	}
	body := fmt.Appendf(nil, `{"id":%q,"account":{"id":"acc_sim","name":"simulate"},"type":%q,"created_at":%q,"data":%s}`, id, typ, at, data)
	hd := header()
	hd.Set(pagarme.HeaderSignature, pagarme.Sign(s.secret, body))
	return &loadgen.Request{Source: s.src.Name, Header: hd, Body: body}, nil
}

// brasilia is the zone of Asaas' timestamps.
var brasilia = time.FixedZone("BRT", -3*60*60)

func (s *signer) asaas(h *History, i int, id string, _ time.Time) (*loadgen.Request, error) {
	st := h.Steps[i]
	var event, status string
	switch st.Kind {
	case KindCreated:
		event, status = "PAYMENT_CREATED", "PENDING"
	case KindAuthorized:
		event, status = "PAYMENT_AUTHORIZED", "AUTHORIZED"
	case KindPaid:
		event, status = "PAYMENT_CONFIRMED", "CONFIRMED"
		if st.Echo {
			event, status = "PAYMENT_RECEIVED", "RECEIVED"
		}
	case KindFailed:
		event, status = "PAYMENT_CREDIT_CARD_CAPTURE_REFUSED", "PENDING"
	case KindCanceled:
		event, status = "PAYMENT_DELETED", "PENDING"
	case KindFullRefund:
		event, status = "PAYMENT_REFUNDED", "REFUNDED"
	case KindDisputed:
		event, status = "PAYMENT_CHARGEBACK_REQUESTED", "CHARGEBACK_REQUESTED"
	case KindDisputeWon:
		event, status = "PAYMENT_AWAITING_CHARGEBACK_REVERSAL", "AWAITING_CHARGEBACK_REVERSAL"
	default:
		return nil, fmt.Errorf("asaas: no webhook for %s", st.Kind)
	}
	body := fmt.Appendf(nil, `{"id":%q,"event":%q,"dateCreated":%q,"payment":{"object":"payment","id":%q,"value":%s,"billingType":"CREDIT_CARD","status":%q}}`,
		id, event, st.At.In(brasilia).Format("2006-01-02 15:04:05"), h.PaymentID, money.Format(h.AmountMinor, Currency), status)
	hd := header()
	hd.Set(asaas.HeaderToken, asaas.Sign(s.secret))
	return &loadgen.Request{Source: s.src.Name, Header: hd, Body: body}, nil
}

func (s *signer) pagbank(h *History, i int, _ string, _ time.Time) (*loadgen.Request, error) {
	st := h.Steps[i]
	created, paidAt := st.At, time.Time{}
	var status string
	var paid, refunded int64
	switch st.Kind {
	case KindCreated:
		status = "WAITING"
	case KindAuthorized:
		status = "AUTHORIZED"
	case KindPaid:
		status, paid, paidAt, created = "PAID", h.AmountMinor, st.At, h.Steps[0].At
	case KindFailed:
		status = "DECLINED"
	case KindCanceled:
		status = "CANCELED"
	case KindFullRefund:
		status, paid, refunded = "CANCELED", h.AmountMinor, h.AmountMinor
	default:
		return nil, fmt.Errorf("pagbank: no webhook for %s", st.Kind)
	}
	paidField := ""
	if !paidAt.IsZero() {
		paidField = fmt.Sprintf(`,"paid_at":%q`, rfc3339(paidAt))
	}
	body := fmt.Appendf(nil, `{"id":%q,"reference_id":"simulate","status":%q,"created_at":%q%s,"amount":{"value":%d,"currency":"BRL","summary":{"total":%d,"paid":%d,"refunded":%d}},"payment_method":{"type":"CREDIT_CARD"}}`,
		h.PaymentID, status, rfc3339(created), paidField, h.AmountMinor, h.AmountMinor, paid, refunded)
	hd := header()
	hd.Set(pagbank.HeaderSignature, pagbank.Sign(s.secret, body))
	return &loadgen.Request{Source: s.src.Name, Header: hd, Body: body}, nil
}

func (s *signer) mercadoPago(h *History, i int, id string, now time.Time) (*loadgen.Request, error) {
	action := "payment.updated"
	if i == 0 {
		action = "payment.created"
	}
	pid := h.PaymentID
	body := fmt.Appendf(nil, `{"action":%q,"api_version":"v1","data":{"id":%q},"date_created":%q,"id":%s,"live_mode":false,"type":"payment","user_id":"0"}`,
		action, pid, h.Steps[i].At.UTC().Format("2006-01-02T15:04:05.000Z07:00"), id)
	// Each delivery has its own x-request-id, retries included.
	requestID := fmt.Sprintf("sim%s-%s-%d", strings.ToLower(pid), id, now.UnixNano())
	hd := header()
	hd.Set(mercadopago.HeaderRequestID, requestID)
	hd.Set(mercadopago.HeaderSignature, mercadopago.Sign(s.secret, pid, requestID, now))
	q := url.Values{mercadopago.QueryDataID: {pid}, "type": {"payment"}}
	return &loadgen.Request{Source: s.src.Name, RawQuery: q.Encode(), Header: hd, Body: body}, nil
}

// refundsUpTo lists h's refunds among steps 0..upto, and whether a refund
// in full (without id) is among them.
func refundsUpTo(h *History, upto int) (refunds []Step, full bool) {
	for _, s := range h.Steps[:upto+1] {
		switch {
		case s.Echo:
		case s.Kind == KindRefund:
			refunds = append(refunds, s)
		case s.Kind == KindFullRefund:
			full = true
		}
	}
	return refunds, full
}

// zoopTypes are the Zoop event types of each kind of step (echo: the
// second event of a capture).
var zoopTypes = map[Kind]string{
	KindCreated: "transaction.created", KindAuthorized: "transaction.pre_authorized", KindPaid: "transaction.succeeded",
	KindFailed: "transaction.failed", KindCanceled: "transaction.canceled", KindRefund: "transaction.void.succeeded",
	KindFullRefund: "transaction.canceled", KindDisputed: "transaction.disputed", KindDisputeLost: "transaction.charged_back",
}

// zoop is a Zoop event: thin (the transaction's id only, as nothing in it
// is trusted), authenticated by the operator's credential in basic auth or,
// with auth: query, in the query.
func (s *signer) zoop(h *History, i int, id string, _ time.Time) (*loadgen.Request, error) {
	st := h.Steps[i]
	typ, ok := zoopTypes[st.Kind]
	if !ok {
		return nil, fmt.Errorf("zoop: no webhook for %s", st.Kind)
	}
	if st.Kind == KindPaid && st.Echo {
		typ = "transaction.capture.succeeded"
	}
	body := fmt.Appendf(nil, `{"id":%q,"type":%q,"resource":"event","payload":{"object":{"id":%q,"resource":"transaction"}},"created_at":%q}`,
		id, typ, h.PaymentID, st.At.UTC().Format("2006-01-02T15:04:05-0700"))
	hd := header()
	req := &loadgen.Request{Source: s.src.Name, Header: hd, Body: body}
	if s.src.Options[zoop.OptionAuth] == zoop.AuthQuery {
		param := cmp.Or(s.src.Options[zoop.OptionQueryParam], zoop.DefaultQueryParam)
		req.RawQuery = url.Values{param: {s.secret}}.Encode()
	} else {
		hd.Set(zoop.HeaderAuthorization, zoop.Sign(s.secret))
	}
	return req, nil
}

// genericGateway is paystream's generic refetch convention's answer
// (gatewaytest.Payment) for h once steps 0..upto happened.
func genericGateway(h *History, upto int, _ string) ([]byte, error) {
	exp := Expect(h.Steps[:upto+1])
	last := h.Steps[upto].At
	p := gatewaytest.Payment{PaymentID: h.PaymentID, Status: exp.Status, Amount: h.AmountMinor, Currency: Currency, UpdatedAt: last}
	for _, s := range h.Steps[:upto+1] {
		if s.Kind == KindPaid && !s.Echo {
			at := s.At
			p.PaidAt = &at
		}
	}
	refunds, _ := refundsUpTo(h, upto)
	for _, r := range refunds {
		p.Refunds = append(p.Refunds, gatewaytest.Refund{ID: r.RefundID, Amount: r.AmountMinor, CreatedAt: r.At})
	}
	return json.Marshal(p)
}

// mercadoPagoGateway is Mercado Pago's payment resource for h once steps
// 0..upto happened.
func mercadoPagoGateway(h *History, upto int, _ string) ([]byte, error) {
	exp := Expect(h.Steps[:upto+1])
	id, err := strconv.ParseInt(h.PaymentID, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("mercadopago payment id %q: %w", h.PaymentID, err)
	}
	p := gatewaytest.MercadoPagoPayment{
		ID: id, CurrencyID: Currency, TransactionAmount: json.Number(money.Format(h.AmountMinor, Currency)),
		DateCreated: h.Steps[0].At, DateLastUpdated: h.Steps[upto].At, Refunds: []gatewaytest.MercadoPagoRefund{},
	}
	switch exp.Status {
	case "pending":
		p.Status = "pending"
	case "authorized":
		p.Status = "authorized"
	case "failed":
		p.Status = "rejected"
	case "canceled":
		p.Status = "cancelled"
	default: // captured
		p.Status = "approved"
		for _, s := range h.Steps[:upto+1] {
			if s.Kind == KindPaid && !s.Echo {
				at := s.At
				p.DateApproved = &at
			}
		}
		refunds, full := refundsUpTo(h, upto)
		var sum int64
		for _, r := range refunds {
			rid, err := strconv.ParseInt(r.RefundID, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("mercadopago refund id %q: %w", r.RefundID, err)
			}
			p.Refunds = append(p.Refunds, gatewaytest.MercadoPagoRefund{ID: rid, PaymentID: id, Amount: json.Number(money.Format(r.AmountMinor, Currency)), Status: "approved", DateCreated: r.At})
			sum += r.AmountMinor
		}
		if full {
			sum = h.AmountMinor
		}
		if sum > 0 {
			p.TransactionAmountRefunded = json.Number(money.Format(sum, Currency))
		}
		if sum >= h.AmountMinor {
			p.Status = "refunded"
		}
		switch exp.Dispute {
		case "open":
			p.Status, p.StatusDetail = "charged_back", "in_process"
		case "won":
			p.Status, p.StatusDetail = "charged_back", "reimbursed"
		case "lost":
			p.Status, p.StatusDetail = "charged_back", "settled"
		}
	}
	return json.Marshal(p)
}

// zoopGateway is Zoop's transaction resource (gatewaytest.ZoopTransaction)
// for h once steps 0..upto happened, in marketplace: a card transaction
// whose history has a pre_authorization then a capture (or, without an
// authorization step, one authorization), then one succeeded void per
// refund with the refund's id and amount. Refunded in full without ids is
// status refunded with no void; refunded by voids, canceled and captured.
func zoopGateway(h *History, upto int, marketplace string) ([]byte, error) {
	if len(h.PaymentID) != 32 {
		return nil, fmt.Errorf("zoop transaction id %q: want 32 hexadecimal digits", h.PaymentID)
	}
	exp := Expect(h.Steps[:upto+1])
	amount := money.Format(h.AmountMinor, Currency)
	created, last := h.Steps[0].At, h.Steps[upto].At
	hist := func(id, op string, amt int64, at time.Time) gatewaytest.ZoopHistory {
		return gatewaytest.ZoopHistory{ID: id, Transaction: h.PaymentID, Amount: money.Format(amt, Currency),
			OperationType: op, Status: "succeeded", CreatedAt: gatewaytest.ZoopHistoryTime(at)}
	}
	// History entry ids: the transaction's id with its tag digit (the 25th)
	// set to 3 and the entry's number at the end.
	entryID := func(n int) string { return fmt.Sprintf("%s3%07x", h.PaymentID[:24], n) }
	tx := gatewaytest.ZoopTransaction{
		ID: h.PaymentID, Resource: "transaction", Amount: amount, Currency: Currency, PaymentType: "credit",
		Metadata: map[string]string{"simulate": h.PaymentKey}, CreatedAt: gatewaytest.ZoopTime(created),
		UpdatedAt: gatewaytest.ZoopTime(last),
		History:   []gatewaytest.ZoopHistory{hist(entryID(0), "created", h.AmountMinor, created)},
	}
	if marketplace != "" {
		tx.URI = zoop.TransactionPath(marketplace, h.PaymentID)
	}
	preAuthorized := false
	for _, s := range h.Steps[:upto+1] {
		switch {
		case s.Echo:
		case s.Kind == KindAuthorized:
			preAuthorized = true
			tx.History = append(tx.History, hist(entryID(1), "pre_authorization", h.AmountMinor, s.At))
		case s.Kind == KindPaid && preAuthorized:
			tx.History = append(tx.History, hist(entryID(2), "capture", s.AmountMinor, s.At))
		case s.Kind == KindPaid:
			tx.History = append(tx.History, hist(entryID(2), "authorization", s.AmountMinor, s.At))
		case s.Kind == KindRefund:
			tx.History = append(tx.History, hist(s.RefundID, "void", s.AmountMinor, s.At))
		case s.Kind == KindCanceled, s.Kind == KindFullRefund:
			tx.VoidedAt = gatewaytest.ZoopTime(s.At)
		}
	}
	switch exp.Status {
	case "pending":
		tx.Status = "pending"
	case "authorized":
		tx.Status = "pre_authorized"
	case "failed":
		tx.Status = "failed"
	case "canceled":
		tx.Status, tx.Voided = "canceled", true
	default: // captured
		tx.Status, tx.Captured = "succeeded", true
		refunds, full := refundsUpTo(h, upto)
		var sum int64
		for _, r := range refunds {
			sum += r.AmountMinor
		}
		switch {
		case full:
			tx.Status, tx.Refunded = "refunded", true
		case sum >= h.AmountMinor:
			tx.Status, tx.Voided = "canceled", true
			tx.VoidedAt = gatewaytest.ZoopTime(refunds[len(refunds)-1].At)
		}
		switch exp.Dispute {
		case "open":
			tx.Status = "dispute"
		case "lost":
			tx.Status = "charged_back"
		case "won":
			return nil, fmt.Errorf("zoop payment %s: Zoop shows no dispute won", h.PaymentID)
		}
	}
	return json.Marshal(tx)
}
