package zoop

import (
	"strings"
	"time"
	"unicode"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// event is a Zoop webhook body: the event resource, with the resource it is
// about (for transactions, the whole transaction) in payload.object. Only
// what routes and deduplicates the event is read; the transaction's
// status and amounts come from the refetch.
type event struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Resource  string `json:"resource"`
	URI       string `json:"uri"`
	CreatedAt string `json:"created_at"`
	Payload   *struct {
		Object *eventObject `json:"object"`
	} `json:"payload"`
	// Object is where some of Zoop's published examples put the resource
	// (no payload wrapper); read only when payload.object is absent.
	Object *eventObject `json:"object"`
}

// eventObject is the part of the event's resource Parse reads.
type eventObject struct {
	ID       string `json:"id"`
	Resource string `json:"resource"`
	URI      string `json:"uri"`
}

// Statuses maps the transaction event types to the status Parse puts in the
// Fact. The status is a hint for humans reading the inbox (paystream
// inspect): every Zoop event has NeedsRefetch, so the processor applies the
// refetched transaction, never this fact. An empty status means the type
// alone does not say (a void may cancel an authorization or refund a
// capture): the refetch decides.
var Statuses = map[string]payment.Status{
	"transaction.created":                     payment.StatusPending,
	"transaction.updated":                     "",
	"transaction.pre_authorized":              payment.StatusAuthorized,
	"transaction.pre_authorization.succeeded": payment.StatusAuthorized,
	"transaction.pre_authorization.failed":    payment.StatusFailed,
	"transaction.authorization.succeeded":     payment.StatusPaid,
	"transaction.authorization.failed":        payment.StatusFailed,
	"transaction.capture.succeeded":           payment.StatusPaid,
	"transaction.capture.failed":              "",
	"transaction.succeeded":                   payment.StatusPaid,
	"transaction.failed":                      payment.StatusFailed,
	"transaction.canceled":                    "",
	"transaction.void.succeeded":              "",
	"transaction.void.failed":                 "",
	"transaction.reversed":                    "",
	"transaction.disputed":                    payment.StatusDisputed,
	"transaction.dispute.succeeded":           "",
	"transaction.charged_back":                payment.StatusDisputeLost,
}

// irrelevantTypes are transaction events that assert nothing about the
// payment's money.
var irrelevantTypes = map[string]bool{
	"transaction.commission.succeeded": true,
}

// Parse normalizes a Zoop event. Events whose type is not a transaction
// event (seller.*, invoice.*, subscription.*, buyer.transaction.*, …) and
// transaction.commission.succeeded are provider.ErrIrrelevant. PaymentID is
// the transaction id, payload.object.id (else object.id). The event id is
// the dedup key (Zoop's event resource has an id of its own, kept when an
// event is re-sent); without one, a key derived from the transaction id,
// type and created_at. A uri naming another marketplace than the driver's
// is unprocessable: the source's URL was registered on another
// marketplace, and its payment keys would be scoped wrongly. Every event
// has NeedsRefetch.
func (d *Driver) Parse(r *provider.Request) (provider.Event, error) {
	var ev event
	if err := provider.DecodeJSON(r.Body, &ev); err != nil {
		return provider.Event{}, err
	}
	switch {
	case ev.Type == "":
		return provider.Event{}, provider.Unprocessable("missing type")
	case !strings.HasPrefix(ev.Type, "transaction."):
		return provider.Event{}, provider.Irrelevant("event type " + clip(ev.Type))
	case irrelevantTypes[ev.Type]:
		return provider.Event{}, provider.Irrelevant("event type " + ev.Type)
	}
	status, ok := Statuses[ev.Type]
	if !ok {
		return provider.Event{}, provider.Unprocessable("unknown transaction event type")
	}
	if ev.Resource != "" && ev.Resource != "event" && ev.Resource != "transaction" {
		return provider.Event{}, provider.Unprocessable("resource is neither event nor transaction")
	}
	obj := ev.Object
	if ev.Payload != nil && ev.Payload.Object != nil {
		obj = ev.Payload.Object
	}
	if obj == nil {
		return provider.Event{}, provider.Unprocessable("missing payload.object")
	}
	if obj.Resource != "" && obj.Resource != "transaction" {
		return provider.Event{}, provider.Unprocessable("payload.object is not a transaction")
	}
	if err := provider.CheckID("payload.object.id", obj.ID); err != nil {
		return provider.Event{}, err
	}
	if !validID(obj.ID) {
		return provider.Event{}, provider.Unprocessable("payload.object.id is not a Zoop id")
	}
	if !d.ownURI(ev.URI) || !d.ownURI(obj.URI) {
		return provider.Event{}, provider.Unprocessable("uri names another marketplace")
	}
	var occurred time.Time
	if ev.CreatedAt != "" {
		t, err := parseTime("created_at", ev.CreatedAt)
		if err != nil {
			return provider.Event{}, err
		}
		occurred = t
	}
	out := provider.Event{
		EventID:      ev.ID,
		PaymentID:    obj.ID,
		Type:         ev.Type,
		Fact:         payment.Fact{Status: status, OccurredAt: occurred},
		NeedsRefetch: true,
	}
	key, err := provider.EventKey(out, "id", "created_at")
	if err != nil {
		return provider.Event{}, err
	}
	out.DedupKey = provider.ScopeKey(d.account, key)
	return out, nil
}

// ownURI reports whether uri, a Zoop resource path, is empty or under the
// driver's marketplace: /v1/marketplaces/{marketplace_id}/….
func (d *Driver) ownURI(uri string) bool {
	if uri == "" {
		return true
	}
	rest, ok := strings.CutPrefix(uri, "/v1/marketplaces/")
	if !ok {
		return false
	}
	mp, _, _ := strings.Cut(rest, "/")
	return mp == d.marketplace
}

// timeLayouts are the forms Zoop's timestamps take: RFC 3339 in resources
// ("2020-07-06T14:01:48+00:00"), a zone without colon in events
// ("2020-07-06T14:01:51+0000") and zone-less in history entries
// ("2020-07-06 14:01:48", read as UTC like every other Zoop time).
var timeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05.999999999Z0700",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
}

// parseTime reads one of Zoop's timestamps, in UTC. what names the field in
// errors.
func parseTime(what, s string) (time.Time, error) {
	for _, layout := range timeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			if err := provider.CheckTime(what, t); err != nil {
				return time.Time{}, err
			}
			return t.UTC(), nil
		}
	}
	return time.Time{}, provider.Unprocessable(what + " is not a Zoop timestamp")
}

// clip shortens s for an error reason, without invalid UTF-8 or control
// characters.
func clip(s string) string {
	if len(s) > 40 {
		s = s[:40]
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
}
