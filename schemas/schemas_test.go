package schemas_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/schemas"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// rawEnvelope builds a raw-topic value the way ingest does: a signed
// Standard Webhooks request, verified and parsed by the real driver, wrapped
// in an envelope.Raw and marshaled by its Marshal.
func rawEnvelope(t *testing.T) []byte {
	t.Helper()
	drv, err := standardwebhooks.New(provider.Config{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	body := []byte(`{"type":"payment.partially_refunded","timestamp":"2026-11-29T18:00:00Z",` +
		`"data":{"payment_id":"pay_1","amount":1050,"currency":"BRL","refund_id":"re_1","refund_amount":50}}`)
	req, err := standardwebhooks.SignedRequest(secret, "msg_1", now, body)
	if err != nil {
		t.Fatal(err)
	}
	ev := providertest.Accept(t, drv, req)
	raw := envelope.Raw{
		Source: "acme", Driver: "standardwebhooks", PaymentKey: "acme:" + ev.PaymentID, Event: ev,
		ReceivedAt: now.UTC(), Headers: map[string]string{"webhook-id": "msg_1"}, Body: body,
	}
	b, err := raw.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stateEvents builds payment-state values the way the processor does: from
// the transitions the real state machine makes for a payment paid, then
// partially refunded, then disputed.
func stateEvents(t *testing.T) [][]byte {
	t.Helper()
	at := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)
	facts := []payment.Fact{
		{Status: payment.StatusPending, AmountMinor: 1050, Currency: "BRL", OccurredAt: at},
		{Status: payment.StatusPaid, AmountMinor: 1050, Currency: "BRL", OccurredAt: at.Add(time.Minute)},
		{Status: payment.StatusPartiallyRefunded, AmountMinor: 50, Currency: "BRL", RefundID: "re_1", OccurredAt: at.Add(2 * time.Minute)},
		{Status: payment.StatusDisputed, AmountMinor: 1000, Currency: "BRL", OccurredAt: at.Add(3 * time.Minute)},
	}
	var m payment.Machine
	var s payment.State
	var out [][]byte
	for _, f := range facts {
		d := m.Apply(s, f)
		if d.Outcome != payment.OutcomeApplied {
			t.Fatalf("fact %+v: %s %s", f, d.Outcome, d.Reason)
		}
		for _, tr := range d.Transitions {
			ev := envelope.State{
				EventID: envelope.StateEventID("acme:pay_1", tr.Version), PaymentKey: "acme:pay_1", Source: "acme", PaymentID: "pay_1",
				Version: tr.Version, Status: tr.To, PreviousStatus: tr.From, Kind: tr.Kind,
				AmountMinor: tr.AmountMinor, Currency: tr.Currency, RefundID: tr.RefundID, Payment: d.State,
				SourceEventID: "msg_" + strconv.FormatInt(tr.Version, 10), OccurredAt: f.OccurredAt, RecordedAt: time.Now().UTC(),
			}
			b, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
		s = d.State
	}
	if len(out) < 4 {
		t.Fatalf("machine made %d transitions, want at least 4", len(out))
	}
	return out
}

func TestRawEnvelopeValidates(t *testing.T) {
	t.Parallel()
	b := rawEnvelope(t)
	if err := schemas.Validate(schemas.RawEnvelope, b); err != nil {
		t.Fatalf("envelope.Raw as marshaled does not match %s: %v\n%s", schemas.RawEnvelope, err, b)
	}
	// What ingest puts on the DLQ: no event, a reason.
	dlq := envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: "acme:unknown",
		ReceivedAt: time.Now().UTC(), Body: []byte(`{"type":"payment.nope"}`), Reason: "unprocessable payload: unknown type"}
	b, err := dlq.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := schemas.Validate(schemas.RawEnvelope, b); err != nil {
		t.Errorf("DLQ envelope does not match %s: %v\n%s", schemas.RawEnvelope, err, b)
	}
}

func TestStateValidates(t *testing.T) {
	t.Parallel()
	for _, b := range stateEvents(t) {
		if err := schemas.Validate(schemas.PaymentState, b); err != nil {
			t.Errorf("envelope.State as marshaled does not match %s: %v\n%s", schemas.PaymentState, err, b)
		}
	}
}

// TestEveryStatusIsInTheSchema: each status the state machine knows is
// allowed as status, previous_status and payment.status.
func TestEveryStatusIsInTheSchema(t *testing.T) {
	t.Parallel()
	base := stateEvents(t)[0]
	for _, st := range []payment.Status{
		payment.StatusPending, payment.StatusAuthorized, payment.StatusPaid, payment.StatusFailed, payment.StatusCanceled,
		payment.StatusRefunded, payment.StatusPartiallyRefunded, payment.StatusDisputed, payment.StatusDisputeWon, payment.StatusDisputeLost,
	} {
		for _, path := range []string{"status", "previous_status", "payment.status"} {
			b := mutate(t, base, path, string(st))
			if err := schemas.Validate(schemas.PaymentState, b); err != nil {
				t.Errorf("%s = %q rejected: %v", path, st, err)
			}
		}
	}
}

// TestBrokenValuesFail: each mutation of a valid value breaks one promise
// of its schema and must be rejected.
func TestBrokenValuesFail(t *testing.T) {
	t.Parallel()
	cases := []struct {
		schema string
		valid  []byte
		path   string
		value  any // deleteField removes the field
	}{
		{schemas.RawEnvelope, rawEnvelope(t), "v", 2},
		{schemas.RawEnvelope, rawEnvelope(t), "source", deleteField},
		{schemas.RawEnvelope, rawEnvelope(t), "source", ""},
		{schemas.RawEnvelope, rawEnvelope(t), "payment_key", deleteField},
		{schemas.RawEnvelope, rawEnvelope(t), "body", deleteField},
		{schemas.RawEnvelope, rawEnvelope(t), "body", 42},
		{schemas.RawEnvelope, rawEnvelope(t), "body", "@@ not base64 @@"},
		{schemas.RawEnvelope, rawEnvelope(t), "received_at", "yesterday"},
		{schemas.RawEnvelope, rawEnvelope(t), "event.fact.occurred_at", "2026-11-29 18:00"},
		{schemas.RawEnvelope, rawEnvelope(t), "received_at", deleteField},
		{schemas.RawEnvelope, rawEnvelope(t), "event", deleteField},
		{schemas.RawEnvelope, rawEnvelope(t), "event.dedup_key", deleteField},
		{schemas.RawEnvelope, rawEnvelope(t), "event.fact", deleteField},
		{schemas.RawEnvelope, rawEnvelope(t), "event.fact.currency", deleteField},
		{schemas.RawEnvelope, rawEnvelope(t), "event.fact.amount_minor", 10.5},
		{schemas.RawEnvelope, rawEnvelope(t), "headers", map[string]any{"webhook-id": 1}},
		{schemas.PaymentState, stateEvents(t)[1], "event_id", deleteField},
		{schemas.PaymentState, stateEvents(t)[1], "version", 0},
		{schemas.PaymentState, stateEvents(t)[1], "version", "1"},
		{schemas.PaymentState, stateEvents(t)[1], "status", "settled"},
		{schemas.PaymentState, stateEvents(t)[1], "status", deleteField},
		{schemas.PaymentState, stateEvents(t)[1], "previous_status", "settled"},
		{schemas.PaymentState, stateEvents(t)[1], "amount_minor", 10.5},
		{schemas.PaymentState, stateEvents(t)[1], "amount_minor", "1050"},
		{schemas.PaymentState, stateEvents(t)[1], "currency", deleteField},
		{schemas.PaymentState, stateEvents(t)[1], "payment", deleteField},
		{schemas.PaymentState, stateEvents(t)[1], "payment.status", "settled"},
		{schemas.PaymentState, stateEvents(t)[1], "payment.version", deleteField},
		{schemas.PaymentState, stateEvents(t)[1], "occurred_at", deleteField},
		{schemas.PaymentState, stateEvents(t)[1], "occurred_at", "yesterday"},
		{schemas.PaymentState, stateEvents(t)[1], "recorded_at", deleteField},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s %s=%v", tc.schema, tc.path, tc.value)
		if err := schemas.Validate(tc.schema, tc.valid); err != nil {
			t.Fatalf("%s: the unmutated value is already invalid: %v", name, err)
		}
		if err := schemas.Validate(tc.schema, mutate(t, tc.valid, tc.path, tc.value)); err == nil {
			t.Errorf("%s: accepted, want rejected", name)
		}
	}
}

func TestValidateRejectsNonJSONAndUnknownSchemas(t *testing.T) {
	t.Parallel()
	if err := schemas.Validate(schemas.PaymentState, []byte(`{"event_id":`)); err == nil {
		t.Error("truncated JSON accepted")
	}
	if err := schemas.Validate("nope.v1.json", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "nope.v1.json") {
		t.Errorf("unknown schema: %v, want an error naming it", err)
	}
}

// deleteField, as a mutation's value, removes the field.
var deleteField = struct{ delete bool }{true}

// mutate decodes value, sets (or deletes) the dotted path and re-encodes it.
func mutate(t *testing.T, value []byte, path string, to any) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(value, &doc); err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(path, ".")
	obj := doc
	for _, p := range parts[:len(parts)-1] {
		next, ok := obj[p].(map[string]any)
		if !ok {
			t.Fatalf("mutate %s: %s is not an object in %s", path, p, value)
		}
		obj = next
	}
	last := parts[len(parts)-1]
	if _, ok := obj[last]; !ok {
		t.Fatalf("mutate %s: no such field in %s", path, value)
	}
	if to == deleteField {
		delete(obj, last)
	} else {
		obj[last] = to
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ExampleValidate() {
	state := envelope.State{
		EventID: "acme:pay_1:1", PaymentKey: "acme:pay_1", Source: "acme", PaymentID: "pay_1",
		Version: 1, Status: payment.StatusPaid, Kind: "capture", AmountMinor: 1050, Currency: "BRL",
		Payment:    payment.State{Status: payment.StatusPaid, Version: 1, AmountMinor: 1050, Currency: "BRL"},
		OccurredAt: time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC), RecordedAt: time.Date(2026, 11, 29, 18, 0, 1, 0, time.UTC),
	}
	b, _ := json.Marshal(state)
	fmt.Println("paid:", schemas.Validate(schemas.PaymentState, b) == nil)

	state.Status = "settled" // not a paystream status
	b, _ = json.Marshal(state)
	fmt.Println("settled:", schemas.Validate(schemas.PaymentState, b) == nil)
	// Output:
	// paid: true
	// settled: false
}
