package sink

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/schemas"
)

// testRegistry returns a client of the Schema Registry the tests use: the
// one at PAYSTREAM_TEST_SCHEMA_REGISTRY_URL (a real server speaking the
// Confluent API) when set, else franz-go's in-process srfake.
func testRegistry(t testing.TB) *sr.Client {
	t.Helper()
	url := os.Getenv("PAYSTREAM_TEST_SCHEMA_REGISTRY_URL")
	if url == "" {
		fake := srfake.New()
		t.Cleanup(fake.Close)
		url = fake.URL()
	}
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// sampleState is a state event with every field set, as the processor
// writes it (payment.State carries more than the Avro schema's four
// payment fields).
func sampleState(key string, version int64) envelope.State {
	at := time.Date(2026, 11, 29, 18, 0, 5, 123456000, time.UTC)
	return envelope.State{
		EventID: envelope.StateEventID(key, version), PaymentKey: key, Source: "acme", PaymentID: "pay_" + strconv.FormatInt(version, 10),
		Version: version, Status: payment.StatusPartiallyRefunded, PreviousStatus: payment.StatusPaid,
		Kind: "refund", AmountMinor: 9_007_199_254_740_993, Currency: "BRL", RefundID: "re_1",
		Payment: payment.State{
			Status: payment.StatusPartiallyRefunded, Version: version, AmountMinor: 1050, Currency: "BRL",
			CapturedMinor: 1050, RefundedMinor: 50, Refunds: []string{"re_1"}, RefundAmounts: map[string]int64{"re_1": 50},
		},
		SourceEventID: "evt_9", OccurredAt: at.Add(-time.Second), RecordedAt: at,
	}
}

// TestAvroEncodingRoundTrip: a state record's JSON value, encoded for the
// state topic, is the Confluent wire format with the registered schema's
// id; decoded with the schema fetched from the registry by that id (as a
// consumer's deserializer does), every field of the v1 contract is the
// JSON's, money exact beyond 2^53; the headers say application/avro and
// name the schema's registry URL. The latest-state topic's copy carries
// that topic's schema id.
func TestAvroEncodingRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := testRegistry(t)
	topic, latest := "t.state."+t.Name(), "t.latest."+t.Name()
	enc, err := stateFormat(ctx, FormatAvro, cl, topic, latest)
	if err != nil {
		t.Fatal(err)
	}
	want := sampleState("acme:pay_1", 7)
	payload, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: topic, Key: []byte(want.PaymentKey), Value: payload,
		Headers: stateHeaders([]byte(want.EventID), []byte(want.PaymentKey), ceTime(want.RecordedAt), []byte("/paystream/db/s"), 0)}
	if err := enc.encode(rec); err != nil {
		t.Fatal(err)
	}

	var serde sr.Serde
	id, body, err := serde.DecodeID(rec.Value)
	if err != nil {
		t.Fatalf("value is not in the Confluent wire format: %v", err)
	}
	registered, err := cl.LookupSchema(ctx, Subject(topic), sr.Schema{Schema: schemas.PaymentStateAvro, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	if id != registered.ID {
		t.Fatalf("schema id %d in the value, registry has %d under %s", id, registered.ID, Subject(topic))
	}
	regSchema, err := cl.SchemaByID(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	writer, err := avro.Parse(regSchema.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var got avroState
	if err := avro.Unmarshal(writer, body, &got); err != nil {
		t.Fatal(err)
	}
	if got.EventID != want.EventID || got.PaymentKey != want.PaymentKey || got.Source != want.Source ||
		got.PaymentID != want.PaymentID || got.Version != want.Version || got.Status != string(want.Status) ||
		got.PreviousStatus != string(want.PreviousStatus) || got.Kind != want.Kind || got.AmountMinor != want.AmountMinor ||
		got.Currency != want.Currency || deref(got.RefundID) != want.RefundID || deref(got.SourceEventID) != want.SourceEventID ||
		!got.OccurredAt.Equal(want.OccurredAt) || !got.RecordedAt.Equal(want.RecordedAt) ||
		got.Payment != (avroPayment{Status: string(want.Payment.Status), Version: want.Payment.Version,
			AmountMinor: want.Payment.AmountMinor, Currency: want.Payment.Currency}) {
		t.Fatalf("decoded %+v\nfrom %+v", got, want)
	}
	if ct := headerValue(rec.Headers, "content-type"); ct != AvroContentType {
		t.Errorf("content-type %q, want %q", ct, AvroContentType)
	}
	wantSchemaURL := registryBase(cl) + "/schemas/ids/" + strconv.Itoa(id)
	if ds := headerValue(rec.Headers, "ce_dataschema"); ds != wantSchemaURL {
		t.Errorf("ce_dataschema %q, want %q", ds, wantSchemaURL)
	}

	// The latest-state topic's copy: its subject's id, its headers.
	lat := latestRecords(latest, []*kgo.Record{rec}, enc)
	if len(lat) != 1 {
		t.Fatalf("%d latest records, want 1", len(lat))
	}
	latestID, latestBody, err := serde.DecodeID(lat[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	lr, err := cl.LookupSchema(ctx, Subject(latest), sr.Schema{Schema: schemas.PaymentStateAvro, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	if latestID != lr.ID || string(latestBody) != string(body) {
		t.Errorf("latest copy: schema id %d (registry %d), body equal %v", latestID, lr.ID, string(latestBody) == string(body))
	}
	if ds := headerValue(lat[0].Headers, "ce_dataschema"); ds != registryBase(cl)+"/schemas/ids/"+strconv.Itoa(lr.ID) {
		t.Errorf("latest copy ce_dataschema %q", ds)
	}

	// Absent optional fields are Avro nulls.
	want.RefundID, want.SourceEventID = "", ""
	payload, _ = json.Marshal(want)
	rec = &kgo.Record{Topic: topic, Key: []byte(want.PaymentKey), Value: payload}
	if err := enc.encode(rec); err != nil {
		t.Fatal(err)
	}
	got = avroState{}
	if err := avro.Unmarshal(writer, rec.Value[5:], &got); err != nil {
		t.Fatal(err)
	}
	if got.RefundID != nil || got.SourceEventID != nil {
		t.Errorf("absent refund_id/source_event_id decoded as %v/%v, want null", got.RefundID, got.SourceEventID)
	}

	// A nil encoding (JSON) leaves the record as it is.
	rec = &kgo.Record{Topic: topic, Value: payload}
	if err := (*encoding)(nil).encode(rec); err != nil || string(rec.Value) != string(payload) {
		t.Errorf("JSON format changed the value: %v", err)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func headerValue(hs []kgo.RecordHeader, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestStateFormatValidates: an unknown format, and avro without a
// registry, are refused.
func TestStateFormatValidates(t *testing.T) {
	t.Parallel()
	if _, err := stateFormat(context.Background(), "protobuf", nil, "t"); err == nil {
		t.Error("format protobuf accepted")
	}
	if _, err := stateFormat(context.Background(), FormatAvro, nil, "t"); err == nil {
		t.Error("avro without a registry accepted")
	}
	if enc, err := stateFormat(context.Background(), FormatJSON, nil, "t"); enc != nil || err != nil {
		t.Errorf("json: %v, %v", enc, err)
	}
}

// BenchmarkAvroEncode measures the relay's per-event cost of
// --state-format avro: the processor's JSON decoded and written as Avro in
// the wire format, headers rewritten. JSON costs nothing (the value is
// relayed as it is).
func BenchmarkAvroEncode(b *testing.B) {
	cl := testRegistry(b)
	enc, err := stateFormat(context.Background(), FormatAvro, cl, "bench.state")
	if err != nil {
		b.Fatal(err)
	}
	ev := sampleState("acme:pay_1", 7)
	payload, _ := json.Marshal(ev)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	var out int
	for b.Loop() {
		rec := &kgo.Record{Topic: "bench.state", Value: payload,
			Headers: stateHeaders([]byte(ev.EventID), []byte(ev.PaymentKey), ceTime(ev.RecordedAt), []byte("/s"), 0)}
		if err := enc.encode(rec); err != nil {
			b.Fatal(err)
		}
		out = len(rec.Value)
	}
	b.ReportMetric(float64(len(payload)), "json-bytes/op")
	b.ReportMetric(float64(out), "avro-bytes/op")
}

// evolve returns payment-state.v1.avsc with edit applied to its parsed
// JSON.
func evolve(t *testing.T, edit func(doc map[string]any)) string {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(schemas.PaymentStateAvro), &doc); err != nil {
		t.Fatal(err)
	}
	edit(doc)
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func fields(doc map[string]any) []any { return doc["fields"].([]any) }

// TestAvroSchemaEvolvesBackward: the changes docs/consumers.md allows in
// v1 (a new optional field, in the event or in payment, with a default)
// are BACKWARD compatible — a consumer on the new schema reads every
// event written with v1, the new fields at their defaults — and the
// changes it forbids (a new required field, a field's type changed) are
// not. Checked with hamba/avro's schema compatibility and resolution, and,
// when PAYSTREAM_TEST_SCHEMA_REGISTRY_URL names a real registry, by the
// registry itself on a subject set to BACKWARD (franz-go's srfake accepts
// anything, so it checks nothing there).
func TestAvroSchemaEvolvesBackward(t *testing.T) {
	t.Parallel()
	v1 := avro.MustParse(schemas.PaymentStateAvro)
	allowed := evolve(t, func(doc map[string]any) {
		doc["fields"] = append(fields(doc), map[string]any{"name": "settled_at", "default": nil,
			"type": []any{"null", map[string]any{"type": "long", "logicalType": "timestamp-micros"}}})
		for _, f := range fields(doc) {
			if f := f.(map[string]any); f["name"] == "payment" {
				p := f["type"].(map[string]any)
				p["fields"] = append(p["fields"].([]any), map[string]any{"name": "captured_minor", "type": "long", "default": 0})
			}
		}
	})
	requiredAdded := evolve(t, func(doc map[string]any) {
		doc["fields"] = append(fields(doc), map[string]any{"name": "merchant_id", "type": "string"})
	})
	retyped := evolve(t, func(doc map[string]any) {
		for _, f := range fields(doc) {
			if f := f.(map[string]any); f["name"] == "amount_minor" {
				f["type"] = "string"
			}
		}
	})

	compat := avro.NewSchemaCompatibility()
	next := avro.MustParse(allowed)
	if err := compat.Compatible(next, v1); err != nil {
		t.Fatalf("new optional fields: not BACKWARD compatible: %v", err)
	}
	for name, s := range map[string]string{"a new required field": requiredAdded, "amount_minor retyped to string": retyped} {
		if err := compat.Compatible(avro.MustParse(s), v1); err == nil {
			t.Errorf("%s: BACKWARD compatible, want refused", name)
		}
	}

	// An event written with v1, read with the evolved schema.
	ev := sampleState("acme:pay_1", 3)
	payload, _ := json.Marshal(ev)
	var st avroState
	if err := json.Unmarshal(payload, &st); err != nil {
		t.Fatal(err)
	}
	written, err := avro.Marshal(v1, &st)
	if err != nil {
		t.Fatal(err)
	}
	resolved, err := compat.Resolve(next, v1)
	if err != nil {
		t.Fatal(err)
	}
	var read map[string]any
	if err := avro.Unmarshal(resolved, written, &read); err != nil {
		t.Fatal(err)
	}
	if read["amount_minor"] != ev.AmountMinor || read["settled_at"] != nil ||
		read["payment"].(map[string]any)["captured_minor"] != int64(0) {
		t.Errorf("v1 event read with the evolved schema: %v", read)
	}

	url := os.Getenv("PAYSTREAM_TEST_SCHEMA_REGISTRY_URL")
	if url == "" {
		t.Log("no PAYSTREAM_TEST_SCHEMA_REGISTRY_URL: the registry's own BACKWARD check is not exercised (srfake has none)")
		return
	}
	ctx := context.Background()
	cl := testRegistry(t)
	topic := "t.evolve." + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := stateFormat(ctx, FormatAvro, cl, topic); err != nil {
		t.Fatal(err)
	}
	subject := Subject(topic)
	if res := cl.Compatibility(ctx, subject); res[0].Err != nil || res[0].Level != sr.CompatBackward {
		t.Fatalf("subject %s compatibility %v (%v), want BACKWARD", subject, res[0].Level, res[0].Err)
	}
	for name, s := range map[string]string{"a new required field": requiredAdded, "amount_minor retyped to string": retyped} {
		if _, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: s, Type: sr.TypeAvro}); err == nil {
			t.Errorf("registry accepted %s under BACKWARD", name)
		}
	}
	if _, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: allowed, Type: sr.TypeAvro}); err != nil {
		t.Errorf("registry refused the new optional fields: %v", err)
	}
}
