package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/dlq"
	"github.com/paystream/paystream/internal/dlq/dlqtest"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/schemas"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// upgradedDriver plays a driver release that learned the gateway's new
// "payment.settled" type (the old one dead-letters it as an unknown type):
// it reads it as "payment.paid".
type upgradedDriver struct{ provider.Driver }

func (d upgradedDriver) Parse(r *provider.Request) (provider.Event, error) {
	fixed := *r
	fixed.Body = bytes.Replace(r.Body, []byte(`"payment.settled"`), []byte(`"payment.paid"`), 1)
	ev, err := d.Driver.Parse(&fixed)
	ev.Type = "payment.settled"
	return ev, err
}

type fixture struct {
	brokers           []string
	raw, dlq, replays string
	in                *dlqtest.Ingest
	tool              *dlq.Tool
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{brokers: testenv.Kafka(t), raw: testenv.Topic(t, "raw", 3), dlq: testenv.Topic(t, "dlq", 2)}
	// Not created: the first replay creates it, compacted.
	f.replays = "replays-" + strings.TrimPrefix(testenv.Group(t), "g-")
	t.Cleanup(func() { testenv.DeleteTopics(t, f.brokers, f.replays) })
	f.in = dlqtest.Start(t, f.brokers, f.raw, f.dlq)
	tool, err := dlq.Open(dlq.Config{Brokers: f.brokers, DLQTopic: f.dlq, RawTopic: f.raw, ReplaysTopic: f.replays})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tool.Close)
	f.tool = tool
	return f
}

