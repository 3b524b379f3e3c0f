package envelope_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
)

func TestMaxRecordBytes(t *testing.T) {
	for _, c := range []struct {
		body int64
		want int32
	}{
		{0, envelope.KafkaDefaultMaxMessageBytes},
		{64, envelope.KafkaDefaultMaxMessageBytes},
		{700_000, envelope.KafkaDefaultMaxMessageBytes}, // 933,336 + 65,536 < Kafka's default
		{1 << 20, 1_398_104 + envelope.MaxOverheadBytes},
		{10 << 20, 13_981_016 + envelope.MaxOverheadBytes},
	} {
		got, err := envelope.MaxRecordBytes(c.body)
		if err != nil || got != c.want {
			t.Errorf("MaxRecordBytes(%d) = %d, %v; want %d", c.body, got, err, c.want)
		}
	}
	for _, bad := range []int64{-1, 800 << 20, 1 << 40} {
		if got, err := envelope.MaxRecordBytes(bad); err == nil {
			t.Errorf("MaxRecordBytes(%d) = %d, want an error", bad, got)
		}
	}
}

// TestMaxOverheadBytesHoldsTheWorstEnvelope: an envelope whose every
// string field is as long as ingest lets it be and escapes at the worst
// JSON rate, with a key of the longest payment key, stays within
// MaxOverheadBytes of its body's base64.
func TestMaxOverheadBytesHoldsTheWorstEnvelope(t *testing.T) {
	worst := func(n int) string { return strings.Repeat("<", n) } // "\u003c": 6 bytes each
	id := worst(provider.MaxIDLen)
	name := strings.Repeat("s", 63)
	key := name + ":" + strings.Repeat("a", 64) + ":" + id
	headers := map[string]string{}
	for _, h := range []string{"Content-Type", "Idempotency-Key", "User-Agent", "Webhook-Id", "Webhook-Timestamp", "X-Request-Id"} {
		headers[h] = worst(envelope.MaxHeaderValueBytes)
	}
	body := []byte(strings.Repeat("b", 1000))
	r := envelope.Raw{
		Source: name, Driver: "standardwebhooks", PaymentKey: key,
		Event:      provider.Event{EventID: id, DedupKey: id, PaymentID: id, Type: id},
		ReceivedAt: time.Date(2026, 11, 29, 18, 0, 0, 123456789, time.UTC),
		Headers:    headers, Body: body, Reason: worst(envelope.MaxReasonBytes),
	}
	r.Event.Fact.RefundID = id
	r.Event.Fact.OccurredAt = r.ReceivedAt
	r.Event.Fact.Currency = "BRL"
	v, err := r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	const batchFraming = 61 + 5*8 // batch header, then a record's varints
	overhead := len(v) - base64.StdEncoding.EncodedLen(len(body)) + len(key) + batchFraming
	t.Logf("worst envelope overhead: %d bytes of %d", overhead, envelope.MaxOverheadBytes)
	if overhead > envelope.MaxOverheadBytes {
		t.Errorf("worst envelope overhead %d > MaxOverheadBytes %d", overhead, envelope.MaxOverheadBytes)
	}
}
