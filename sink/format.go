package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/paystream/paystream/schemas"
)

// Format is the encoding of the state values the relay writes, on the
// state topic and the latest-state topic alike.
type Format string

// The formats.
const (
	// FormatJSON writes the JSON the processor wrote
	// (schemas/payment-state.v1.json), untouched.
	FormatJSON Format = "json"
	// FormatAvro writes schemas/payment-state.v1.avsc in the Confluent wire
	// format (magic byte 0, the schema's 4-byte registry id, Avro binary),
	// the schema registered under each topic's subject "<topic>-value"
	// (TopicNameStrategy) with compatibility BACKWARD.
	FormatAvro Format = "avro"
)

// AvroContentType is the content-type header of an Avro state record.
const AvroContentType = "application/avro"

// ParseFormat returns the Format named s: "json" (or "") or "avro".
func ParseFormat(s string) (Format, error) {
	switch Format(s) {
	case "", FormatJSON:
		return FormatJSON, nil
	case FormatAvro:
		return FormatAvro, nil
	}
	return "", fmt.Errorf("state format %q: want json or avro", s)
}

// Subject is the registry subject of topic's values (TopicNameStrategy).
func Subject(topic string) string { return topic + "-value" }

// stateFormat validates a configuration's Format and registry; with
// FormatAvro it registers the schema for topics (empty names skipped) and
// returns the encoding, else nil: the processor's JSON.
func stateFormat(ctx context.Context, format Format, cl *sr.Client, topics ...string) (*encoding, error) {
	switch format {
	case "", FormatJSON:
		return nil, nil
	case FormatAvro:
		if cl == nil {
			return nil, errors.New("state format avro: SchemaRegistry is required")
		}
		return registerAvro(ctx, cl, topics...)
	}
	return nil, fmt.Errorf("state format %q: want json or avro", format)
}

// encoding turns the processor's JSON state values into Avro in the
// Confluent wire format. A nil *encoding leaves them JSON.
type encoding struct {
	schema avro.Schema
	// per topic: the wire-format prefix (magic byte and schema id) and
	// the ce_dataschema header, the registry's URL of the schema.
	prefix     map[string][]byte
	dataSchema map[string][]byte
}

var avroContentTypeValue = []byte(AvroContentType)

// registerAvro registers schemas.PaymentStateAvro under each topic's
// subject, sets the subject's compatibility to BACKWARD, and returns the
// encoding with the ids the registry gave. Registering a schema the
// subject already has returns its id and adds no version.
func registerAvro(ctx context.Context, cl *sr.Client, topics ...string) (*encoding, error) {
	schema, err := avro.Parse(schemas.PaymentStateAvro)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", schemas.PaymentStateAvroFile, err)
	}
	base := registryBase(cl)
	enc := &encoding{schema: schema, prefix: map[string][]byte{}, dataSchema: map[string][]byte{}}
	for _, topic := range topics {
		if topic == "" {
			continue
		}
		subject := Subject(topic)
		ss, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: schemas.PaymentStateAvro, Type: sr.TypeAvro})
		if err != nil {
			return nil, fmt.Errorf("register %s under subject %s: %w", schemas.PaymentStateAvroFile, subject, err)
		}
		for _, res := range cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatBackward}, subject) {
			if res.Err != nil {
				return nil, fmt.Errorf("set subject %s compatibility BACKWARD: %w", subject, res.Err)
			}
		}
		var h sr.ConfluentHeader
		prefix, err := h.AppendEncode(nil, ss.ID, nil)
		if err != nil {
			return nil, fmt.Errorf("subject %s schema id %d: %w", subject, ss.ID, err)
		}
		enc.prefix[topic] = prefix
		enc.dataSchema[topic] = []byte(base + "/schemas/ids/" + strconv.Itoa(ss.ID))
	}
	return enc, nil
}

