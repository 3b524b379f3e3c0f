package pagbank

import (
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// body is a PagBank notification: an order with its charges, or (in the
// older charge notifications and PagBank's own signing example) a charge.
type body struct {
	charge
	Charges *[]charge `json:"charges"`
}

type charge struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
	PaidAt    string `json:"paid_at"`
	Amount    struct {
		Value    provider.Amount `json:"value"`
		Currency string          `json:"currency"`
		Summary  struct {
			Total    provider.Amount `json:"total"`
			Paid     provider.Amount `json:"paid"`
			Refunded provider.Amount `json:"refunded"`
		} `json:"summary"`
	} `json:"amount"`
}

// Statuses maps PagBank charge statuses to normalized statuses. PAID and
// CANCELED are refined by amount.summary.refunded in Parse: a PAID charge
// with refunds is partially refunded, a CANCELED charge with refunds is
// refunded.
var Statuses = map[string]payment.Status{
	"WAITING":     payment.StatusPending,
	"IN_ANALYSIS": payment.StatusPending,
	"AUTHORIZED":  payment.StatusAuthorized,
	"PAID":        payment.StatusPaid,
	"DECLINED":    payment.StatusFailed,
	"CANCELED":    payment.StatusCanceled,
}

// Parse normalizes a PagBank notification. PaymentID is the charge id
// (CHAR_…); an order notification must carry exactly one charge (an order
// with none yet is provider.ErrIrrelevant). PagBank sends no event id, so
// the dedup key is derived from charge id, status, normalized status, the
// charge's time and its refunded total; Type is the charge status.
func (d *Driver) Parse(r *provider.Request) (provider.Event, error) {
	var b body
	if err := provider.DecodeJSON(r.Body, &b); err != nil {
		return provider.Event{}, err
	}
	c := b.charge
	if b.Charges != nil {
		switch len(*b.Charges) {
		case 0:
			return provider.Event{}, provider.Irrelevant("order without charges")
		case 1:
			c = (*b.Charges)[0]
		default:
			return provider.Event{}, provider.Unprocessable("order with several charges")
		}
	}
	if err := provider.CheckID("charge id", c.ID); err != nil {
		return provider.Event{}, err
	}
	status, err := provider.LookupStatus(Statuses, "charge status", c.Status)
	if err != nil {
		return provider.Event{}, err
	}
	when := c.CreatedAt
	if status == payment.StatusPaid && c.PaidAt != "" {
		when = c.PaidAt
	}
	occurred, err := time.Parse(time.RFC3339Nano, when)
	if err != nil {
		return provider.Event{}, provider.Unprocessable("bad created_at or paid_at")
	}
	if err := provider.CheckTime("created_at or paid_at", occurred); err != nil {
		return provider.Event{}, err
	}
	fact := payment.Fact{Status: status, OccurredAt: occurred.UTC()}
	currency := c.Amount.Currency
	if currency == "" {
		currency = "BRL"
	}
	if fact.Currency, err = provider.Currency(currency); err != nil {
		return provider.Event{}, err
	}
	var refunded int64
	if c.Amount.Summary.Refunded != "" {
		if refunded, err = provider.AmountMinor(c.Amount.Summary.Refunded); err != nil {
			return provider.Event{}, err
		}
	}
	amount := c.Amount.Value
	if status == payment.StatusPaid && c.Amount.Summary.Paid != "" && c.Amount.Summary.Paid != "0" {
		amount = c.Amount.Summary.Paid
	}
	needsRefetch := false
	switch {
	case status == payment.StatusPaid && refunded > 0:
		// Partial refunds carry no id: the machine defers them until a
		// refetch tells which refunds exist.
		fact.Status = payment.StatusPartiallyRefunded
		amount = c.Amount.Summary.Refunded
		needsRefetch = true
	case status == payment.StatusCanceled && refunded > 0:
		// Canceled after payment: refunded in full.
		fact.Status = payment.StatusRefunded
		amount = c.Amount.Summary.Refunded
	}
	if amount != "" {
		if fact.AmountMinor, err = provider.AmountMinor(amount); err != nil {
			return provider.Event{}, err
		}
	}
	key := provider.BusinessKey(c.ID, c.Status, fact.Status, fact.OccurredAt, c.Amount.Summary.Refunded.String())
	return provider.Event{
		DedupKey:     provider.ScopeKey(d.account, key),
		PaymentID:    c.ID,
		Type:         c.Status,
		Fact:         fact,
		NeedsRefetch: needsRefetch,
	}, nil
}
