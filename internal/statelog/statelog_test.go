package statelog_test

import (
	"bytes"
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
