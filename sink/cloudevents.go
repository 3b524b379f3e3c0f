package sink

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
)

// CloudEvents attributes of every state record, in binary content mode of
// the CloudEvents Kafka protocol binding (1.0): the attributes are headers
// named ce_<attribute>, the value is the event data as it was (the JSON of
// schemas/payment-state.v1.json), and the key and the event-id header do
// not change.
const (
	// CEType is ce_type: every state record is one payment transition.
	CEType = "io.paystream.payment.state.v1"
	// CEDataSchema is ce_dataschema: the $id of the value's JSON Schema.
	CEDataSchema = "https://paystream.dev/schemas/payment-state.v1.json"
	// CEContentType is the content-type header: the value's media type.
	CEContentType = "application/json"
)

// CESource returns ce_source of the relay of id: "/paystream/", the
// deployment if any, the database and the schema. With ce_id, the event id
// "{payment key}:{version}", it names an event uniquely, as CloudEvents
// asks.
func CESource(id Identity) string {
	s := "/paystream/"
	if id.Deployment != "" {
		s += id.Deployment + "/"
	}
	return s + id.Database + "/" + id.Schema
}

// The headers' names and constant values, shared by every record (franz-go
// only reads them).
var (
	ceSpecVersionValue = []byte("1.0")
	ceTypeValue        = []byte(CEType)
	ceDataSchemaValue  = []byte(CEDataSchema)
	ceContentTypeValue = []byte(CEContentType)
)

// ceTime formats t as ce_time (RFC 3339, UTC).
func ceTime(t time.Time) []byte { return t.UTC().AppendFormat(nil, time.RFC3339Nano) }

// stateHeaders returns the headers of a state record: event-id, the
// CloudEvents attributes, then extra (the event's own, such as
// traceparent). eventID and key are the record's; time is when the
// transition was committed; source is CESource's.
func stateHeaders(eventID, key, time, source []byte, extra int) []kgo.RecordHeader {
	hs := make([]kgo.RecordHeader, 0, 8+extra)
	return append(hs,
		kgo.RecordHeader{Key: envelope.HeaderEventID, Value: eventID},
		kgo.RecordHeader{Key: "ce_specversion", Value: ceSpecVersionValue},
		kgo.RecordHeader{Key: "ce_id", Value: eventID},
		kgo.RecordHeader{Key: "ce_source", Value: source},
		kgo.RecordHeader{Key: "ce_type", Value: ceTypeValue},
		kgo.RecordHeader{Key: "ce_time", Value: time},
		kgo.RecordHeader{Key: "ce_subject", Value: key},
		kgo.RecordHeader{Key: "ce_dataschema", Value: ceDataSchemaValue},
		kgo.RecordHeader{Key: "content-type", Value: ceContentTypeValue},
	)
}
