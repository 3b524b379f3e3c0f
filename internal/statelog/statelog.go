// Package statelog is the format of the state events the processor writes
// into the write-ahead log of its batch transaction, and the sink relays to
// Kafka: there is no outbox table.
//
// The processor queues [EmitSQL] with the encoded events of a batch in the
// batch's transaction. Each event becomes one transactional logical
// decoding message (pg_logical_emit_message(true, prefix, frame)): it
// exists only if the transaction commits, and logical decoding delivers it
// in commit order, in the order the transaction emitted it. The sink reads
// the messages from a logical replication slot and [Decode]s them.
//
// Messages are database-wide, so the prefix names the schema the processor
// writes in ([Prefix]): relays of different schemas in one database (tests,
// shards) each take only their own.
//
// A frame (format version 1) is:
//
//	byte     format version, 1
//	uvarint  length of the payment key, then its bytes
//	varint   the payment's version after the transition
//	uvarint  number of headers, then per header:
//	           uvarint length of the name, its bytes, uvarint length of the value, its bytes
//	rest     the payload: the state event as published (JSON)
//
// A reader refuses a frame of a version it does not know rather than guess.
package statelog

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/paystream/paystream/internal/envelope"
)

// PrefixBase starts the prefix of every state message; the schema follows
// it (see [Prefix]). Its version changes only with an incompatible change
// of the frame that old relays must not read.
const PrefixBase = "paystream.state.v1/"

// HeartbeatPrefixBase starts the prefix of the sink's heartbeat messages,
// which carry nothing: they exist so that a quiet database still has
// something to decode and the slot's confirmed position moves on.
const HeartbeatPrefixBase = "paystream.heartbeat.v1/"

// EmitSQL emits its one parameter, a bytea[] of frames from [Encode], as
// state messages of the current transaction, in array order, under the
// prefix of the connection's current schema, and returns how many it
// emitted. Queue it in the batch transaction:
//
//	frames, err := statelog.EncodeAll(events)
//	...
//	batch.Queue(statelog.EmitSQL, frames)
//
// Outside a transaction block each statement commits on its own, which
// would publish events of a batch that later fails: always run it in the
// batch's transaction.
const EmitSQL = `
SELECT count(*) FROM (
	SELECT pg_logical_emit_message(true, '` + PrefixBase + `' || current_schema(), frame)
	  FROM unnest($1::bytea[]) WITH ORDINALITY AS f(frame, ord)
	 ORDER BY ord
) AS emitted`

// HeartbeatSQL emits an empty heartbeat message under the prefix of the
// connection's current schema, in a transaction of its own when run
// outside one.
const HeartbeatSQL = `SELECT pg_logical_emit_message(true, '` + HeartbeatPrefixBase + `' || current_schema(), ''::bytea)`

// Prefix returns the prefix of the state messages written in schema.
func Prefix(schema string) string {
	return PrefixBase + schema
}

// formatV1 is the first byte of a version 1 frame.
const formatV1 = 1

// Limits Encode enforces, so a frame always decodes.
const (
	maxKeyLen     = 1 << 16
	maxHeaders    = 64
	maxHeaderLen  = 1 << 16
	maxPayloadLen = 64 << 20
)

// Event is one state event: a payment's transition to Version, as
// published to the state topic.
type Event struct {
	// Key is the payment key, the Kafka record key.
	Key string
	// Version is the payment's version after the transition, 1 for its
	// first; with Key it makes the event id.
	Version int64
	// Headers are extra Kafka record headers, such as W3C trace context
	// (traceparent, tracestate). The relay adds the event id header itself.
	Headers []Header
	// Payload is the record value.
	Payload []byte
}

// Header is a Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// EventID is the event's stable id, "{payment key}:{version}".
func (e Event) EventID() string {
	return envelope.StateEventID(e.Key, e.Version)
}

// Encode returns e's frame.
func Encode(e Event) ([]byte, error) {
	switch {
	case e.Key == "":
		return nil, errors.New("encode state event: empty payment key")
	case len(e.Key) > maxKeyLen:
		return nil, fmt.Errorf("encode state event: payment key of %d bytes, the limit is %d", len(e.Key), maxKeyLen)
	case e.Version < 1:
		return nil, fmt.Errorf("encode state event %s: version %d, want at least 1", e.Key, e.Version)
	case len(e.Headers) > maxHeaders:
		return nil, fmt.Errorf("encode state event %s: %d headers, the limit is %d", e.EventID(), len(e.Headers), maxHeaders)
	case len(e.Payload) > maxPayloadLen:
		return nil, fmt.Errorf("encode state event %s: payload of %d bytes, the limit is %d", e.EventID(), len(e.Payload), maxPayloadLen)
	}
	size := 1 + 2*binary.MaxVarintLen64 + len(e.Key) + binary.MaxVarintLen64 + len(e.Payload)
	for _, h := range e.Headers {
		if len(h.Key) > maxHeaderLen || len(h.Value) > maxHeaderLen {
			return nil, fmt.Errorf("encode state event %s: header %.40q over %d bytes", e.EventID(), h.Key, maxHeaderLen)
		}
		size += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	b := make([]byte, 0, size)
	b = append(b, formatV1)
	b = binary.AppendUvarint(b, uint64(len(e.Key)))
	b = append(b, e.Key...)
	b = binary.AppendVarint(b, e.Version)
	b = binary.AppendUvarint(b, uint64(len(e.Headers)))
	for _, h := range e.Headers {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return append(b, e.Payload...), nil
}

// EncodeAll encodes events, in order, for [EmitSQL].
func EncodeAll(events []Event) ([][]byte, error) {
	frames := make([][]byte, len(events))
	for i, e := range events {
		f, err := Encode(e)
		if err != nil {
			return nil, err
		}
		frames[i] = f
	}
	return frames, nil
}

// Decode parses a frame. The returned event's header values and payload
// alias b.
func Decode(b []byte) (Event, error) {
	if len(b) == 0 {
		return Event{}, errors.New("decode state event: empty frame")
	}
	if b[0] != formatV1 {
		return Event{}, fmt.Errorf("decode state event: unknown frame format %d", b[0])
	}
	r := reader{b: b[1:]}
	var e Event
	e.Key = string(r.bytes(maxKeyLen))
	e.Version = r.varint()
	n := r.uvarint()
	if n > maxHeaders {
		return Event{}, fmt.Errorf("decode state event: %d headers, the limit is %d", n, maxHeaders)
	}
	for range n {
		k := string(r.bytes(maxHeaderLen))
		v := r.bytes(maxHeaderLen)
		e.Headers = append(e.Headers, Header{Key: k, Value: v})
	}
	if r.err != nil {
		return Event{}, fmt.Errorf("decode state event: %w", r.err)
	}
	if e.Key == "" || e.Version < 1 {
		return Event{}, fmt.Errorf("decode state event: key %q version %d", e.Key, e.Version)
	}
	e.Payload = r.b
	return e, nil
}

// reader reads a frame's fields, remembering the first error.
type reader struct {
	b   []byte
	err error
}

var errTruncated = errors.New("truncated frame")

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errTruncated
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errTruncated
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes(limit int) []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(limit) || n > uint64(len(r.b)) {
		r.err = errTruncated
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}
