package standardwebhooks

import (
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// Statuses maps the event types of paystream's payload convention to the
// normalized status each asserts.
var Statuses = map[string]payment.Status{
	"payment.created":            payment.StatusPending,
	"payment.authorized":         payment.StatusAuthorized,
	"payment.paid":               payment.StatusPaid,
	"payment.failed":             payment.StatusFailed,
	"payment.canceled":           payment.StatusCanceled,
	"payment.refunded":           payment.StatusRefunded,
	"payment.partially_refunded": payment.StatusPartiallyRefunded,
	"payment.disputed":           payment.StatusDisputed,
	"payment.dispute_won":        payment.StatusDisputeWon,
	"payment.dispute_lost":       payment.StatusDisputeLost,
}

// Payload is paystream's payload convention for Standard Webhooks and
// generic-HMAC senders:
//
//	{"type": "payment.paid", "timestamp": "2024-06-12T16:45:03Z",
//	 "data": {"payment_id": "pay_1", "amount": 10050, "currency": "BRL",
//	          "refund_id": "re_1", "refund_amount": 5000}}
//
// Amounts are JSON integers in minor units of currency.
type Payload struct {
	// Type is one of the keys of Statuses.
	Type string `json:"type"`
	// Timestamp is when the fact happened, RFC 3339.
	Timestamp string `json:"timestamp"`
	// Data describes the payment.
	Data PayloadData `json:"data"`
}

// PayloadData is the "data" object of a Payload.
type PayloadData struct {
	// PaymentID is the sender's payment id. Required.
	PaymentID string `json:"payment_id"`
	// Amount is the payment's amount in minor units of Currency.
	Amount provider.Amount `json:"amount"`
	// Currency is an ISO 4217 code; required with an amount.
	Currency string `json:"currency"`
	// RefundID identifies one refund, for refund types.
	RefundID string `json:"refund_id"`
	// RefundAmount is that refund's amount in minor units; Amount when
	// absent.
	RefundAmount provider.Amount `json:"refund_amount"`
}

// ParsePayload normalizes a body following the Payload convention into an
// Event without EventID and DedupKey, which depend on the transport. When
// the body has no "timestamp", fallback is used as Fact.OccurredAt.
//
// For payment.refunded and payment.partially_refunded carrying a refund_id,
// Fact.AmountMinor is the refund's amount (refund_amount, else amount) and
// Fact.RefundID is set, so each refund is applied once whatever its order.
//
// Errors wrap provider.ErrUnprocessable.
func ParsePayload(body []byte, fallback time.Time) (provider.Event, error) {
	var p Payload
	if err := provider.DecodeJSON(body, &p); err != nil {
		return provider.Event{}, err
	}
	status, err := provider.LookupStatus(Statuses, "type", p.Type)
	if err != nil {
		return provider.Event{}, err
	}
	if err := provider.CheckID("payment_id", p.Data.PaymentID); err != nil {
		return provider.Event{}, err
	}
	occurred := fallback
	if p.Timestamp != "" {
		t, err := time.Parse(time.RFC3339Nano, p.Timestamp)
		if err != nil {
			return provider.Event{}, provider.Unprocessable("timestamp not RFC 3339")
		}
		occurred = t
	}
	if occurred.IsZero() {
		return provider.Event{}, provider.Unprocessable("missing timestamp")
	}
	if err := provider.CheckTime("timestamp", occurred); err != nil {
		return provider.Event{}, err
	}
	fact := payment.Fact{Status: status, OccurredAt: occurred.UTC()}

	if p.Data.Currency != "" {
		cur, err := provider.Currency(p.Data.Currency)
		if err != nil {
			return provider.Event{}, err
		}
		fact.Currency = cur
	}
	amount := p.Data.Amount
	if p.Data.RefundID != "" && (status == payment.StatusRefunded || status == payment.StatusPartiallyRefunded) {
		if err := provider.CheckID("refund_id", p.Data.RefundID); err != nil {
			return provider.Event{}, err
		}
		fact.RefundID = p.Data.RefundID
		if p.Data.RefundAmount != "" {
			amount = p.Data.RefundAmount
		}
	}
	if amount != "" {
		if fact.AmountMinor, err = provider.FactAmountMinor(amount, fact.Currency); err != nil {
			return provider.Event{}, err
		}
	}
	return provider.Event{
		PaymentID: p.Data.PaymentID,
		Type:      p.Type,
		Fact:      fact,
	}, nil
}
