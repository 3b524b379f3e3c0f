// Package dlq reads paystream's dead-letter topic and replays its records.
//
// Ingest dead-letters a webhook that is authentic (its signature verified)
// but that its source's driver could not parse: an unknown type, a missing
// payment id, a bad amount. The record's value is the raw envelope
// (schemas/dlq-record.v1.json) with the reason and without a normalized
// event; its key is "{source}:unknown".
//
// [Tool.Scan] and [Tool.Get] read records; [Tool.Replay] re-runs the
// source's driver on a record's stored body and, if it now parses, produces
// the raw envelope ingest would have produced to the raw topic, once: each
// replay is recorded on a small compacted topic (DefaultReplaysTopic) keyed
// by the record's position, and a record found there is not replayed again.
//
// Replay trusts the DLQ: the signature was verified by ingest when the
// webhook arrived, and the signature headers are not kept (some gateways
// send their secret itself), so it cannot be verified again. Whoever can
// write to the DLQ topic can therefore inject events through replay; give
// only ingest write access to it.
package dlq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
)

// DefaultReplaysTopic is the compacted topic recording which DLQ records
// were replayed.
const DefaultReplaysTopic = "paystream.webhooks.dlq-replays.v1"

// HeaderReplayedFrom is the Kafka header a replayed raw record carries: the
// DLQ record it came from, "{topic}/{partition}/{offset}".
const HeaderReplayedFrom = "dlq-replayed-from"

// Position is a record's place in its topic.
type Position struct {
	Partition int32 `json:"partition"`
	Offset    int64 `json:"offset"`
}

// String is "partition/offset".
func (p Position) String() string { return fmt.Sprintf("%d/%d", p.Partition, p.Offset) }

// ParsePosition parses "partition/offset".
func ParsePosition(s string) (Position, error) {
	ps, offs, ok := strings.Cut(s, "/")
	if !ok {
		return Position{}, fmt.Errorf("position %q: want PARTITION/OFFSET", s)
	}
	p, err := strconv.ParseInt(ps, 10, 32)
	if err != nil || p < 0 {
		return Position{}, fmt.Errorf("position %q: bad partition", s)
	}
	o, err := strconv.ParseInt(offs, 10, 64)
	if err != nil || o < 0 {
		return Position{}, fmt.Errorf("position %q: bad offset", s)
	}
	return Position{Partition: int32(p), Offset: o}, nil
}

// Header is a Kafka record header.
type Header struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Record is one record of the DLQ topic.
type Record struct {
	Position
	Timestamp time.Time `json:"timestamp"`
	Key       string    `json:"key"`
	Headers   []Header  `json:"headers,omitempty"`
	// Envelope is the decoded value; zero when DecodeError is set.
	Envelope envelope.Raw `json:"-"`
	// DecodeError says why the value is not a DLQ envelope (another
	// writer's record, a newer version); empty when it is one.
	DecodeError string `json:"decode_error,omitempty"`
	// Value is the record's value as stored.
	Value []byte `json:"-"`
}

// ErrNotDLQRecord marks a value that is not a DLQ envelope.
var ErrNotDLQRecord = errors.New("not a DLQ envelope")

// decode turns a fetched record into a Record.
func decode(r *kgo.Record) *Record {
	rec := &Record{
		Position:  Position{Partition: r.Partition, Offset: r.Offset},
		Timestamp: r.Timestamp.UTC(),
		Key:       string(r.Key),
		Value:     r.Value,
	}
	for _, h := range r.Headers {
		rec.Headers = append(rec.Headers, Header{Key: h.Key, Value: string(h.Value)})
	}
	env, err := DecodeEnvelope(r.Value)
	if err != nil {
		rec.DecodeError = err.Error()
	} else {
		rec.Envelope = env
	}
	return rec
}

// DecodeEnvelope decodes a DLQ record's value. Unlike envelope.DecodeRaw it
// expects no normalized event (ingest could not make one) but a reason.
// Errors wrap ErrNotDLQRecord.
func DecodeEnvelope(b []byte) (envelope.Raw, error) {
	var r envelope.Raw
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&r); err != nil {
		return envelope.Raw{}, fmt.Errorf("%w: %v", ErrNotDLQRecord, err)
	}
	switch {
	case r.V != envelope.RawVersion:
		return envelope.Raw{}, fmt.Errorf("%w: unsupported version %d", ErrNotDLQRecord, r.V)
	case r.Source == "":
		return envelope.Raw{}, fmt.Errorf("%w: missing source", ErrNotDLQRecord)
	case r.Reason == "":
		return envelope.Raw{}, fmt.Errorf("%w: missing reason", ErrNotDLQRecord)
	}
	return r, nil
}

// idHeaders are the kept request headers that carry a gateway's event or
// delivery id, in the order EventID prefers them.
var idHeaders = []string{"Webhook-Id", "Idempotency-Key", "X-Request-Id"}

// EventID is the best id the record has for its webhook: the Standard
// Webhooks id header, an idempotency key or a request id among the kept
// headers, else the body's top-level "id" (Stripe, Pagar.me, Asaas and
// Mercado Pago put their event id there), else "". The driver could not
// parse the body, so this is a search aid, not the dedup key.
func (r *Record) EventID() string {
	for _, h := range idHeaders {
		if v := r.Envelope.Headers[h]; v != "" {
			return v
		}
	}
	var body struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(r.Envelope.Body, &body) != nil || len(body.ID) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(body.ID, &s) == nil {
		return s
	}
	if _, err := strconv.ParseInt(string(body.ID), 10, 64); err == nil {
		return string(body.ID) // Mercado Pago's numeric ids
	}
	return ""
}

// HasEventID reports whether id is one of the ids the record carries (any
// id header, or the body's top-level "id").
func (r *Record) HasEventID(id string) bool {
	if id == "" {
		return false
	}
	for _, h := range idHeaders {
		if r.Envelope.Headers[h] == id {
			return true
		}
	}
	return r.EventID() == id
}

// Filter selects records in Scan.
type Filter struct {
	// Source keeps only this source's records; empty keeps all.
	Source string
	// Since keeps only records written at or after it; zero keeps all.
	// Scan also starts each partition at the first offset at or after it.
	Since time.Time
	// Reason keeps only records whose reason contains it, ignoring case;
	// empty keeps all.
	Reason string
	// EventID keeps only records carrying this id (see Record.HasEventID).
	EventID string
}

// Match reports whether rec passes f.
func (f Filter) Match(rec *Record) bool {
	switch {
	case f.Source != "" && rec.Envelope.Source != f.Source:
		return false
	case !f.Since.IsZero() && rec.Timestamp.Before(f.Since):
		return false
	case f.Reason != "" && !strings.Contains(strings.ToLower(rec.Envelope.Reason), strings.ToLower(f.Reason)):
		return false
	case f.EventID != "" && !rec.HasEventID(f.EventID):
		return false
	}
	return true
}

// sensitiveHeader reports whether a header's name suggests a credential. The
// ingest of today keeps none (see ingest's keptHeaders), but a DLQ record
// may come from another writer or an older version: tools print such
// values as "[redacted]".
func sensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"signature", "token", "secret", "authorization", "api-key", "apikey", "password", "cookie"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// Redacted is what RedactHeader shows instead of a sensitive value.
const Redacted = "[redacted]"

// RedactHeader returns value, or Redacted when the header's name suggests
// a credential.
func RedactHeader(name, value string) string {
	if sensitiveHeader(name) {
		return Redacted
	}
	return value
}
