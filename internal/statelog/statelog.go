// Package statelog is the format of the state events the processor writes
// into the write-ahead log of its batch transaction, and the sink relays to
// Kafka: there is no outbox table.
//
// The processor queues [EmitMessageSQL] with one message from
// [EncodeMessage] holding all of a batch's events: a transactional logical
// decoding message (pg_logical_emit_message(true, prefix, frame)) that
// exists only if the transaction commits, and that logical decoding
// delivers in commit order. The sink reads the messages from a logical
// replication slot and [DecodeMessage]s them back into events, in the order
// they were encoded.
//
// Messages are database-wide, so the prefix names the schema the processor
// writes in ([Prefix]): relays of different schemas in one database (tests,
// shards) each take only their own.
//
// # Frames
//
// The first byte of a message is its format version. A reader refuses a
// frame of a version it does not know rather than guess: a relay that
// cannot read a message stops there (and at every restart) until one that
// can runs, so nothing is ever skipped. That is why the prefix keeps "v1"
// while frames gained a version 2: a prefix an old relay does not know it
// would pass over as another application's message, and confirm the slot
// past it.
//
// Version 1 ([Encode], [EncodeAll] with [EmitSQL]) is one event per
// message:
//
//	byte     format version, 1
//	uvarint  length of the payment key, then its bytes
//	varint   the payment's version after the transition
//	uvarint  number of headers, then per header:
//	           uvarint length of the name, its bytes, uvarint length of the value, its bytes
//	rest     the payload: the state event as published (JSON)
//
// Version 2 ([EncodeMessage]) is all the events of a transaction in one
// message, compressed:
//
//	byte     format version, 2
//	byte     codec of the body: 0 stored as is, 1 zstd (one frame, no checksum)
//	uvarint  length of the body once decompressed
//	rest     the body, compressed by the codec
//
// and the body is:
//
//	uvarint  number of events, at least 1
//	per event, in emit order:
//	  uvarint  length of the payment key, then its bytes
//	  varint   the payment's version after the transition
//	  uvarint  number of headers, then the headers as in version 1
//	  uvarint  length of the payload, then its bytes
//
// The encoder stores the body as is when zstd would not make it smaller.
// State events are JSON documents with the same field names and mostly the
// same values (source, currency, statuses, the batch's trace header), so a
// transaction of 26 events compresses about elevenfold (58 bytes an event
// instead of 672), and even one event about twofold.
package statelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/paystream/paystream/internal/envelope"
)

// PrefixBase starts the prefix of every state message; the schema follows
// it (see [Prefix]). Its "v1" does not follow the frame format: a relay
// passes over messages of prefixes it does not know (other schemas', other
// applications') and confirms the slot past them, so a new prefix would
// make an old relay lose the events. A new frame format changes the
// frame's first byte instead, which an old relay refuses.
const PrefixBase = "paystream.state.v1/"

// HeartbeatPrefixBase starts the prefix of the sink's heartbeat messages,
// which carry nothing: they exist so that a quiet database still has
// something to decode and the slot's confirmed position moves on.
const HeartbeatPrefixBase = "paystream.heartbeat.v1/"

// EmitMessageSQL emits its one parameter, a frame from [EncodeMessage], as a
// state message of the current transaction under the prefix of the
// connection's current schema. Queue it in the batch transaction, never
// outside one (see [EmitSQL]).
const EmitMessageSQL = `SELECT pg_logical_emit_message(true, '` + PrefixBase + `' || current_schema(), $1::bytea)`

// EmitSQL emits its one parameter, a bytea[] of frames (from [Encode] or
// [EncodeMessage]), as state messages of the current transaction, in array
// order, under the prefix of the connection's current schema, and returns
// how many it emitted. Queue it in the batch transaction:
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

// The first byte of a frame: its format version.
const (
	formatV1 = 1
	formatV2 = 2
)

// Codecs of a version 2 frame's body.
const (
	codecStored = 0
	codecZstd   = 1
)

