// Package envelope defines paystream's two wire formats: the versioned
// envelope ingest produces to the raw topic (the webhook byte-exact plus what
// ingest normalized from it) and the payment-state event the sink relays to
// the normalized topic. Their JSON Schemas live in schemas/.
package envelope

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// Topic names.
const (
	TopicRaw   = "paystream.webhooks.raw.v1"
	TopicState = "paystream.payments.state.v1"
	// TopicLatest is the compacted latest-state topic: each payment's
	// newest state event, published in the same Kafka transaction as the
	// state topic's.
	TopicLatest = "paystream.payments.latest.v1"
	TopicDLQ    = "paystream.webhooks.dlq.v1"
)

// HeaderEventID is the Kafka record header carrying a state event's id.
const HeaderEventID = "event-id"

// RawVersion is the version of Raw this code writes.
const RawVersion = 1

// Raw is the value of a record on the raw topic: one authentic webhook.
type Raw struct {
	V          int               `json:"v"`
	Source     string            `json:"source"`
	Driver     string            `json:"driver"`
	PaymentKey string            `json:"payment_key"`
	Event      provider.Event    `json:"event"`
	ReceivedAt time.Time         `json:"received_at"`
	Headers    map[string]string `json:"headers,omitempty"`
	// Body is the webhook body byte-exact (base64 in JSON).
	Body []byte `json:"body"`
	// Reason is set only on the DLQ: why the event could not be processed.
	Reason string `json:"reason,omitempty"`
}

// ErrUndecodable marks a raw record that is not a valid envelope.
var ErrUndecodable = errors.New("undecodable envelope")

// Marshal encodes r as JSON.
func (r *Raw) Marshal() ([]byte, error) {
	if r.V == 0 {
		r.V = RawVersion
	}
	return json.Marshal(r)
}

// DecodeRaw decodes and validates a raw record value, as encoding/json
// decodes it into a Raw, but faster for the shape ingest writes (see
// decodeRawFast). Errors wrap ErrUndecodable.
func DecodeRaw(b []byte) (Raw, error) {
	r, ok := decodeRawFast(b)
	if !ok {
		var err error
		if r, err = decodeRawJSON(b); err != nil {
			return Raw{}, fmt.Errorf("%w: %v", ErrUndecodable, err)
		}
	}
	if err := validateRaw(&r); err != nil {
		return Raw{}, err
	}
	return r, nil
}

// validateRaw checks what a decoded envelope must carry. Errors wrap
// ErrUndecodable.
func validateRaw(r *Raw) error {
	switch {
	case r.V != RawVersion:
		return fmt.Errorf("%w: unsupported version %d", ErrUndecodable, r.V)
	case r.Source == "":
		return fmt.Errorf("%w: missing source", ErrUndecodable)
	case r.PaymentKey == "":
		return fmt.Errorf("%w: missing payment_key", ErrUndecodable)
	case r.Event.DedupKey == "":
		return fmt.Errorf("%w: missing dedup_key", ErrUndecodable)
	}
	return nil
}

// State is a normalized payment-state event: one per payment transition.
// EventID is "{payment key}:{version}", stable across re-deliveries, so
// consumers deduplicate on it.
type State struct {
	EventID        string         `json:"event_id"`
	PaymentKey     string         `json:"payment_key"`
	Source         string         `json:"source"`
	PaymentID      string         `json:"payment_id"`
	Version        int64          `json:"version"`
	Status         payment.Status `json:"status"`
	PreviousStatus payment.Status `json:"previous_status"`
	Kind           string         `json:"kind"`
	AmountMinor    int64          `json:"amount_minor"`
	Currency       string         `json:"currency"`
	RefundID       string         `json:"refund_id,omitempty"`
	Payment        payment.State  `json:"payment"`
	SourceEventID  string         `json:"source_event_id,omitempty"`
	OccurredAt     time.Time      `json:"occurred_at"`
	RecordedAt     time.Time      `json:"recorded_at"`
}

// StateEventID is the stable id of a payment's state event at version.
func StateEventID(paymentKey string, version int64) string {
	return fmt.Sprintf("%s:%d", paymentKey, version)
}
