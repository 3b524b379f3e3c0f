package simulate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
)

// TestSamplerSeesOffsetsAndEpochsGoBack: on a real consumer_offsets table,
// the sampler counts how far the stored offsets advanced and reports each
// decrease of an offset or an owner epoch, naming the partition and the
// values.
func TestSamplerSeesOffsetsAndEpochsGoBack(t *testing.T) {
	testenv.SkipIfShort(t)
	db := testenv.NewDB(t)
	ctx := context.Background()
	set := func(off, epoch int64) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `
			INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, owner_epoch) VALUES ('g', 'raw', 0, $1, $2)
			ON CONFLICT (group_id, topic, partition) DO UPDATE SET next_offset = $1, owner_epoch = $2`, off, epoch); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewSampler(SamplerConfig{Pool: db.Pool, Group: "g", Topic: "raw", Interval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// seen waits until a poll started after the last change has finished.
	seen := func() {
		t.Helper()
		after := s.Summary().Polls + 1
		testenv.WaitFor(t, 10*time.Second, func() error {
			if n := s.Summary().Polls; n <= after {
				return fmt.Errorf("%d polls", n)
			}
			return nil
		})
	}
	set(10, 1)
	s.Start()
	seen()
	set(20, 2)
	seen()
	set(15, 1) // both go back
	seen()
	set(30, 3)
	seen()
	sum := s.Stop()
	if len(sum.OffsetRegressions) != 1 || !strings.Contains(sum.OffsetRegressions[0], "partition 0: stored offset 15 after 20") {
		t.Errorf("offset regressions %q", sum.OffsetRegressions)
	}
	if len(sum.EpochRegressions) != 1 || !strings.Contains(sum.EpochRegressions[0], "partition 0: owner epoch 1 after 2") {
		t.Errorf("epoch regressions %q", sum.EpochRegressions)
	}
	if sum.Advanced != 10+15 {
		t.Errorf("advanced %d, want 25 (10 → 20, 15 → 30)", sum.Advanced)
	}
	if again := s.Stop(); again.Polls != sum.Polls {
		t.Error("a second Stop changed the summary")
	}
	t.Logf("%d polls over %s, longest stall %s", sum.Polls, sum.Span, sum.LongestStall)
}
