package mercadopago

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// notification is a Mercado Pago webhook body: a pointer to a resource, no
// state.
type notification struct {
	ID          json.Number `json:"id"`
	Type        string      `json:"type"`
	Action      string      `json:"action"`
	DateCreated string      `json:"date_created"`
	Data        struct {
		ID json.RawMessage `json:"id"`
	} `json:"data"`
}

// Statuses maps the actions of "payment" notifications to the status Parse
// puts in the Fact. payment.updated says only that something changed, so its
// status is empty: the refetch decides.
var Statuses = map[string]payment.Status{
	"payment.created": payment.StatusPending,
	"payment.updated": "",
}

// Parse normalizes a Mercado Pago notification. PaymentID is the query's
// data.id (the signed one), else the body's data.id. EventID is the body's
// notification id, which Mercado Pago keeps across retries; it is the dedup
// key, else a key derived from payment id, action and date_created. Every
// event has NeedsRefetch set. Notifications about other topics
// (merchant_order, subscriptions, …) are provider.ErrIrrelevant.
func (d *Driver) Parse(r *provider.Request) (provider.Event, error) {
	var n notification
	if err := provider.DecodeJSON(r.Body, &n); err != nil {
		return provider.Event{}, err
	}
	if n.Type != "" && n.Type != "payment" {
		return provider.Event{}, provider.Irrelevant("topic " + clip(n.Type))
	}
	action := n.Action
	if action == "" && n.Type == "payment" {
		action = "payment.updated"
	}
	status, ok := Statuses[action]
	if !ok {
		if action == "" {
			return provider.Event{}, provider.Unprocessable("missing type and action")
		}
		return provider.Event{}, provider.Unprocessable("unknown action")
	}
	paymentID := r.Query.Get(QueryDataID)
	if paymentID == "" {
		paymentID = rawID(n.Data.ID)
	}
	if err := provider.CheckID("data.id", paymentID); err != nil {
		return provider.Event{}, err
	}
	var occurred time.Time
	if n.DateCreated != "" {
		t, err := time.Parse(time.RFC3339Nano, n.DateCreated)
		if err != nil {
			return provider.Event{}, provider.Unprocessable("bad date_created")
		}
		if err := provider.CheckTime("date_created", t); err != nil {
			return provider.Event{}, err
		}
		occurred = t.UTC()
	}
	ev := provider.Event{
		EventID:      n.ID.String(),
		PaymentID:    paymentID,
		Type:         action,
		Fact:         payment.Fact{Status: status, OccurredAt: occurred},
		NeedsRefetch: true,
	}
	key, err := provider.EventKey(ev, "id", "date_created")
	if err != nil {
		return provider.Event{}, err
	}
	ev.DedupKey = provider.ScopeKey(d.signing.Account, key)
	return ev, nil
}

// rawID reads data.id, which Mercado Pago sends as a string or a number.
func rawID(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

func clip(s string) string {
	if len(s) > 32 {
		s = s[:32]
	}
	return strings.ToValidUTF8(s, "")
}
