package processor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/paystream/paystream/internal/testenv"
)

// TestStaticMemberRestartKeepsAssignment: a processor restarted with the
// same InstanceID within the session timeout gets its partitions back
// without a rebalance of the others: the other member's partitions are
// neither revoked nor added to, and no partition it owns is claimed again
// (its owner epochs do not move), while the restarted member claims its
// own partitions once each.
func TestStaticMemberRestartKeepsAssignment(t *testing.T) {
	f := setup(t, 4)
	cfg := func(instance string) Config {
		return Config{Brokers: f.brokers, Topic: f.topic, Group: f.group, InstanceID: instance, SessionTimeout: 30 * time.Second}
	}

	pa, _ := newTestProcessor(t, f.db.Pool, cfg("a"))
	ra := testenv.Start(t, "processor", pa.Run)
	pb, regB := newTestProcessor(t, f.db.Pool, cfg("b"))
	testenv.Start(t, "processor", pb.Run)
	var before map[string]groupMember
	testenv.WaitFor(t, 2*time.Minute, func() error {
		var err error
		before, err = splitEvenly(f.adm, f.group, f.topic, 2)
		if err == nil && len(claimedEpochs(t, f.db, f.group, f.topic)) != 4 {
			err = errors.New("not every partition claimed yet")
		}
		return err
	})
	// Let B's assignment settle: what it was given and not revoked.
	testenv.WaitFor(t, time.Minute, func() error {
		got := partitionEventCount(t, regB, "assigned") -
			partitionEventCount(t, regB, "revoked")
		if want := float64(len(before["b"].partitions)); got != want {
			return fmt.Errorf("b holds %v partitions by its metrics, %v by the group", got, want)
		}
		return nil
	})
	eventsB := partitionEvents(t, regB)
	epochs := claimedEpochs(t, f.db, f.group, f.topic)

	// Restart a: a clean stop (a static member does not leave the group),
	// then a new processor with the same instance id.
	ra.Stop()
	// A restart takes a few seconds (a pod is replaced): the scenario, not
	// a wait for something. A dynamic member's partitions move to b
	// meanwhile and back when it returns; a static one's wait for it.
	time.Sleep(restartGap)
	pa2, _ := newTestProcessor(t, f.db.Pool, cfg("a"))
	testenv.Start(t, "processor", pa2.Run)
	testenv.WaitFor(t, time.Minute, func() error {
		pa2.mu.Lock()
		defer pa2.mu.Unlock()
		for _, part := range before["a"].partitions {
			if pa2.workers[part] == nil {
				return fmt.Errorf("the restarted a has no worker for partition %d yet", part)
			}
		}
		return nil
	})
	if err := testenv.TryProduce(f.brokers, paymentRecords(t, f.topic, 0, 20)...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, func() error { return storedAtEnd(f.adm, f.db.Pool, f.group, f.topic) })
	after, err := splitEvenly(f.adm, f.group, f.topic, 2)
	if err != nil {
		t.Fatal(err)
	}

	if got := partitionEvents(t, regB); !maps.Equal(got, eventsB) {
		t.Errorf("b's partition events went from %v to %v: the restart rebalanced it", eventsB, got)
	}
	if !slices.Equal(after["b"].partitions, before["b"].partitions) || after["b"].id != before["b"].id {
		t.Errorf("b: %+v before the restart, %+v after", before["b"], after["b"])
	}
	if !slices.Equal(after["a"].partitions, before["a"].partitions) {
		t.Errorf("a: partitions %v before the restart, %v after", before["a"].partitions, after["a"].partitions)
	}
	now := claimedEpochs(t, f.db, f.group, f.topic)
	for part, epoch := range epochs {
		want := epoch
		if slices.Contains(before["a"].partitions, part) {
			want++ // the restarted a claimed it, once
		}
		if now[part] != want {
			t.Errorf("partition %d: owner epoch %d → %d, want %d", part, epoch, now[part], want)
		}
	}
	checkEffects(t, f.db.Pool, 20)
}

// restartGap is how long the restarted processor is away.
const restartGap = 5 * time.Second

type groupMember struct {
	id         string
	partitions []int32 // sorted
}

// splitEvenly returns the stable group's members by instance id, failing
// unless there are n of them sharing topic's partitions evenly.
func splitEvenly(adm *kadm.Client, group, topic string, n int) (map[string]groupMember, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	described, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, err
	}
	g := described[group]
	if g.State != "Stable" || len(g.Members) != n {
		return nil, fmt.Errorf("group %s: %s with %d members", group, g.State, len(g.Members))
	}
	out := map[string]groupMember{}
	sizes := map[int]bool{}
	for _, m := range g.Members {
		if m.InstanceID == nil {
			return nil, fmt.Errorf("member %s has no instance id", m.MemberID)
		}
		gm := groupMember{id: m.MemberID}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range a.Topics {
				if tp.Topic == topic {
					gm.partitions = append(gm.partitions, tp.Partitions...)
				}
			}
		}
		slices.Sort(gm.partitions)
		sizes[len(gm.partitions)] = true
		out[*m.InstanceID] = gm
	}
	if len(sizes) != 1 {
		return nil, fmt.Errorf("uneven assignment: %v", out)
	}
	return out, nil
}

// claimedEpochs returns each claimed partition's owner epoch.
func claimedEpochs(t *testing.T, db *testenv.DB, group, topic string) map[int32]int64 {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		`SELECT partition, owner_epoch FROM consumer_offsets WHERE group_id = $1 AND topic = $2`, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var e int64
		if err := rows.Scan(&p, &e); err != nil {
			t.Fatal(err)
		}
		out[p] = e
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// partitionEvents returns paystream_processor_partition_events_total by event.
func partitionEvents(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, ev := range []string{"assigned", "revoked", "lost"} {
		out[ev] = partitionEventCount(t, reg, ev)
	}
	return out
}
