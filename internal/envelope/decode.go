package envelope

import (
	"encoding/json"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// The processor decodes every raw record, and encoding/json's reflection
// was a fifth of its CPU. Ingest writes every envelope in one canonical
// shape (ingest's appendEnvelope, byte-identical to Raw.Marshal), so
// decodeRawFast reads that shape with a small hand-written scanner and
// few allocations: one string holding every string field, the body, the
// headers map.
//
// encoding/json stays the definition of what an envelope means. Its rules
// have corners the scanner does not reproduce: keys match fields without
// regard to case, a duplicate key overwrites (and merges into "event" and
// "headers"), null leaves a field as it was, a value of the wrong type
// fails only after the rest is decoded, invalid UTF-8 becomes U+FFFD. So
// the scanner accepts only input it decodes exactly as encoding/json
// would, and gives up (ok == false) on anything else, valid or not: an
// unknown, escaped or duplicate key, a null (but the body's, which is how
// Raw.Marshal writes a nil body), a number with a fraction or exponent or
// more than 18 digits, invalid UTF-8, an escaped body or time, more than
// maxHeaders headers, a syntax error. DecodeRaw then decodes the record with encoding/json
// (decodeRawJSON), which also words the error of an invalid one. The
// differential tests and FuzzDecodeRaw hold the two paths to the same
// result for any input.

// decodeRawJSON is DecodeRaw with encoding/json alone: the reference
// decodeRawFast is tested against.
func decodeRawJSON(b []byte) (Raw, error) {
	var r Raw
	if err := json.Unmarshal(b, &r); err != nil {
		return Raw{}, err
	}
	return r, nil
}

// fastDecoder scans one envelope. Decoded string contents go to text, one
// after another; fields hold spans of it until the end of the scan, when
// text becomes one string that every string field is a substring of (so
// keeping any one of them keeps the few hundred bytes of all of them).
type fastDecoder struct {
	data []byte
	pos  int
	text textBuffer

	source, driver, paymentKey, reason span
	eventID, dedupKey, paymentID, typ  span
	status, currency, refundID         span
	headers                            [maxHeaders]headerSpan
	nHeaders                           int
	hasHeaders                         bool // "headers" was present, even as {}
}

// maxHeaders is the most headers the fast path takes; ingest keeps six.
const maxHeaders = 8

// span is text[off:end].
type span struct{ off, end int }

type headerSpan struct{ key, value span }

// decodeRawFast decodes b if it has the envelope's canonical shape (keys in
// any order); ok is false when b must be decoded by encoding/json instead.
// It does not validate the envelope: DecodeRaw does, whichever path decoded it.
func decodeRawFast(b []byte) (r Raw, ok bool) {
	d := fastDecoder{data: b}
	if !d.envelope(&r) {
		return Raw{}, false
	}
	d.skipSpace()
	if d.pos != len(d.data) {
		return Raw{}, false
	}

	text := d.text.String()
	str := func(s span) string { return text[s.off:s.end] }
	r.Source = str(d.source)
	r.Driver = str(d.driver)
	r.PaymentKey = str(d.paymentKey)
	r.Reason = str(d.reason)
	r.Event.EventID = str(d.eventID)
	r.Event.DedupKey = str(d.dedupKey)
	r.Event.PaymentID = str(d.paymentID)
	r.Event.Type = str(d.typ)
	r.Event.Fact.Status = payment.Status(str(d.status))
	r.Event.Fact.Currency = str(d.currency)
	r.Event.Fact.RefundID = str(d.refundID)
	if d.hasHeaders {
		// encoding/json makes the map for "headers":{} too, and a later
		// duplicate key overwrites an earlier one, as here.
		r.Headers = make(map[string]string, d.nHeaders)
		for _, h := range d.headers[:d.nHeaders] {
			r.Headers[str(h.key)] = str(h.value)
		}
	}
	return r, true
}

// Key bits, to refuse a duplicate key: encoding/json would decode it again
// over the first (merging objects), which is not worth reproducing. Each
// object has its own set of seen keys; one list of bits serves all three.
const (
	keyV = 1 << iota
	keySource
	keyDriver
	keyPaymentKey
	keyEvent
	keyReceivedAt
	keyHeaders
	keyBody
	keyReason

	// "event"
	keyEventID
	keyDedupKey
	keyPaymentID
	keyType
	keyFact
	keyNeedsRefetch

	// "fact"
	keyStatus
	keyAmountMinor
	keyCurrency
	keyRefundID
	keyOccurredAt
)

// object decodes a JSON object member by member. field decodes the value
// of the member called name and returns its key bit, so that a duplicate
// key is refused. An unknown key, or one known only without regard to
// case, makes field return !ok, and the scan gives up. The three objects
// of an envelope share this loop so that they refuse the same inputs in
// the same way.
func (d *fastDecoder) object(field func(name []byte) (bit uint, ok bool)) bool {
	if !d.begin() {
		return false
	}
	var seen uint
	for first := true; ; first = false {
		name, more, ok := d.member(first)
		if !ok || !more {
			return ok
		}
		bit, ok := field(name)
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
}

// strField decodes a string value into the field s.
func (d *fastDecoder) strField(s *span) (ok bool) {
	*s, ok = d.str()
	return ok
}

// envelope decodes the top-level object into r.
func (d *fastDecoder) envelope(r *Raw) bool {
	return d.object(func(name []byte) (bit uint, ok bool) {
		switch string(name) {
		case "v":
			var n int64
			n, ok = d.integer()
			r.V = int(n)
			return keyV, ok && int64(int(n)) == n // encoding/json refuses an int overflow
		case "source":
			return keySource, d.strField(&d.source)
		case "driver":
			return keyDriver, d.strField(&d.driver)
		case "payment_key":
			return keyPaymentKey, d.strField(&d.paymentKey)
		case "event":
			return keyEvent, d.event(&r.Event)
		case "received_at":
			return keyReceivedAt, d.timestamp(&r.ReceivedAt)
		case "headers":
			return keyHeaders, d.headerMap()
		case "body":
			r.Body, ok = d.base64Bytes()
			return keyBody, ok
		case "reason":
			return keyReason, d.strField(&d.reason)
		}
		return 0, false
	})
}

// event decodes the "event" object into ev.
func (d *fastDecoder) event(ev *provider.Event) bool {
	return d.object(func(name []byte) (bit uint, ok bool) {
		switch string(name) {
		case "event_id":
			return keyEventID, d.strField(&d.eventID)
		case "dedup_key":
			return keyDedupKey, d.strField(&d.dedupKey)
		case "payment_id":
			return keyPaymentID, d.strField(&d.paymentID)
		case "type":
			return keyType, d.strField(&d.typ)
		case "fact":
			return keyFact, d.fact(&ev.Fact)
		case "needs_refetch":
			ev.NeedsRefetch, ok = d.boolean()
			return keyNeedsRefetch, ok
		}
		return 0, false
	})
}

// fact decodes the "fact" object into f.
func (d *fastDecoder) fact(f *payment.Fact) bool {
	return d.object(func(name []byte) (bit uint, ok bool) {
		switch string(name) {
		case "status":
			return keyStatus, d.strField(&d.status)
		case "amount_minor":
			f.AmountMinor, ok = d.integer()
			return keyAmountMinor, ok
		case "currency":
			return keyCurrency, d.strField(&d.currency)
		case "refund_id":
			return keyRefundID, d.strField(&d.refundID)
		case "occurred_at":
			return keyOccurredAt, d.timestamp(&f.OccurredAt)
		}
		return 0, false
	})
}

// headerMap decodes the "headers" object of strings.
func (d *fastDecoder) headerMap() bool {
	if !d.begin() {
		return false
	}
	d.hasHeaders = true
	for first := true; ; first = false {
		more, ok := d.next(first)
		if !ok {
			return false
		}
		if !more {
			return true
		}
		var h headerSpan
		if h.key, ok = d.str(); !ok {
			return false
		}
		if !d.colon() {
			return false
		}
		if h.value, ok = d.str(); !ok {
			return false
		}
		if d.nHeaders == maxHeaders {
			return false
		}
		d.headers[d.nHeaders] = h
		d.nHeaders++
	}
}