// registryBase is the client's first registry URL, without a trailing
// slash: ce_dataschema names the schema under it.
func registryBase(cl *sr.Client) string {
	if urls, ok := cl.OptValue(sr.URLs).([]string); ok && len(urls) > 0 {
		return strings.TrimRight(urls[0], "/")
	}
	return ""
}

// avroState is the Avro record of payment-state.v1.avsc, decoded from the
// processor's JSON: the json tags read the event, the avro tags write it.
// Fields the JSON has and the Avro schema does not (the payment object's
// beyond its four) are dropped.
type avroState struct {
	EventID        string      `json:"event_id" avro:"event_id"`
	PaymentKey     string      `json:"payment_key" avro:"payment_key"`
	Source         string      `json:"source" avro:"source"`
	PaymentID      string      `json:"payment_id" avro:"payment_id"`
	Version        int64       `json:"version" avro:"version"`
	Status         string      `json:"status" avro:"status"`
	PreviousStatus string      `json:"previous_status" avro:"previous_status"`
	Kind           string      `json:"kind" avro:"kind"`
	AmountMinor    int64       `json:"amount_minor" avro:"amount_minor"`
	Currency       string      `json:"currency" avro:"currency"`
	RefundID       *string     `json:"refund_id" avro:"refund_id"`
	Payment        avroPayment `json:"payment" avro:"payment"`
	SourceEventID  *string     `json:"source_event_id" avro:"source_event_id"`
	OccurredAt     time.Time   `json:"occurred_at" avro:"occurred_at"`
	RecordedAt     time.Time   `json:"recorded_at" avro:"recorded_at"`
}

type avroPayment struct {
	Status      string `json:"status" avro:"status"`
	Version     int64  `json:"version" avro:"version"`
	AmountMinor int64  `json:"amount_minor" avro:"amount_minor"`
	Currency    string `json:"currency" avro:"currency"`
}

// encode rewrites rec, a state record whose value is the processor's JSON,
// for rec.Topic: the value in the Confluent wire format, the content-type
// and ce_dataschema headers naming it. Nothing changes on a nil encoding.
func (e *encoding) encode(rec *kgo.Record) error {
	if e == nil {
		return nil
	}
	prefix, ok := e.prefix[rec.Topic]
	if !ok {
		return fmt.Errorf("state format avro: no schema registered for topic %s", rec.Topic)
	}
	var st avroState
	if err := json.Unmarshal(rec.Value, &st); err != nil {
		return fmt.Errorf("decode state event %s: %w", rec.Key, err)
	}
	b, err := avro.Marshal(e.schema, &st)
	if err != nil {
		return fmt.Errorf("encode state event %s in avro: %w", st.EventID, err)
	}
	rec.Value = append(append(make([]byte, 0, len(prefix)+len(b)), prefix...), b...)
	e.setHeaders(rec.Headers, rec.Topic)
	return nil
}

// setHeaders points the content-type and ce_dataschema headers of hs at
// topic's schema.
func (e *encoding) setHeaders(hs []kgo.RecordHeader, topic string) {
	for i := range hs {
		switch hs[i].Key {
		case "content-type":
			hs[i].Value = avroContentTypeValue
		case "ce_dataschema":
			hs[i].Value = e.dataSchema[topic]
		}
	}
}

// retarget returns the value and headers of a record encoded for the
// state topic as they are for topic: the same when the registry gave
// both subjects one id (Confluent's registry does, for one schema), else
// with topic's schema id and ce_dataschema.
func (e *encoding) retarget(value []byte, headers []kgo.RecordHeader, topic string) ([]byte, []kgo.RecordHeader) {
	if e == nil {
		return value, headers
	}
	prefix := e.prefix[topic]
	if len(value) < len(prefix) || bytes.Equal(value[:len(prefix)], prefix) {
		return value, headers
	}
	v := bytes.Clone(value)
	copy(v, prefix)
	hs := append([]kgo.RecordHeader(nil), headers...)
	e.setHeaders(hs, topic)
	return v, hs
}
