package sink

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestSlotNameCarriesDatabaseAndSchema(t *testing.T) {
	t.Parallel()
	names := map[string]string{}
	for _, p := range [][2]string{
		{"paystream", "public"}, {"paystream_b", "public"}, {"paystream", "b_public"},
		{"a_b", "c"}, {"a", "b_c"}, {"Pay-Stream", "public"}, {"pay_stream", "public"},
		{"db", string(make([]byte, 100))}, {"db", string(make([]byte, 101))},
	} {
		name := SlotName(p[0], p[1])
		if len(name) > maxIdentifier {
			t.Errorf("SlotName(%q, %q) = %q: %d bytes, over %d", p[0], p[1], name, len(name), maxIdentifier)
		}
		if other, ok := names[name]; ok {
			t.Errorf("SlotName(%q, %q) = %q, the same as for %s", p[0], p[1], name, other)
		}
		names[name] = p[0] + "/" + p[1]
		if SlotName(p[0], p[1]) != name {
			t.Errorf("SlotName(%q, %q) is not stable", p[0], p[1])
		}
	}
	if got := SlotName("paystream", "public"); got[:len("paystream_paystream_public_")] != "paystream_paystream_public_" {
		t.Errorf("SlotName(paystream, public) = %q, want it readable", got)
	}
}

func TestIdentityKey(t *testing.T) {
	t.Parallel()
	id := Identity{SystemID: "7312", Database: "paystream", Schema: "public"}
	if got, want := id.Key(), "7312/paystream/public"; got != want {
		t.Errorf("Key() = %q, want %q", got, want)
	}
	id.Deployment = "prod"
	if got, want := id.TransactionalID(), "paystream-sink/prod/7312/paystream/public"; got != want {
		t.Errorf("TransactionalID() = %q, want %q", got, want)
	}
}

func TestParseTimelineHistory(t *testing.T) {
	t.Parallel()
	content := "1\t0/3000158\tno recovery target specified\n\n# comment\n2\t0/5000000\tbefore 2026-12-04 10:00:00+00\n"
	ends, err := parseTimelineHistory([]byte(content))
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]pglogrepl.LSN{1: 0x3000158, 2: 0x5000000}
	if len(ends) != len(want) || ends[1] != want[1] || ends[2] != want[2] {
		t.Errorf("ends = %v, want %v", ends, want)
	}
	for _, bad := range []string{"1\n", "x\t0/1\treason\n", "1\tnot-an-lsn\treason\n"} {
		if _, err := parseTimelineHistory([]byte(bad)); err == nil {
			t.Errorf("parseTimelineHistory(%q) = nil error", bad)
		}
	}
}

// TestHistoryHolds: a checkpoint counts only on the reader's WAL history:
// its system, its timeline, or an ancestor up to where the history left it.
func TestHistoryHolds(t *testing.T) {
	t.Parallel()
	// Timeline 3 of system S: timeline 1 left at 0/3000000, 2 at 0/5000000.
	h := history{SystemID: "S", Timeline: 3, ends: map[int32]pglogrepl.LSN{1: 0x3000000, 2: 0x5000000}}
	for _, tc := range []struct {
		c    checkpoint
		want bool
	}{
		{checkpoint{LSN: 0x9000000, SystemID: "S", Timeline: 3}, true},
		{checkpoint{LSN: 0x3000000, SystemID: "S", Timeline: 1}, true},
		{checkpoint{LSN: 0x3000001, SystemID: "S", Timeline: 1}, false}, // the old primary past the promote
		{checkpoint{LSN: 0x4000000, SystemID: "S", Timeline: 2}, true},
		{checkpoint{LSN: 0x6000000, SystemID: "S", Timeline: 2}, false},
		{checkpoint{LSN: 0x1000000, SystemID: "S", Timeline: 4}, false}, // a history that is not ours
		{checkpoint{LSN: 0x1000000, SystemID: "T", Timeline: 3}, false}, // another system
	} {
		if got := h.holds(tc.c); got != tc.want {
			t.Errorf("holds(%+v) = %v, want %v", tc.c, got, tc.want)
		}
	}
}

func TestCheckpointJSON(t *testing.T) {
	t.Parallel()
	c := checkpoint{LSN: 0x16B3748, SystemID: "7312", Timeline: 2, CommitTime: time.Date(2026, 12, 4, 10, 0, 0, 123000, time.UTC)}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var got checkpoint
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.LSN != c.LSN || got.SystemID != c.SystemID || got.Timeline != c.Timeline || !got.CommitTime.Equal(c.CommitTime) {
		t.Errorf("round trip %s = %+v, want %+v", b, got, c)
	}
	// An earlier relay's checkpoint has no commit time.
	if err := json.Unmarshal([]byte(`{"lsn":"0/16B3748","system_id":"7312","timeline":1}`), &got); err != nil || !got.CommitTime.IsZero() {
		t.Errorf("earlier checkpoint: %+v, %v", got, err)
	}
}