// Limits the encoders enforce, so a frame always decodes.
const (
	maxKeyLen     = 1 << 16
	maxHeaders    = 64
	maxHeaderLen  = 1 << 16
	maxPayloadLen = 64 << 20
	// maxBodyLen bounds a version 2 frame's body once decompressed: the
	// decoder allocates no more, whatever a frame claims.
	maxBodyLen = 256 << 20
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

// Encode returns e's frame, in format version 1.
func Encode(e Event) ([]byte, error) {
	size, err := check(e)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, 1+size)
	b = append(b, formatV1)
	b = appendHead(b, e)
	return append(b, e.Payload...), nil
}

// check validates e against the limits and returns an upper bound of its
// encoded size, without the format byte.
func check(e Event) (int, error) {
	switch {
	case e.Key == "":
		return 0, errors.New("encode state event: empty payment key")
	case len(e.Key) > maxKeyLen:
		return 0, fmt.Errorf("encode state event: payment key of %d bytes, the limit is %d", len(e.Key), maxKeyLen)
	case e.Version < 1:
		return 0, fmt.Errorf("encode state event %s: version %d, want at least 1", e.Key, e.Version)
	case len(e.Headers) > maxHeaders:
		return 0, fmt.Errorf("encode state event %s: %d headers, the limit is %d", e.EventID(), len(e.Headers), maxHeaders)
	case len(e.Payload) > maxPayloadLen:
		return 0, fmt.Errorf("encode state event %s: payload of %d bytes, the limit is %d", e.EventID(), len(e.Payload), maxPayloadLen)
	}
	size := 3*binary.MaxVarintLen64 + len(e.Key) + binary.MaxVarintLen64 + len(e.Payload)
	for _, h := range e.Headers {
		if len(h.Key) > maxHeaderLen || len(h.Value) > maxHeaderLen {
			return 0, fmt.Errorf("encode state event %s: header %.40q over %d bytes", e.EventID(), h.Key, maxHeaderLen)
		}
		size += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	return size, nil
}

// appendHead appends e's key, version and headers.
func appendHead(b []byte, e Event) []byte {
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
	return b
}

// EncodeMessage returns one frame, in format version 2, holding events in
// order: a whole transaction's state events in one message, for
// [EmitMessageSQL].
func EncodeMessage(events []Event) ([]byte, error) {
	if len(events) == 0 {
		return nil, errors.New("encode state message: no event")
	}
	size := binary.MaxVarintLen64
	for _, e := range events {
		n, err := check(e)
		if err != nil {
			return nil, err
		}
		size += n
	}
	body := make([]byte, 0, size)
	body = binary.AppendUvarint(body, uint64(len(events)))
	for _, e := range events {
		body = appendHead(body, e)
		body = binary.AppendUvarint(body, uint64(len(e.Payload)))
		body = append(body, e.Payload...)
	}
	if len(body) > maxBodyLen {
		return nil, fmt.Errorf("encode state message: %d events in %d bytes, the limit is %d", len(events), len(body), maxBodyLen)
	}
	head := make([]byte, 2, 2+binary.MaxVarintLen64)
	head[0] = formatV2
	head = binary.AppendUvarint(head, uint64(len(body)))
	enc, err := zstdCodec()
	if err != nil {
		return nil, err
	}
	frame := enc.enc.EncodeAll(body, head)
	if len(frame)-len(head) >= len(body) {
		head[1] = codecStored
		return append(head, body...), nil
	}
	frame[1] = codecZstd
	return frame, nil
}

// codec is the zstd encoder and decoder, made once: both are safe for
// concurrent use (the encoder keeps up to GOMAXPROCS states, for the
// processor's partition workers; the decoder one, for the relay).
type codec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

// zstdCodec returns the package's zstd encoder and decoder. The encoder's
// fastest level compresses state events as well as its default one (they
// are small and repetitive) for about two thirds of the CPU; no checksum,
// since the WAL has its own.
var zstdCodec = sync.OnceValues(func() (codec, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderCRC(false))
	if err != nil {
		return codec{}, fmt.Errorf("state message encoder: %w", err)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxBodyLen), zstd.WithDecodeAllCapLimit(true))
	if err != nil {
		return codec{}, fmt.Errorf("state message decoder: %w", err)
	}
	return codec{enc: enc, dec: dec}, nil
})

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