// scan returns the records f matches.
func (f *fixture) scan(t *testing.T, filter dlq.Filter) []*dlq.Record {
	t.Helper()
	var out []*dlq.Record
	var last dlq.Progress
	err := f.tool.Scan(t.Context(), filter, func(p dlq.Progress) { last = p }, func(r *dlq.Record) error {
		out = append(out, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if last.Scanned != last.Total || last.Matched != len(out) {
		t.Errorf("last progress %+v after a scan that matched %d", last, len(out))
	}
	return out
}

// rawRecords reads every record of the raw topic.
func (f *fixture) rawRecords(t *testing.T) []*kgo.Record {
	t.Helper()
	ends, err := testenv.Admin(t, f.brokers).ListEndOffsets(t.Context(), f.raw)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	c, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...), kgo.ConsumeTopics(f.raw), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for int64(len(out)) < want {
		fs := c.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("read %s: %v", f.raw, err)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// TestScanFilters: list's filters on DLQ records written by ingest itself.
func TestScanFilters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	before := time.Now()
	f.in.PostStandard(t, "msg_settled", dlqtest.PaidBody("payment.settled", "pay_1", 1050))
	f.in.PostStandard(t, "msg_malformed", `{"type":"payment.paid",`)
	f.in.PostHMAC(t, dlqtest.LongID("gh_1"), dlqtest.PaidBody("payment.paid", "pay_2", 990))

	all := f.scan(t, dlq.Filter{})
	if len(all) != 3 {
		t.Fatalf("scan: %d records, want 3", len(all))
	}
	for _, r := range all {
		if r.DecodeError != "" || r.Envelope.Reason == "" || r.Key != r.Envelope.Source+":unknown" {
			t.Errorf("record %s: key %q, decode error %q, reason %q", r.Position, r.Key, r.DecodeError, r.Envelope.Reason)
		}
	}
	for _, tc := range []struct {
		filter dlq.Filter
		want   []string // event ids
	}{
		{dlq.Filter{Source: "gh"}, []string{dlqtest.LongID("gh_1")}},
		{dlq.Filter{Reason: "UNKNOWN TYPE"}, []string{"msg_settled"}},
		{dlq.Filter{Source: "acme", Reason: "unprocessable"}, []string{"msg_malformed", "msg_settled"}},
		{dlq.Filter{EventID: "msg_malformed"}, []string{"msg_malformed"}},
		{dlq.Filter{Since: before.Add(-time.Minute)}, []string{"msg_malformed", "msg_settled", dlqtest.LongID("gh_1")}},
		{dlq.Filter{Since: time.Now().Add(time.Hour)}, nil},
		{dlq.Filter{Source: "nope"}, nil},
	} {
		var got []string
		for _, r := range f.scan(t, tc.filter) {
			got = append(got, r.EventID())
		}
		if strings.Join(sorted(got), ",") != strings.Join(sorted(tc.want), ",") {
			t.Errorf("filter %+v: event ids %q, want %q", tc.filter, got, tc.want)
		}
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestReplayOnceAfterDriverFix: a webhook dead-lettered for an unknown type
// is refused while the driver still cannot parse it; after the driver
// learns the type, a dry run names the partition and writes nothing, the
// replay produces the envelope ingest would have produced (same partition
// as ingest's own record of that payment, valid raw envelope, original
// receipt time and headers) and records itself, and a second replay is
// refused without producing anything.
func TestReplayOnceAfterDriverFix(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.in.PostStandard(t, "msg_settled", dlqtest.PaidBody("payment.settled", "pay_42", 1050))
	// Ingest's own record of the same payment, for its partition.
	f.in.PostStandard(t, "msg_created", dlqtest.PaidBody("payment.created", "pay_42", 1050))
	recs := f.scan(t, dlq.Filter{EventID: "msg_settled"})
	if len(recs) != 1 {
		t.Fatalf("%d DLQ records for msg_settled, want 1", len(recs))
	}
	dead := recs[0]

	stock := dlqtest.Sources(t, dlqtest.SourcesYAML)
	if _, err := f.tool.Replay(t.Context(), dead.Position, stock, false); !errors.Is(err, dlq.ErrStillUnprocessable) {
		t.Fatalf("replay with the driver that dead-lettered it: %v, want ErrStillUnprocessable", err)
	}
	if n := len(f.rawRecords(t)); n != 1 {
		t.Fatalf("after a refused replay the raw topic has %d records, want 1 (ingest's)", n)
	}

	fixed := dlqtest.Sources(t, dlqtest.SourcesYAML)
	acme := *fixed["acme"]
	acme.Driver = upgradedDriver{acme.Driver}
	fixed["acme"] = &acme

	dry, err := f.tool.Replay(t.Context(), dead.Position, map[string]*source.Source{"acme": &acme}, true)
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if n := len(f.rawRecords(t)); n != 1 {
		t.Fatalf("after a dry run the raw topic has %d records, want 1", n)
	}

	res, err := f.tool.Replay(t.Context(), dead.Position, fixed, false)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	raws := f.rawRecords(t)
	if len(raws) != 2 {
		t.Fatalf("after the replay the raw topic has %d records, want 2", len(raws))
	}
	var ingested, replayed *kgo.Record
	for _, r := range raws {
		if len(r.Headers) == 0 {
			ingested = r
		} else {
			replayed = r
		}
	}
	if ingested == nil || replayed == nil {
		t.Fatalf("want one record from ingest and one replayed (with a header): %v", raws)
	}
	if replayed.Partition != ingested.Partition || replayed.Partition != dry.Raw.Partition || res.Raw != (dlq.Position{Partition: replayed.Partition, Offset: replayed.Offset}) {
		t.Errorf("replayed to %d/%d (result %s, dry run said partition %d); ingest put the payment on partition %d",
			replayed.Partition, replayed.Offset, res.Raw, dry.Raw.Partition, ingested.Partition)
	}
	if h := replayed.Headers[0]; h.Key != dlq.HeaderReplayedFrom || string(h.Value) != f.dlq+"/"+dead.Position.String() {
		t.Errorf("replayed record header %s=%s", h.Key, h.Value)
	}
	if err := schemas.Validate(schemas.RawEnvelope, replayed.Value); err != nil {
		t.Errorf("replayed value does not match %s: %v\n%s", schemas.RawEnvelope, err, replayed.Value)
	}
	env, err := envelope.DecodeRaw(replayed.Value)
	if err != nil {
		t.Fatalf("the processor could not decode the replayed record: %v", err)
	}
	want := envelope.Raw{V: 1, Source: "acme", Driver: "standardwebhooks", PaymentKey: "acme:pay_42",
		ReceivedAt: dead.Envelope.ReceivedAt, Headers: dead.Envelope.Headers, Body: dead.Envelope.Body}
	if string(replayed.Key) != "acme:pay_42" || env.PaymentKey != want.PaymentKey || env.Event.DedupKey != "msg_settled" ||
		env.Event.Fact.Status != "paid" || env.Event.Fact.AmountMinor != 1050 || !env.ReceivedAt.Equal(want.ReceivedAt) ||
		!bytes.Equal(env.Body, want.Body) || env.Headers["Webhook-Id"] != "msg_settled" || env.Reason != "" {
		t.Errorf("replayed envelope %+v (key %s), want source acme, payment acme:pay_42, dedup key msg_settled, paid 1050, the DLQ's body, headers and receipt time", env, replayed.Key)
	}

	again, err := f.tool.Replay(t.Context(), dead.Position, fixed, false)
	if !errors.Is(err, dlq.ErrAlreadyReplayed) || again.Previous == nil || again.Previous.Raw != res.Raw {
		t.Fatalf("second replay: %v (previous %+v), want ErrAlreadyReplayed pointing at %s", err, again, res.Raw)
	}
	if _, err := f.tool.Replay(t.Context(), dead.Position, fixed, true); !errors.Is(err, dlq.ErrAlreadyReplayed) {
		t.Errorf("dry run after the replay: %v, want ErrAlreadyReplayed", err)
	}
	if n := len(f.rawRecords(t)); n != 2 {
		t.Errorf("after refused replays the raw topic has %d records, want 2", n)
	}
	done, err := f.tool.Replays(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := done[dead.Position]; !ok || m.DedupKey != "msg_settled" || m.PaymentKey != "acme:pay_42" || len(done) != 1 {
		t.Errorf("replays recorded: %+v, want one for %s", done, dead.Position)
	}
}

// TestGetOutOfRange: positions that hold no record say so.
func TestGetOutOfRange(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.in.PostStandard(t, "msg_1", `{"type":"payment.nope"}`)
	recs := f.scan(t, dlq.Filter{})
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1", len(recs))
	}
	got, err := f.tool.Get(t.Context(), recs[0].Position)
	if err != nil || got.EventID() != "msg_1" {
		t.Fatalf("get %s: %v, %+v", recs[0].Position, err, got)
	}
	for _, pos := range []dlq.Position{{Partition: recs[0].Partition, Offset: recs[0].Offset + 1}, {Partition: 7, Offset: 0}} {
		if _, err := f.tool.Get(t.Context(), pos); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("get %s: %v, want ErrNotFound", pos, err)
		}
	}
}

// TestRecordHelpers: positions parse as list prints them; the event id
// comes from the kept id headers, else the body's top-level id; headers
// named like credentials are redacted.
func TestRecordHelpers(t *testing.T) {
	t.Parallel()
	if p, err := dlq.ParsePosition("2/17"); err != nil || p != (dlq.Position{Partition: 2, Offset: 17}) || p.String() != "2/17" {
		t.Errorf("ParsePosition(2/17) = %v, %v", p, err)
	}
	for _, bad := range []string{"", "2", "2/", "/17", "-1/3", "a/b", "2/-1"} {
		if _, err := dlq.ParsePosition(bad); err == nil {
			t.Errorf("ParsePosition(%q) accepted", bad)
		}
	}
	for _, tc := range []struct {
		headers map[string]string
		body    string
		want    string
	}{
		{map[string]string{"Webhook-Id": "msg_1", "X-Request-Id": "req_1"}, `{"id":"evt_1"}`, "msg_1"},
		{map[string]string{"X-Request-Id": "req_1"}, `{"id":"evt_1"}`, "req_1"},
		{nil, `{"id":"evt_1","type":"x"}`, "evt_1"},
		{nil, `{"id":123456789}`, "123456789"},
		{nil, `{"id":{"nested":1}}`, ""},
		{nil, `{"type":"payment.paid",`, ""},
	} {
		rec := &dlq.Record{Envelope: envelope.Raw{Headers: tc.headers, Body: []byte(tc.body)}}
		if got := rec.EventID(); got != tc.want {
			t.Errorf("EventID of headers %v, body %s = %q, want %q", tc.headers, tc.body, got, tc.want)
		}
	}
	for name, redacted := range map[string]bool{"Webhook-Signature": true, "asaas-access-token": true, "Authorization": true,
		"X-Api-Key": true, "Webhook-Id": false, "User-Agent": false} {
		if got := dlq.RedactHeader(name, "v"); (got == dlq.Redacted) != redacted {
			t.Errorf("RedactHeader(%s) = %q", name, got)
		}
	}
}
