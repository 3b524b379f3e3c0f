package statelog_test

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/paystream/paystream/internal/statelog"
)

// frames is the round-trip table; it seeds FuzzDecode too.
var frames = []statelog.Event{
	{Key: "stripe:pi_1", Version: 1, Payload: []byte(`{"status":"paid"}`)},
	{Key: "asaas:pay_9", Version: 1 << 40, Payload: nil},
	{Key: "k", Version: 3, Headers: []statelog.Header{
		{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
		{Key: "tracestate", Value: nil},
	}, Payload: []byte{0, 1, 2, 255}},
	{Key: strings.Repeat("x", 300), Version: 127, Payload: bytes.Repeat([]byte("p"), 70000)},
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, e := range frames {
		b, err := statelog.Encode(e)
		if err != nil {
			t.Fatalf("Encode(%s): %v", e.EventID(), err)
		}
		got, err := statelog.Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(%s)): %v", e.EventID(), err)
		}
		if got.Key != e.Key || got.Version != e.Version || !bytes.Equal(got.Payload, e.Payload) || len(got.Headers) != len(e.Headers) {
			t.Fatalf("round trip of %s: got %+v", e.EventID(), got)
		}
		for i, h := range e.Headers {
			if got.Headers[i].Key != h.Key || !bytes.Equal(got.Headers[i].Value, h.Value) {
				t.Errorf("%s header %d = %+v, want %+v", e.EventID(), i, got.Headers[i], h)
			}
		}
	}
}

func TestEventID(t *testing.T) {
	t.Parallel()
	if got := (statelog.Event{Key: "stripe:pi_1", Version: 4}).EventID(); got != "stripe:pi_1:4" {
		t.Errorf("EventID = %q, want stripe:pi_1:4", got)
	}
}

func TestEncodeRejects(t *testing.T) {
	t.Parallel()
	for name, e := range map[string]statelog.Event{
		"no key":       {Version: 1},
		"version 0":    {Key: "k"},
		"negative":     {Key: "k", Version: -1},
		"many headers": {Key: "k", Version: 1, Headers: make([]statelog.Header, 65)},
	} {
		if _, err := statelog.Encode(e); err == nil {
			t.Errorf("%s: Encode accepted %+v", name, e)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	good, err := statelog.Encode(frames[2])
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"empty":          nil,
		"unknown format": append([]byte{2}, good[1:]...),
		"truncated key":  good[:3],
		"truncated hdr":  good[:20],
	} {
		if e, err := statelog.Decode(b); err == nil {
			t.Errorf("%s: Decode accepted %x as %+v", name, b, e)
		}
	}
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	if got := statelog.Prefix("public"); got != "paystream.state.v1/public" {
		t.Errorf("Prefix = %q", got)
	}
	if !strings.Contains(statelog.EmitSQL, "WITH ORDINALITY") || !strings.Contains(statelog.EmitSQL, statelog.PrefixBase+"' || current_schema()") {
		t.Errorf("EmitSQL does not emit in order under the schema's prefix:\n%s", statelog.EmitSQL)
	}
}

// FuzzDecode: Decode never panics, and what it accepts encodes back to the
// same bytes.
func FuzzDecode(f *testing.F) {
	for _, e := range frames {
		b, _ := statelog.Encode(e)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := statelog.Decode(b)
		if err != nil {
			return
		}
		again, err := statelog.Encode(e)
		if err != nil {
			return // e.g. a payload over the limit
		}
		e2, err := statelog.Decode(again)
		if err != nil || e2.Key != e.Key || e2.Version != e.Version || !bytes.Equal(e2.Payload, e.Payload) ||
			!reflect.DeepEqual(len(e2.Headers), len(e.Headers)) {
			t.Fatalf("re-encoding %x: %+v, %v", b, e2, err)
		}
	})
}

