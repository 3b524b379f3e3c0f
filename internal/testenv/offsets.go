package testenv

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// StoredOffsets returns the next offsets the processor stored in Postgres
// (table consumer_offsets) for group on topic, by partition; a partition
// it never committed is absent.
func StoredOffsets(t testing.TB, pool *pgxpool.Pool, group, topic string) map[int32]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2`, group, topic)
	if err != nil {
		t.Fatalf("testenv: stored offsets: %v", err)
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var off int64
		if err := rows.Scan(&p, &off); err != nil {
			t.Fatalf("testenv: stored offsets: %v", err)
		}
		out[p] = off
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("testenv: stored offsets: %v", err)
	}
	return out
}

// OffsetsBehind reports, as an error, the first partition whose stored
// offset ([StoredOffsets]) is not its end offset in ends (partitions at 0
// need none): nil once group's processors stored every record up to ends.
// It suits [WaitFor].
func OffsetsBehind(t testing.TB, pool *pgxpool.Pool, group, topic string, ends map[int32]int64) error {
	t.Helper()
	stored := StoredOffsets(t, pool, group, topic)
	for p, end := range ends {
		if end > 0 && stored[p] != end {
			return fmt.Errorf("partition %d: stored offset %d, end offset %d", p, stored[p], end)
		}
	}
	return nil
}
