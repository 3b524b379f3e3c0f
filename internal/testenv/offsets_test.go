package testenv

import (
	"testing"
)

func TestStoredOffsets(t *testing.T) {
	t.Parallel()
	db := NewDB(t)
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO consumer_offsets (group_id, topic, partition, next_offset)
		VALUES ('g', 't', 0, 7), ('g', 't', 2, 3), ('g', 'other', 1, 9), ('h', 't', 1, 5)`); err != nil {
		t.Fatal(err)
	}
	got := StoredOffsets(t, db.Pool, "g", "t")
	if len(got) != 2 || got[0] != 7 || got[2] != 3 {
		t.Errorf("StoredOffsets = %v, want map[0:7 2:3]", got)
	}
	if err := OffsetsBehind(t, db.Pool, "g", "t", map[int32]int64{0: 7, 1: 0, 2: 3}); err != nil {
		t.Errorf("OffsetsBehind at the end: %v", err)
	}
	if err := OffsetsBehind(t, db.Pool, "g", "t", map[int32]int64{0: 7, 1: 4}); err == nil {
		t.Error("OffsetsBehind with partition 1 never stored: nil, want an error")
	}
}
