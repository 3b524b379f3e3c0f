package schemas_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/dlq/dlqtest"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/schemas"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// dlqRecords posts authentic webhooks that their drivers cannot parse to
// a real ingest on the test broker and returns the DLQ records it wrote:
// an unknown type, malformed JSON, a string amount (all "acme",
// standardwebhooks) and a too long event id ("gh", hmac).
func dlqRecords(t *testing.T) []*kgo.Record {
	t.Helper()
	brokers := testenv.Kafka(t)
	raw, dlq := testenv.Topic(t, "raw", 1), testenv.Topic(t, "dlq", 1)
	in := dlqtest.Start(t, brokers, raw, dlq)
	in.PostStandard(t, "msg_unknown_type", dlqtest.PaidBody("payment.settled", "pay_1", 1050))
	in.PostStandard(t, "msg_malformed", `{"type":"payment.paid",`)
	in.PostStandard(t, "msg_string_amount", `{"type":"payment.paid","data":{"payment_id":"pay_2","amount":"1050","currency":"BRL"}}`)
	in.PostHMAC(t, dlqtest.LongID("gh"), dlqtest.PaidBody("payment.paid", "pay_3", 990))

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < 4 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("read %s: %d records, want 4: %v", dlq, len(out), err)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// TestDLQRecordValidates: what ingest really writes to the DLQ topic, read
// back from the broker, matches dlq-record.v1.json; and each mutation that
// breaks one of its promises is rejected.
func TestDLQRecordValidates(t *testing.T) {
	t.Parallel()
	recs := dlqRecords(t)
	for _, r := range recs {
		if err := schemas.Validate(schemas.DLQRecord, r.Value); err != nil {
			t.Errorf("DLQ record %d/%d (key %s) does not match %s: %v\n%s", r.Partition, r.Offset, r.Key, schemas.DLQRecord, err, r.Value)
		}
	}
	valid := recs[0].Value
	for _, m := range []struct {
		path  string
		value any
	}{
		{"v", 2},
		{"source", deleteField},
		{"source", ""},
		{"driver", deleteField},
		{"payment_key", "acme:pay_1"},
		{"received_at", "yesterday"},
		{"received_at", deleteField},
		{"body", deleteField},
		{"body", "@@ not base64 @@"},
		{"reason", deleteField},
		{"reason", ""},
		{"headers", map[string]any{"Webhook-Id": 1}},
		{"event.type", "payment.paid"},
	} {
		if err := schemas.Validate(schemas.DLQRecord, mutate(t, valid, m.path, m.value)); err == nil {
			t.Errorf("%s = %v: accepted, want rejected", m.path, m.value)
		}
	}
}
