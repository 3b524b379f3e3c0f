package asaas

import (
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// brasilia is the zone of Asaas' timestamps, which carry none. Brazil has
// had no daylight saving time since 2019, so a fixed offset is exact.
var brasilia = time.FixedZone("BRT", -3*60*60)

// notification is the part of an Asaas webhook paystream reads.
type notification struct {
	ID          string `json:"id"`
	Event       string `json:"event"`
	DateCreated string `json:"dateCreated"`
	Payment     struct {
		ID     string          `json:"id"`
		Value  provider.Amount `json:"value"`
		Status string          `json:"status"`
	} `json:"payment"`
}

// Statuses maps the Asaas events the driver understands to the status each
// asserts. Events mapped to "" are authentic but carry no payment fact
// (Parse returns provider.ErrIrrelevant).
var Statuses = map[string]payment.Status{
	"PAYMENT_CREATED":                      payment.StatusPending,
	"PAYMENT_RESTORED":                     payment.StatusPending,
	"PAYMENT_OVERDUE":                      payment.StatusPending,
	"PAYMENT_AUTHORIZED":                   payment.StatusAuthorized,
	"PAYMENT_CONFIRMED":                    payment.StatusPaid,
	"PAYMENT_RECEIVED":                     payment.StatusPaid,
	"PAYMENT_CREDIT_CARD_CAPTURE_REFUSED":  payment.StatusFailed,
	"PAYMENT_REPROVED_BY_RISK_ANALYSIS":    payment.StatusFailed,
	"PAYMENT_DELETED":                      payment.StatusCanceled,
	"PAYMENT_REFUNDED":                     payment.StatusRefunded,
	"PAYMENT_PARTIALLY_REFUNDED":           payment.StatusPartiallyRefunded,
	"PAYMENT_CHARGEBACK_REQUESTED":         payment.StatusDisputed,
	"PAYMENT_CHARGEBACK_DISPUTE":           payment.StatusDisputed,
	"PAYMENT_AWAITING_CHARGEBACK_REVERSAL": payment.StatusDisputeWon,

	"PAYMENT_UPDATED":                         "",
	"PAYMENT_ANTICIPATED":                     "",
	"PAYMENT_AWAITING_RISK_ANALYSIS":          "",
	"PAYMENT_APPROVED_BY_RISK_ANALYSIS":       "",
	"PAYMENT_REFUND_IN_PROGRESS":              "",
	"PAYMENT_REFUND_DENIED":                   "",
	"PAYMENT_BANK_SLIP_VIEWED":                "",
	"PAYMENT_CHECKOUT_VIEWED":                 "",
	"PAYMENT_DUNNING_REQUESTED":               "",
	"PAYMENT_DUNNING_RECEIVED":                "",
	"PAYMENT_RECEIVED_IN_CASH_UNDONE":         "",
	"PAYMENT_BANK_SLIP_CANCELLED":             "",
	"PAYMENT_SPLIT_CANCELLED":                 "",
	"PAYMENT_SPLIT_DIVERGENCE_BLOCK":          "",
	"PAYMENT_SPLIT_DIVERGENCE_BLOCK_FINISHED": "",
}

// Parse normalizes an Asaas notification. EventID and DedupKey are the
// notification's id (evt_…) when present; otherwise the dedup key is derived
// from payment id, event, status and dateCreated. Amounts ("value", a
// decimal in reais) are parsed exactly.
//
// PAYMENT_PARTIALLY_REFUNDED carries no refund id or refund amount, so it is
// a partially_refunded fact without RefundID, marked NeedsRefetch.
func (d *Driver) Parse(r *provider.Request) (provider.Event, error) {
	var n notification
	if err := provider.DecodeJSON(r.Body, &n); err != nil {
		return provider.Event{}, err
	}
	status, err := provider.LookupStatus(Statuses, "event", n.Event)
	if err != nil {
		return provider.Event{}, err
	}
	if err := provider.CheckID("payment id", n.Payment.ID); err != nil {
		return provider.Event{}, err
	}
	occurred, err := time.ParseInLocation("2006-01-02 15:04:05", n.DateCreated, brasilia)
	if err != nil {
		if occurred, err = time.Parse(time.RFC3339Nano, n.DateCreated); err != nil {
			return provider.Event{}, provider.Unprocessable("bad dateCreated")
		}
	}
	if err := provider.CheckTime("dateCreated", occurred); err != nil {
		return provider.Event{}, err
	}
	fact := payment.Fact{Status: status, Currency: "BRL", OccurredAt: occurred.UTC()}
	if status != payment.StatusPartiallyRefunded && n.Payment.Value != "" {
		if fact.AmountMinor, err = provider.AmountMajor(n.Payment.Value, "BRL"); err != nil {
			return provider.Event{}, err
		}
	}
	ev := provider.Event{
		EventID:      n.ID,
		PaymentID:    n.Payment.ID,
		Type:         n.Event,
		Fact:         fact,
		NeedsRefetch: status == payment.StatusPartiallyRefunded,
	}
	key, err := provider.EventKey(ev, "event id", "dateCreated")
	if err != nil {
		return provider.Event{}, err
	}
	ev.DedupKey = provider.ScopeKey(d.account, key)
	return ev, nil
}
