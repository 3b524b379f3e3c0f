package ingest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
)

// keptHeaders are the request headers copied into the envelope: ids and
// timestamps useful for audit. Signature and token headers are not kept:
// some gateways send their secret itself (Asaas). Values longer than
// envelope.MaxHeaderValueBytes are clipped. Sorted, as JSON object keys
// from a map are.
var keptHeaders = []string{
	"Content-Type", "Idempotency-Key", "User-Agent", "Webhook-Id", "Webhook-Timestamp", "X-Request-Id",
}

// envelopeFields is what ingest puts in an envelope.Raw.
type envelopeFields struct {
	source, driver, paymentKey string
	event                      *provider.Event // nil on the DLQ
	receivedAt                 time.Time
	header                     http.Header // keptHeaders are copied
	body                       []byte
	reason                     string
}

// raw returns f as the envelope.Raw it encodes.
func (f *envelopeFields) raw() envelope.Raw {
	r := envelope.Raw{
		V: envelope.RawVersion, Source: f.source, Driver: f.driver, PaymentKey: f.paymentKey,
		ReceivedAt: f.receivedAt, Body: f.body, Reason: clip(f.reason, envelope.MaxReasonBytes),
	}
	if f.event != nil {
		r.Event = *f.event
	}
	for _, k := range keptHeaders {
		if v := headerValue(f.header, k); v != "" {
			if r.Headers == nil {
				r.Headers = map[string]string{}
			}
			r.Headers[k] = clip(v, envelope.MaxHeaderValueBytes)
		}
	}
	return r
}

// appendEnvelope appends f encoded exactly as envelope.Raw.Marshal would
// encode f.raw() (tests hold it to that, field by field and byte by byte),
// without reflection or intermediate maps: it is on every request's path.
func appendEnvelope(b []byte, f *envelopeFields) ([]byte, error) {
	var ev provider.Event
	if f.event != nil {
		ev = *f.event
	}
	var err error
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, envelope.RawVersion, 10)
	b = appendKey(b, "source")
	b = appendString(b, f.source)
	b = appendKey(b, "driver")
	b = appendString(b, f.driver)
	b = appendKey(b, "payment_key")
	b = appendString(b, f.paymentKey)

	b = append(b, `,"event":{`...)
	if ev.EventID != "" {
		b = append(b, `"event_id":`...)
		b = appendString(b, ev.EventID)
		b = append(b, ',')
	}
	b = append(b, `"dedup_key":`...)
	b = appendString(b, ev.DedupKey)
	b = appendKey(b, "payment_id")
	b = appendString(b, ev.PaymentID)
	b = appendKey(b, "type")
	b = appendString(b, ev.Type)
	b = append(b, `,"fact":{"status":`...)
	b = appendString(b, string(ev.Fact.Status))
	b = appendKey(b, "amount_minor")
	b = strconv.AppendInt(b, ev.Fact.AmountMinor, 10)
	b = appendKey(b, "currency")
	b = appendString(b, ev.Fact.Currency)
	if ev.Fact.RefundID != "" {
		b = appendKey(b, "refund_id")
		b = appendString(b, ev.Fact.RefundID)
	}
	b = appendKey(b, "occurred_at")
	if b, err = appendTime(b, ev.Fact.OccurredAt); err != nil {
		return nil, err
	}
	b = append(b, '}')
	if ev.NeedsRefetch {
		b = append(b, `,"needs_refetch":true`...)
	}
	b = append(b, '}')

	b = appendKey(b, "received_at")
	if b, err = appendTime(b, f.receivedAt); err != nil {
		return nil, err
	}
	first := true
	for _, k := range keptHeaders {
		v := headerValue(f.header, k)
		if v == "" {
			continue
		}
		if first {
			b = append(b, `,"headers":{`...)
			first = false
		} else {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, clip(v, envelope.MaxHeaderValueBytes))
	}
	if !first {
		b = append(b, '}')
	}
	b = appendKey(b, "body")
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, f.body)
	b = append(b, '"')
	if f.reason != "" {
		b = appendKey(b, "reason")
		b = appendString(b, clip(f.reason, envelope.MaxReasonBytes))
	}
	return append(b, '}'), nil
}

// headerValue is h.Get(key) for a key already in canonical form, as
// keptHeaders are, without canonicalizing it again on every request.
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// clip cuts s to at most n bytes, at a UTF-8 boundary, so that a record's
// size stays within envelope.MaxOverheadBytes of its body's base64 whatever
// the sender puts in its headers.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// appendKey appends `,"key":`.
func appendKey(b []byte, key string) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	return append(b, '"', ':')
}

// appendString appends s as encoding/json does: printable ASCII other than
// the characters it escapes is copied as is; anything else goes through
// encoding/json itself.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendTime appends t exactly as time.Time.MarshalJSON does (RFC 3339
// with nanoseconds, trailing zeros dropped; an error outside years
// 0–9999). UTC times, all ingest writes in practice, take the fast path.
func appendTime(b []byte, t time.Time) ([]byte, error) {
	if t.Location() != time.UTC {
		q, err := t.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("encode envelope: %w", err)
		}
		return append(b, q...), nil
	}
	if y := t.Year(); y < 0 || y > 9999 {
		return nil, fmt.Errorf("encode envelope: time year %d outside 0-9999", y)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}