// DecodeMessage parses a state message of either format version: one event
// for version 1, the events of the message in order for version 2. The
// events' header values and payloads alias b (version 1) or a buffer of
// their own (version 2).
func DecodeMessage(b []byte) ([]Event, error) {
	if len(b) == 0 {
		return nil, errors.New("decode state message: empty frame")
	}
	if b[0] != formatV2 {
		e, err := Decode(b)
		if err != nil {
			return nil, err
		}
		return []Event{e}, nil
	}
	if len(b) < 2 {
		return nil, errors.New("decode state message: truncated frame")
	}
	c := b[1]
	r := reader{b: b[2:]}
	n := r.uvarint()
	switch {
	case r.err != nil:
		return nil, fmt.Errorf("decode state message: %w", r.err)
	case n > maxBodyLen:
		return nil, fmt.Errorf("decode state message: body of %d bytes, the limit is %d", n, maxBodyLen)
	}
	var body []byte
	switch c {
	case codecStored:
		body = r.b
	case codecZstd:
		zc, err := zstdCodec()
		if err != nil {
			return nil, err
		}
		// The capacity bounds what the decoder writes (DecodeAllCapLimit).
		if body, err = zc.dec.DecodeAll(r.b, make([]byte, 0, n)); err != nil {
			return nil, fmt.Errorf("decode state message: zstd: %w", err)
		}
	default:
		return nil, fmt.Errorf("decode state message: unknown codec %d", c)
	}
	if uint64(len(body)) != n {
		return nil, fmt.Errorf("decode state message: body of %d bytes, the frame says %d", len(body), n)
	}
	return decodeBody(body)
}

// decodeBody parses a version 2 frame's body.
func decodeBody(body []byte) ([]Event, error) {
	r := reader{b: body}
	n := r.uvarint()
	// Each event takes at least 4 bytes: bounds the allocation.
	if r.err != nil || n == 0 || n > uint64(len(r.b))/4 {
		return nil, fmt.Errorf("decode state message: %d events in %d bytes", n, len(body))
	}
	events := make([]Event, n)
	for i := range events {
		e, err := r.event()
		if err != nil {
			return nil, fmt.Errorf("decode state message: event %d: %w", i, err)
		}
		e.Payload = r.bytes(maxPayloadLen)
		if r.err != nil {
			return nil, fmt.Errorf("decode state message: event %d: %w", i, r.err)
		}
		events[i] = e
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("decode state message: %d bytes after the last event", len(r.b))
	}
	return events, nil
}

// Decode parses a frame of format version 1. The returned event's header
// values and payload alias b.
func Decode(b []byte) (Event, error) {
	if len(b) == 0 {
		return Event{}, errors.New("decode state event: empty frame")
	}
	if b[0] != formatV1 {
		return Event{}, fmt.Errorf("decode state event: unknown frame format %d", b[0])
	}
	r := reader{b: b[1:]}
	e, err := r.event()
	if err != nil {
		return Event{}, fmt.Errorf("decode state event: %w", err)
	}
	e.Payload = r.b
	return e, nil
}

// event reads an event's key, version and headers.
func (r *reader) event() (Event, error) {
	var e Event
	e.Key = string(r.bytes(maxKeyLen))
	e.Version = r.varint()
	n := r.uvarint()
	if n > maxHeaders {
		return Event{}, fmt.Errorf("%d headers, the limit is %d", n, maxHeaders)
	}
	for range n {
		k := string(r.bytes(maxHeaderLen))
		v := r.bytes(maxHeaderLen)
		e.Headers = append(e.Headers, Header{Key: k, Value: v})
	}
	if r.err != nil {
		return Event{}, r.err
	}
	if e.Key == "" || e.Version < 1 {
		return Event{}, fmt.Errorf("key %q version %d", e.Key, e.Version)
	}
	return e, nil
}

// reader reads a frame's fields, remembering the first error.
type reader struct {
	b   []byte
	err error
}

var errTruncated = errors.New("truncated frame")

func (r *reader) uvarint() uint64 { return readVarint(r, binary.Uvarint) }

func (r *reader) varint() int64 { return readVarint(r, binary.Varint) }

// readVarint reads one number with decode (binary.Uvarint or Varint).
func readVarint[T uint64 | int64](r *reader, decode func([]byte) (T, int)) T {
	if r.err != nil {
		return 0
	}
	v, n := decode(r.b)
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
