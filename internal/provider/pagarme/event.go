package pagarme

import (
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// hook is the part of a Pagar.me webhook paystream reads.
type hook struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	CreatedAt string `json:"created_at"`
	Data      struct {
		charge
		// Charges are set when the hook is about an order.
		Charges []charge `json:"charges"`
	} `json:"data"`
}

type charge struct {
	ID              string          `json:"id"`
	Amount          provider.Amount `json:"amount"`
	PaidAmount      provider.Amount `json:"paid_amount"`
	CanceledAmount  provider.Amount `json:"canceled_amount"`
	Currency        string          `json:"currency"`
	Status          string          `json:"status"`
	UpdatedAt       string          `json:"updated_at"`
	LastTransaction struct {
		ID     string          `json:"id"`
		Amount provider.Amount `json:"amount"`
	} `json:"last_transaction"`
}

// Statuses maps the Pagar.me hook types the driver understands to the
// status each asserts. Types mapped to "" are authentic but carry no payment
// fact (Parse returns provider.ErrIrrelevant).
var Statuses = map[string]payment.Status{
	"charge.created":            payment.StatusPending,
	"charge.pending":            payment.StatusPending,
	"charge.processing":         payment.StatusPending,
	"charge.paid":               payment.StatusPaid,
	"charge.overpaid":           payment.StatusPaid,
	"charge.underpaid":          payment.StatusPaid,
	"charge.payment_failed":     payment.StatusFailed,
	"charge.antifraud_reproved": payment.StatusFailed,
	"charge.refunded":           payment.StatusRefunded,
	"charge.partial_canceled":   payment.StatusPartiallyRefunded,
	"charge.chargedback":        payment.StatusDisputed,
	"order.created":             payment.StatusPending,
	"order.paid":                payment.StatusPaid,
	"order.payment_failed":      payment.StatusFailed,
	"order.canceled":            payment.StatusCanceled,

	"charge.updated":            "",
	"charge.antifraud_approved": "",
	"charge.antifraud_manual":   "",
	"charge.antifraud_pending":  "",
	"order.updated":             "",
	"order.closed":              "",
}

// Parse normalizes a Pagar.me hook. EventID and DedupKey are the hook id
// (hook_…), which Pagar.me keeps across retries of one notification.
// PaymentID is the charge id (ch_…): for order.* hooks, the order's only
// charge (an order with several charges is unprocessable: subscribe to
// charge.* events for those).
func (d *Driver) Parse(r *provider.Request) (provider.Event, error) {
	var h hook
	if err := provider.DecodeJSON(r.Body, &h); err != nil {
		return provider.Event{}, err
	}
	if err := provider.CheckID("hook id", h.ID); err != nil {
		return provider.Event{}, err
	}
	status, err := provider.LookupStatus(Statuses, "type", h.Type)
	if err != nil {
		return provider.Event{}, err
	}
	occurred, err := parseTime(h.CreatedAt)
	if err != nil {
		return provider.Event{}, provider.Unprocessable("bad created_at")
	}
	if err := provider.CheckTime("created_at", occurred); err != nil {
		return provider.Event{}, err
	}
	c := h.Data.charge
	if len(h.Type) > 6 && h.Type[:6] == "order." {
		if len(h.Data.Charges) != 1 {
			return provider.Event{}, provider.Unprocessable("order hook without exactly one charge")
		}
		c = h.Data.Charges[0]
	}
	if err := provider.CheckID("charge id", c.ID); err != nil {
		return provider.Event{}, err
	}
	fact := payment.Fact{Status: status, OccurredAt: occurred}
	currency := c.Currency
	if currency == "" {
		currency = "BRL" // Pagar.me settles in reais only.
	}
	if fact.Currency, err = provider.Currency(currency); err != nil {
		return provider.Event{}, err
	}
	amount := c.Amount
	switch status {
	case payment.StatusPaid:
		if c.PaidAmount != "" {
			amount = c.PaidAmount
		}
	case payment.StatusRefunded, payment.StatusPartiallyRefunded:
		// The refund operation is the charge's last transaction: its id
		// makes each (partial) refund an additive fact applied once.
		amount = ""
		if id := c.LastTransaction.ID; id != "" {
			if err := provider.CheckID("last_transaction id", id); err != nil {
				return provider.Event{}, err
			}
			fact.RefundID = id
			amount = c.LastTransaction.Amount
		}
		if fact.RefundID == "" && status == payment.StatusPartiallyRefunded {
			amount = c.CanceledAmount
		}
	}
	if amount != "" {
		if fact.AmountMinor, err = provider.AmountMinor(amount); err != nil {
			return provider.Event{}, err
		}
	}
	return provider.Event{
		EventID:      h.ID,
		DedupKey:     provider.ScopeKey(d.account, h.ID),
		PaymentID:    c.ID,
		Type:         h.Type,
		Fact:         fact,
		NeedsRefetch: status == payment.StatusPartiallyRefunded && fact.RefundID == "",
	}, nil
}

// parseTime reads Pagar.me's timestamps: RFC 3339, or without a zone (then
// UTC, as Pagar.me's API reports).
func parseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, provider.Unprocessable("bad time")
}
