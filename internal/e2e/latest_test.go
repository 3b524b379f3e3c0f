package e2e

import (
	"bufio"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// exampleConsumer runs examples/consumer (a data team's consumer, built
// from the repository) and collects, per payment, the versions it printed.
type exampleConsumer struct {
	mu       sync.Mutex
	versions map[string][]int64
	cmd      *exec.Cmd
}

var transitionLine = regexp.MustCompile(`^\S+ (\S+) v(\d+) `)

func startExampleConsumer(t *testing.T, args ...string) *exampleConsumer {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "consumer")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/consumer").CombinedOutput(); err != nil {
		t.Fatalf("build examples/consumer: %v\n%s", err, out)
	}
	c := &exampleConsumer{versions: map[string][]int64{}, cmd: exec.Command(bin, args...)}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	c.cmd.Stderr = &stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			m := transitionLine.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			v, _ := strconv.ParseInt(m[2], 10, 64)
			c.mu.Lock()
			c.versions[m[1]] = append(c.versions[m[1]], v)
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("examples/consumer stderr:\n%s", stderr.String())
		}
	})
	return c
}

// TestBackfillThenBootstrapUnderTraffic: a relay publishes the state topic
// without a latest-state topic for a while; then a relay with it takes over
// and `paystream backfill` (sink.Backfill) rebuilds it from Postgres (taking
// the slot from the active relay for its duration), both
// while webhooks' records flow. A new consumer group of the example
// consumer started with --bootstrap-from then ends with every payment of
// the database at its version, each payment's versions after the first
// printed with no gap.
func TestBackfillThenBootstrapUnderTraffic(t *testing.T) {
	testenv.SkipIfShort(t)
	p := startRelayPipeline(t, 20)
	latest := testenv.Topic(t, "latest", 3)
	without := startRelay(t, p.db.Pool, p.brokers, p.state, p.ckpt)
	hs := genHistories(2000)
	prod := producePaced(t, p.brokers, p.raw, hs, 5, 20*time.Millisecond)
	testenv.Eventually(t, 2*time.Minute, func() bool { return testenv.EndOffsetSum(t, p.brokers, p.state) >= 600 }, "600 state records")
	without.Stop()
	with := startRelayWith(t, p.db.Pool, sink.Config{Brokers: p.brokers, Topic: p.state, LatestTopic: latest, CheckpointTopic: p.ckpt})
	testenv.Eventually(t, time.Minute, func() bool { return with.gauge(t, "paystream_sink_active") == 1 }, "the relay with a latest-state topic active")

	rep, err := sink.Backfill(t.Context(), p.db.Pool, sink.BackfillConfig{Brokers: p.brokers, Topic: p.state, LatestTopic: latest, CheckpointTopic: p.ckpt})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("backfill: %d payments in %s, took the slot over: %v", rep.Payments, rep.Took, rep.TookOver)
	if !rep.TookOver {
		t.Error("backfill did not have to take the slot from the active relay")
	}
	testenv.Eventually(t, time.Minute, func() bool { return with.gauge(t, "paystream_sink_active") == 1 }, "the relay active again")

	consumer := startExampleConsumer(t, "--brokers", strings.Join(p.brokers, ","), "--topic", p.state,
		"--bootstrap-from", latest, "--group", testenv.Group(t))
	done := prod.stop(t, hs)
	waitCaughtUp(t, p.db.Pool, p.brokers, p.group, p.raw, 5*time.Minute)
	waitRelayed(t, p.db, 2*time.Minute)

	want := map[string]int64{}
	rows, err := p.db.Pool.Query(t.Context(), `SELECT payment_key, version FROM payments WHERE version > 0`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		want[k] = v
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	testenv.WaitFor(t, time.Minute, func() error {
		consumer.mu.Lock()
		defer consumer.mu.Unlock()
		var behind []string
		for k, v := range want {
			if vs := consumer.versions[k]; len(vs) == 0 || vs[len(vs)-1] < v {
				behind = append(behind, fmt.Sprintf("%s at %v, want %d", k, vs, v))
			}
		}
		if len(behind) > 0 {
			return fmt.Errorf("%d of %d payments not at their version in the consumer yet: %v", len(behind), len(want), behind[:min(5, len(behind))])
		}
		return nil
	})
	consumer.mu.Lock()
	defer consumer.mu.Unlock()
	gaps := 0
	for k, vs := range consumer.versions {
		for i := 1; i < len(vs); i++ {
			if vs[i] != vs[i-1]+1 {
				gaps++
				if gaps <= 5 {
					t.Errorf("%s: versions %v", k, vs)
				}
				break
			}
		}
	}
	t.Logf("%d payments produced, %d in the database; the consumer started from the latest-state topic and reached all, %d with a gap",
		len(done), len(want), gaps)
}
