package processor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/testenv"
)

// EnvSlowTests opts into the slow tests (PAYSTREAM_SLOW_TESTS=1).
const EnvSlowTests = "PAYSTREAM_SLOW_TESTS"

// TestDatabaseOutageKeepsMembership cuts the processor off from Postgres
// for 20 s while records keep arriving and a new member joins the group
// (as an autoscaler adding a replica on rising lag would), with a 5 s
// rebalance timeout. The processor must take part in the rebalance and
// stay in the group (same member id, no partition lost or revoked), its
// lag gauge must rise during the outage, and everything must drain after
// it with exactly-once effects. Before, the poll loop blocked on the
// stalled workers, could not let the group rebalance, and was evicted.
func TestDatabaseOutageKeepsMembership(t *testing.T) {
	testOutage(t, 20*time.Second, 5*time.Second)
}

// TestDatabaseOutageTwoMinutes is TestDatabaseOutageKeepsMembership with a
// 2-minute outage and the default 60 s rebalance timeout. It takes about
// three minutes: run it with PAYSTREAM_SLOW_TESTS=1.
func TestDatabaseOutageTwoMinutes(t *testing.T) {
	if os.Getenv(EnvSlowTests) == "" {
		t.Skip("slow (≈3 min): set " + EnvSlowTests + "=1 to run")
	}
	testOutage(t, 2*time.Minute, 0)
}

