package envelope

import (
	"encoding/base64"
	"fmt"
)

// Limits on what a raw record carries besides the webhook body. Ingest
// clips kept header values and DLQ reasons to them, so that
// MaxOverheadBytes holds whatever the sender puts in its headers.
const (
	// MaxHeaderValueBytes is the longest kept header value (Raw.Headers)
	// ingest writes; a longer one is cut at a UTF-8 boundary.
	MaxHeaderValueBytes = 1024
	// MaxReasonBytes is the longest Raw.Reason ingest writes.
	MaxReasonBytes = 1024
)

// MaxOverheadBytes bounds the bytes of a raw or DLQ record besides the
// base64 of its body: the record batch framing (61 bytes plus a few varints
// per record), the key (a payment key, at most 63 + account + 255 bytes),
// the envelope's field names and punctuation (about 300 bytes), its ids
// (event id, dedup key, payment id, refund id, type: 255 bytes each at
// most), six kept headers of at most MaxHeaderValueBytes and a reason of at
// most MaxReasonBytes. Counting every one of those strings at the worst
// JSON escaping (6 bytes per input byte, "<" → "\u003c") comes to about
// 53 KiB; the rest is margin.
const MaxOverheadBytes = 64 << 10

// KafkaDefaultMaxMessageBytes is Apache Kafka's default message.max.bytes:
// MaxRecordBytes never asks for less.
const KafkaDefaultMaxMessageBytes = 1048588

// MaxRecordBytesLimit is the largest record batch franz-go produces (1 GiB).
const MaxRecordBytesLimit = 1 << 30

// MaxRecordBytes is the largest record batch a raw or DLQ record carrying a
// body of up to maxBodyBytes needs: the body's base64 (the envelope keeps
// it byte-exact, a third bigger) plus MaxOverheadBytes, and never less than
// Kafka's default. The raw and DLQ topics' max.message.bytes and ingest's
// producer batch limit are all set to it, so that every body a source's
// max_body_bytes lets in fits. It fails for a body whose record would pass
// MaxRecordBytesLimit.
func MaxRecordBytes(maxBodyBytes int64) (int32, error) {
	if maxBodyBytes < 0 {
		return 0, fmt.Errorf("max body bytes %d: must not be negative", maxBodyBytes)
	}
	if maxBodyBytes > MaxRecordBytesLimit/4*3 {
		return 0, fmt.Errorf("max body bytes %d: its record would exceed the %d-byte batch limit", maxBodyBytes, MaxRecordBytesLimit)
	}
	n := int64(base64.StdEncoding.EncodedLen(int(maxBodyBytes))) + MaxOverheadBytes
	if n > MaxRecordBytesLimit {
		return 0, fmt.Errorf("max body bytes %d: its record would exceed the %d-byte batch limit", maxBodyBytes, MaxRecordBytesLimit)
	}
	return int32(max(n, KafkaDefaultMaxMessageBytes)), nil
}
