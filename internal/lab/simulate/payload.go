package simulate

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/money"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
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
		gateway:   genericGateway,
	},
	"hmac": {
		shapes:    allShapes,
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("pay_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("rf_"),
		eventID:   stringIDs("msg_"),
	},
	"stripe": {
		shapes:    allShapes,
		echoes:    map[Kind]bool{KindPaid: true}, // charge.succeeded after payment_intent.succeeded
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("pi_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("re_"),
		eventID:   stringIDs("evt_"),
	},
	"pagarme": {
		// No authorization event is mapped; Pagar.me sends no dispute outcome.
		shapes:    []Shape{ShapePaid, ShapeFailed, ShapeCanceled, ShapePartialRefunds, ShapeRefundedByParts, ShapeFullRefund, ShapeDisputeOpen},
		echoes:    map[Kind]bool{KindPaid: true}, // order.paid after charge.paid
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("ch_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("tran_"),
		eventID:   stringIDs("hook_"),
	},
	"asaas": {
		// Partial refunds need a refetch Asaas cannot do; no "chargeback lost" event.
		shapes:    []Shape{ShapePaid, ShapeAuthorizedPaid, ShapeFailed, ShapeCanceled, ShapeFullRefund, ShapeDisputeOpen, ShapeDisputeWon},
		echoes:    map[Kind]bool{KindPaid: true}, // PAYMENT_RECEIVED after PAYMENT_CONFIRMED
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("pay_sim%s_%d", x.Run, p) },
		refundID:  stringIDs("rf_"),
		eventID:   stringIDs("evt_"),
	},
	"pagbank": {
		// Partial refunds need a refetch; no disputes in the orders API.
		shapes:    []Shape{ShapePaid, ShapeAuthorizedPaid, ShapeFailed, ShapeCanceled, ShapeFullRefund},
		paymentID: func(x RunIDs, p int) string { return fmt.Sprintf("CHAR_SIM%s-%d", strings.ToUpper(x.Run), p) },
		refundID:  stringIDs("rf_"),
		eventID:   stringIDs("pb_"), // PagBank sends no event id; the driver derives the key
	},
	"mercadopago": {
		// Every event is refetched: the gateway API tells the history.
		shapes:      allShapes,
		paymentID:   func(x RunIDs, p int) string { return x.numPrefix() + fmt.Sprintf("%08d", p) },
		refundID:    func(x RunIDs, p, n int) string { return x.numPrefix() + fmt.Sprintf("%08d%d", p, n) },
		eventID:     func(x RunIDs, p, i int) string { return x.numPrefix() + fmt.Sprintf("%08d%03d", p, i) },
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

// signer signs one source's webhooks with its driver package's Webhook
// (provider.FixtureFunc), as loadgen.Builder does. Its secrets are never
// logged.
type signer struct {
	src     loadgen.Source
	cfg     provider.Config
	webhook provider.FixtureFunc
}

func newSigner(src loadgen.Source) (*signer, error) {
	s := &signer{src: src, cfg: provider.Config{Secrets: src.Secrets, Options: src.Options}, webhook: drivers.Fixtures()[src.Driver]}
	if s.webhook == nil {
		return nil, fmt.Errorf("source %s: driver %q has no webhooks to simulate", src.Name, src.Driver)
	}
	// A first webhook names a configuration that cannot sign (no secret,
	// public keys only, hmac options) before anything is planned.
	if _, err := s.webhook(s.cfg, provider.Fixture{Kind: KindCreated, EventID: "0", PaymentID: "0", AmountMinor: 1}, time.Now()); err != nil {
		return nil, fmt.Errorf("source %s: %w", src.Name, err)
	}
	return s, nil
}

// build makes step i's webhook of h, eventID its id, signed at now.
func (s *signer) build(h *History, i int, eventID string, now time.Time) (*loadgen.Request, error) {
	st := h.Steps[i]
	w, err := s.webhook(s.cfg, provider.Fixture{
		Kind: st.Kind, Echo: st.Echo, EventID: eventID, PaymentID: h.PaymentID, AmountMinor: h.AmountMinor,
		StepMinor: st.AmountMinor, Currency: Currency, RefundID: st.RefundID, RefundedMinor: st.RefundedMinor,
		At: st.At, CreatedAt: h.Steps[0].At,
	}, now)
	if err != nil {
		return nil, err
	}
	w.Header.Set("User-Agent", "paystream-simulate")
	return &loadgen.Request{Source: s.src.Name, RawQuery: w.RawQuery, Header: w.Header, Body: w.Body}, nil
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

// paidAt is when h's capture happened among steps 0..upto, nil before it.
func paidAt(h *History, upto int) *time.Time {
	var at *time.Time
	for _, s := range h.Steps[:upto+1] {
		if s.Kind == KindPaid && !s.Echo {
			at = &s.At
		}
	}
	return at
}

// The gateways' words for the statuses a payment can have before its
// capture (Expected.Status); any other status is captured or after.
var (
	mercadoPagoUncaptured = map[string]string{"pending": "pending", "authorized": "authorized", "failed": "rejected", "canceled": "cancelled"}
	zoopUncaptured        = map[string]string{"pending": "pending", "authorized": "pre_authorized", "failed": "failed", "canceled": "canceled"}
)

// mercadoPagoDispute is Mercado Pago's status_detail of a charged back
// payment, by Expected.Dispute.
var mercadoPagoDispute = map[string]string{"open": "in_process", "won": "reimbursed", "lost": "settled"}

// genericGateway is paystream's generic refetch convention's answer
// (gatewaytest.Payment) for h once steps 0..upto happened.
func genericGateway(h *History, upto int, _ string) ([]byte, error) {
	exp := Expect(h.Steps[:upto+1])
	last := h.Steps[upto].At
	p := gatewaytest.Payment{PaymentID: h.PaymentID, Status: exp.Status, Amount: h.AmountMinor, Currency: Currency, UpdatedAt: last,
		PaidAt: paidAt(h, upto)}
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
	if st, ok := mercadoPagoUncaptured[exp.Status]; ok {
		p.Status = st
		return json.Marshal(p)
	}
	p.Status, p.DateApproved = "approved", paidAt(h, upto)
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
	if detail, ok := mercadoPagoDispute[exp.Dispute]; ok {
		p.Status, p.StatusDetail = "charged_back", detail
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
	if st, ok := zoopUncaptured[exp.Status]; ok {
		tx.Status, tx.Voided = st, exp.Status == "canceled"
		return json.Marshal(tx)
	}
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
	return json.Marshal(tx)
}