// batch is a transaction's worth of state events as the processor writes
// them: JSON documents of different payments, the batch's trace header on
// each.
func batch(n int) []statelog.Event {
	tp := []statelog.Header{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}}
	statuses := []string{"pending", "paid", "refunded"}
	events := make([]statelog.Event, n)
	for i := range events {
		key := fmt.Sprintf("acme:pay_%08d", i*7919%100000)
		v := int64(i%3 + 1)
		events[i] = statelog.Event{Key: key, Version: v, Headers: tp, Payload: []byte(fmt.Sprintf(
			`{"event_id":"%s:%d","payment_key":"%s","source":"acme","payment_id":"pay_%08d","version":%d,"status":%q,"amount_minor":%d,"currency":"BRL","source_event_id":"msg_%x"}`,
			key, v, key, i*7919%100000, v, statuses[v-1], 1000+i*37, i*104729))}
	}
	return events
}

func sameEvents(t *testing.T, got, want []statelog.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Key != w.Key || g.Version != w.Version || !bytes.Equal(g.Payload, w.Payload) || len(g.Headers) != len(w.Headers) {
			t.Fatalf("event %d = %s %q, want %s %q", i, g.EventID(), g.Payload, w.EventID(), w.Payload)
		}
		for j, h := range w.Headers {
			if g.Headers[j].Key != h.Key || !bytes.Equal(g.Headers[j].Value, h.Value) {
				t.Fatalf("event %d header %d = %+v, want %+v", i, j, g.Headers[j], h)
			}
		}
	}
}

// TestMessageRoundTrip: a version 2 message gives back its events in
// order, with their headers and payloads, whether its body was compressed
// (a batch) or stored (one incompressible event); DecodeMessage reads a
// version 1 frame as its one event, as the relay must during an upgrade.
func TestMessageRoundTrip(t *testing.T) {
	t.Parallel()
	noise := make([]byte, 300)
	for i := range noise {
		noise[i] = byte(i*131 + i*i*17)
	}
	cases := map[string][]statelog.Event{
		"one event":          batch(1),
		"a batch":            batch(26),
		"every test frame":   frames,
		"incompressible one": {{Key: "k", Version: 1, Payload: noise}},
	}
	for name, events := range cases {
		m, err := statelog.EncodeMessage(events)
		if err != nil {
			t.Fatalf("%s: EncodeMessage: %v", name, err)
		}
		got, err := statelog.DecodeMessage(m)
		if err != nil {
			t.Fatalf("%s: DecodeMessage: %v", name, err)
		}
		sameEvents(t, got, events)
	}
	for _, e := range frames {
		v1, err := statelog.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := statelog.DecodeMessage(v1)
		if err != nil {
			t.Fatalf("DecodeMessage(version 1 frame of %s): %v", e.EventID(), err)
		}
		sameEvents(t, got, []statelog.Event{e})
	}
}

// TestMessageCompresses: a batch's message is much smaller than its
// events' version 1 frames together, and never larger than its body plus
// a few bytes of framing (stored when compression does not help).
func TestMessageCompresses(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 10, 26, 500} {
		events := batch(n)
		v1, err := statelog.EncodeAll(events)
		if err != nil {
			t.Fatal(err)
		}
		var v1Bytes int
		for _, f := range v1 {
			v1Bytes += len(f)
		}
		m, err := statelog.EncodeMessage(events)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%3d events: %5d bytes as version 1 frames, %5d as one version 2 message (%.0f per event)", n, v1Bytes, len(m), float64(len(m))/float64(n))
		if n >= 10 && len(m)*4 > v1Bytes {
			t.Errorf("%d events: message of %d bytes, want under a quarter of the %d bytes of version 1 frames", n, len(m), v1Bytes)
		}
		if len(m) > v1Bytes+8 {
			t.Errorf("%d events: message of %d bytes, more than the %d bytes of version 1 frames and framing", n, len(m), v1Bytes)
		}
	}
	noise := make([]byte, 64)
	for i := range noise {
		noise[i] = byte(i*131 + i*i*17)
	}
	m, err := statelog.EncodeMessage([]statelog.Event{{Key: "k", Version: 1, Payload: noise}})
	if err != nil {
		t.Fatal(err)
	}
	if m[1] != 0 {
		t.Errorf("incompressible event: codec %d, want 0 (stored)", m[1])
	}
}

