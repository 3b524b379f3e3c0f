package sink_test

import (
	"context"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// TestRelayCloudEventsHeaders: every state record carries the CloudEvents
// attributes in binary content mode (ce_* headers and content-type), with
// ce_id the event id, ce_subject the payment key and ce_time the commit
// time, next to an unchanged key, value, event-id and traceparent.
func TestRelayCloudEventsHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	if err := setupSlotFor(b); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	events := []statelog.Event{stateEvent("acme:pay_1", 1, "committed"), stateEvent("acme:pay_1", 2, "committed")}
	if err := emit(ctx, b.db.Pool, events, false); err != nil {
		t.Fatal(err)
	}
	after := time.Now().Add(time.Second)
	b.startRelay(t, nil)
	b.waitRelayed(t, 30*time.Second)
	recs := testenv.ReadCommitted(t, b.brokers, b.topic)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	id, err := sink.Identify(ctx, b.db.Pool, "")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		eventID := envelope.StateEventID("acme:pay_1", int64(i+1))
		if string(r.Key) != "acme:pay_1" || string(r.Value) != string(events[i].Payload) {
			t.Errorf("record %d: key %q value %s changed", i, r.Key, r.Value)
		}
		want := map[string]string{
			envelope.HeaderEventID: eventID,
			"ce_specversion":       "1.0",
			"ce_id":                eventID,
			"ce_source":            sink.CESource(id),
			"ce_type":              sink.CEType,
			"ce_subject":           "acme:pay_1",
			"ce_dataschema":        sink.CEDataSchema,
			"content-type":         "application/json",
			"traceparent":          "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		}
		for k, v := range want {
			if got := testenv.Header(r, k); got != v {
				t.Errorf("record %d: header %s = %q, want %q", i, k, got, v)
			}
		}
		ceTime, err := time.Parse(time.RFC3339Nano, testenv.Header(r, "ce_time"))
		if err != nil || ceTime.Before(before) || ceTime.After(after) {
			t.Errorf("record %d: ce_time %q (%v), want the commit time, between %s and %s", i, testenv.Header(r, "ce_time"), err, before, after)
		}
	}
	if testenv.Header(recs[0], "ce_time") != testenv.Header(recs[1], "ce_time") {
		t.Errorf("one transaction's events have ce_time %s and %s", testenv.Header(recs[0], "ce_time"), testenv.Header(recs[1], "ce_time"))
	}
	if got := sink.CESource(id); got != "/paystream/"+id.Database+"/"+id.Schema {
		t.Errorf("ce_source %q", got)
	}
}