func testOutage(t *testing.T, outage, rebalanceTimeout time.Duration) {
	f := setup(t, 3)
	other := testenv.Topic(t, "other", 1)

	px, proxied := newPGProxy(t, f.db.URL)
	pcfg, err := pgxpool.ParseConfig(proxied)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = f.db.Schema
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	const backlog = 100 // payments before the outage
	if err := testenv.TryProduce(f.brokers, paymentRecords(t, f.topic, 0, backlog)...); err != nil {
		t.Fatal(err)
	}
	var kopts []kgo.Opt
	if rebalanceTimeout > 0 {
		kopts = append(kopts, kgo.RebalanceTimeout(rebalanceTimeout))
	}
	p, reg := newTestProcessor(t, pool, Config{Brokers: f.brokers, Topic: f.topic, Group: f.group,
		BatchMaxRecords: 10, MaxBufferedBatches: 2, RetryBackoffMax: 500 * time.Millisecond, KafkaOpts: kopts})
	proc := testenv.Start(t, "processor", p.Run)
	testenv.Eventually(t, 60*time.Second, func() bool { return queryInt(t, f.db.Pool, `SELECT count(*) FROM deliveries`) >= 100 },
		"processing under way")
	memberBefore := rawTopicMember(t, f.adm, f.group, f.topic)

	// Traffic keeps arriving during the outage, as webhooks do.
	produced := backlog
	var produceErr error
	stopProducing := make(chan struct{})
	var producing sync.WaitGroup
	producing.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopProducing:
				return
			case <-tick.C:
			}
			if err := testenv.TryProduce(f.brokers, paymentRecords(t, f.topic, produced, 3)...); err != nil {
				produceErr = err
				return
			}
			produced += 3
		}
	})

	px.setCut(true)
	cutAt := time.Now()
	lagAtCut := testenv.Gather(t, reg).Sum("paystream_processor_lag_records", nil)
	// Wait until every worker is surely full (more unapplied records than
	// a worker buffers plus a poll), then add a member to the group: at
	// the latest a rebalance timeout (and a margin) before the outage ends,
	// so that a poll loop blocked for the whole outage would be evicted.
	effectiveRebalance := rebalanceTimeout
	if effectiveRebalance <= 0 {
		effectiveRebalance = 60 * time.Second // franz-go's default
	}
	joinBy := max(outage/2, outage-effectiveRebalance-2*time.Second)
	testenv.WaitFor(t, joinBy, func() error {
		ends := testenv.EndOffsets(t, f.brokers, f.topic)
		for part, end := range ends {
			if behind := end - storedOffset(t, f.db, f.group, f.topic, part); behind < 100 {
				return fmt.Errorf("partition %d: %d records behind", part, behind)
			}
		}
		return nil
	})
	// The broker gives a rebalance the largest rebalance timeout of the
	// group's members, so the joiner has the processor's.
	joiner, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(f.brokers...), kgo.ConsumerGroup(f.group), kgo.ConsumeTopics(other),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.SessionTimeout(6 * time.Second)}, kopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer joiner.Close()
	joinedAt := time.Now()

	// The outage lasts its full length (that is the scenario, not a wait for
	// something to happen); meanwhile the lag gauge must rise although
	// nothing commits.
	lagPeak := lagAtCut
	poll(time.Until(cutAt.Add(outage)), func() bool {
		lagPeak = max(lagPeak, testenv.Gather(t, reg).Sum("paystream_processor_lag_records", nil))
		return false
	})
	lagRose := lagPeak >= lagAtCut+100
	px.setCut(false)
	restoredAt := time.Now()
	close(stopProducing)
	producing.Wait()
	if produceErr != nil {
		t.Fatal(produceErr)
	}

	testenv.WaitFor(t, 5*time.Minute, func() error { return storedAtEnd(f.adm, f.db.Pool, f.group, f.topic) })
	drain := time.Since(restoredAt)
	memberAfter := rawTopicMember(t, f.adm, f.group, f.topic)
	lost := partitionEventCount(t, reg, "lost")
	revoked := partitionEventCount(t, reg, "revoked")
	evicted := memberAfter != memberBefore || lost > 0
	t.Logf("outage %s (rebalance timeout %s), member joined %s into it; evicted: %v (member %s → %s, partitions lost %v, revoked %v); "+
		"lag gauge %v at the cut, %v at its peak; %d payments (%d records) in all; drained %s after the database came back",
		outage, cmp.Or(rebalanceTimeout, 60*time.Second), joinedAt.Sub(cutAt).Round(time.Millisecond), evicted, memberBefore, memberAfter,
		lost, revoked, lagAtCut, lagPeak, produced, 4*produced, drain.Round(time.Millisecond))
	if evicted {
		t.Errorf("the processor was evicted from the group during the outage: member %s → %s, %v partitions lost", memberBefore, memberAfter, lost)
	}
	if revoked > 0 {
		t.Errorf("%v partitions revoked; the joining member consumes another topic, so none should be", revoked)
	}
	if !lagRose {
		t.Errorf("lag gauge %v at the cut, %v at most during the outage: it did not rise", lagAtCut, lagPeak)
	}
	checkEffects(t, f.db.Pool, produced)
	testenv.Eventually(t, 30*time.Second, func() bool { return testenv.Gather(t, reg).Sum("paystream_processor_lag_records", nil) == 0 },
		"lag gauge back to 0 after the drain")
	proc.Stop()
}

// rawTopicMember returns the id of the group member assigned topic, once
// the group is stable.
func rawTopicMember(t *testing.T, adm *kadm.Client, group, topic string) string {
	t.Helper()
	var id string
	testenv.WaitFor(t, 2*time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		described, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return err
		}
		g := described[group]
		if g.State != "Stable" {
			return fmt.Errorf("group %s is %s", group, g.State)
		}
		for _, m := range g.Members {
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, tp := range a.Topics {
					if tp.Topic == topic && len(tp.Partitions) > 0 {
						id = m.MemberID
						return nil
					}
				}
			}
		}
		return errors.New("no member is assigned the topic")
	})
	return id
}

// poll reports whether cond became true within timeout.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 250*time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(delay)
	}
}

// partitionEventCount is reg's count of partitions event (assigned, revoked,
// lost).
func partitionEventCount(t *testing.T, reg *prometheus.Registry, event string) float64 {
	t.Helper()
	return testenv.Gather(t, reg).Sum("paystream_processor_partition_events_total", map[string]string{"event": event})
}