func TestEncodeMessageRejects(t *testing.T) {
	t.Parallel()
	if _, err := statelog.EncodeMessage(nil); err == nil {
		t.Error("EncodeMessage accepted no events")
	}
	if _, err := statelog.EncodeMessage([]statelog.Event{{Key: "k", Version: 1}, {Key: "k"}}); err == nil {
		t.Error("EncodeMessage accepted an event of version 0")
	}
}

// TestDecodeMessageRejects: a message that is damaged, of an unknown
// codec or format, or claims more than it holds is refused, not
// half-read.
func TestDecodeMessageRejects(t *testing.T) {
	t.Parallel()
	compressed, err := statelog.EncodeMessage(batch(26))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := statelog.EncodeMessage(frames[:1])
	if err != nil {
		t.Fatal(err)
	}
	if compressed[1] != 1 || stored[1] != 0 {
		t.Fatalf("codecs %d and %d, want 1 (zstd) and 0 (stored)", compressed[1], stored[1])
	}
	with := func(b []byte, i int, v byte) []byte { c := bytes.Clone(b); c[i] = v; return c }
	for name, b := range map[string][]byte{
		"empty":            nil,
		"format only":      {2},
		"unknown format":   with(stored, 0, 3),
		"unknown codec":    with(compressed, 1, 9),
		"no length":        stored[:2],
		"truncated zstd":   compressed[:len(compressed)-5],
		"truncated stored": stored[:len(stored)-1],
		"trailing bytes":   append(bytes.Clone(stored), 0),
		"zero events":      {2, 0, 1, 0},
		"claims 1 GiB":     {2, 1, 0x80, 0x80, 0x80, 0x80, 0x04, 0x28, 0xb5, 0x2f, 0xfd},
		"stored as zstd":   with(stored, 1, 1),
	} {
		if evs, err := statelog.DecodeMessage(b); err == nil {
			t.Errorf("%s: DecodeMessage accepted %x as %d events", name, b, len(evs))
		}
	}
}

// FuzzDecodeMessage: DecodeMessage never panics, and what it accepts
// encodes back to a message with the same events.
func FuzzDecodeMessage(f *testing.F) {
	for _, n := range []int{1, 3, 26} {
		m, _ := statelog.EncodeMessage(batch(n))
		f.Add(m)
	}
	m, _ := statelog.EncodeMessage(frames)
	f.Add(m)
	f.Fuzz(func(t *testing.T, b []byte) {
		events, err := statelog.DecodeMessage(b)
		if err != nil {
			return
		}
		again, err := statelog.EncodeMessage(events)
		if err != nil {
			return // e.g. a payload over the limit
		}
		got, err := statelog.DecodeMessage(again)
		if err != nil {
			t.Fatalf("re-encoding %x: %v", b, err)
		}
		sameEvents(t, got, events)
	})
}

// BenchmarkEncodeMessage measures the processor's cost of one batch's
// message, per event, and its size.
func BenchmarkEncodeMessage(b *testing.B) {
	for _, n := range []int{1, 26, 500} {
		events := batch(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var size int
			for b.Loop() {
				m, err := statelog.EncodeMessage(events)
				if err != nil {
					b.Fatal(err)
				}
				size = len(m)
			}
			b.ReportMetric(float64(size)/float64(n), "B/event")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}

// BenchmarkDecodeMessage measures the sink's cost of one message, per event.
func BenchmarkDecodeMessage(b *testing.B) {
	for _, n := range []int{1, 26, 500} {
		m, err := statelog.EncodeMessage(batch(n))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := statelog.DecodeMessage(m); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}
