package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// binProc is a paystream command run as a subprocess (the binary TestMain
// built, with -race), its JSON logs in Output.
type binProc struct{ *testenv.Process }

// startBin runs `paystream args...` with only its flags configuring it (no
// PAYSTREAM_* variable of the test's environment). The process is killed
// when the test ends if it still runs, and its output logged if the test
// failed.
func startBin(t *testing.T, name string, args ...string) *binProc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	// The race detector sleeps a second at exit by default: not part of
	// the shutdown measured here.
	cmd.Env = testenv.Environ("GORACE=atexit_sleep_ms=0")
	return &binProc{testenv.StartProcess(t, name, cmd, 0)}
}

// terminate sends SIGTERM and waits for the exit, at most deadline (the
// termination grace period the Kubernetes manifests give the command,
// after which the kubelet sends SIGKILL). It fails the test unless the
// process exited 0 within it, logged no error, no panic and no data race,
// and returns how long the exit took.
func (p *binProc) terminate(t *testing.T, deadline time.Duration) time.Duration {
	t.Helper()
	took := p.Terminate(t, deadline)
	for _, l := range p.logLines(t) {
		if l.Level == "ERROR" {
			t.Errorf("%s logged an error: %s %v", p.Name, l.Msg, l.Error)
		}
	}
	return took
}

// kill sends SIGKILL and waits for the exit.
func (p *binProc) kill(t *testing.T) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
}

// logLine is one line of a command's JSON log.
type logLine struct {
	Level string `json:"level"`
	Msg   string `json:"msg"`
	Error any    `json:"error"`
}

// logLines returns the JSON log lines the process wrote so far.
func (p *binProc) logLines(t *testing.T) []logLine {
	t.Helper()
	var out []logLine
	for line := range strings.Lines(p.Output.String()) {
		var l logLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg != "" {
			out = append(out, l)
		}
	}
	return out
}

// logged reports whether the process logged msg.
func (p *binProc) logged(t *testing.T, msg string) bool {
	t.Helper()
	for _, l := range p.logLines(t) {
		if l.Msg == msg {
			return true
		}
	}
	return false
}

// pacedProducer produces the raw records of hs to topic, a few whole
// payments at a time at a steady pace, until stopped or out of histories:
// traffic that keeps flowing while the test signals processes.
type pacedProducer struct {
	cancel   context.CancelFunc
	done     chan struct{}
	err      error
	payments atomic.Int64 // histories produced whole
	records  atomic.Int64
}

// producePaced starts producing hs to topic, every history's events in
// order, chunk payments at a time every interval.
func producePaced(t *testing.T, brokers []string, topic string, hs []history, chunk int, interval time.Duration) *pacedProducer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &pacedProducer{cancel: cancel, done: make(chan struct{})}
	chunks := make([][]*kgo.Record, 0, len(hs)/chunk+1)
	for i := 0; i < len(hs); i += chunk {
		chunks = append(chunks, historyRecords(t, topic, hs[i:min(i+chunk, len(hs))]))
	}
	go func() {
		defer close(p.done)
		defer cl.Close()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i, recs := range chunks {
			pctx, cancelProduce := context.WithTimeout(context.Background(), time.Minute)
			err := cl.ProduceSync(pctx, recs...).FirstErr()
			cancelProduce()
			if err != nil {
				p.err = fmt.Errorf("produce chunk %d: %w", i, err)
				return
			}
			p.payments.Add(int64(min(chunk, len(hs)-i*chunk)))
			p.records.Add(int64(len(recs)))
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-p.done })
	return p
}

// stop ends the production after the chunk in flight and returns the
// histories produced, all of them whole.
func (p *pacedProducer) stop(t *testing.T, hs []history) []history {
	t.Helper()
	p.cancel()
	<-p.done
	if p.err != nil {
		t.Fatal(p.err)
	}
	return hs[:p.payments.Load()]
}

// flowing reports whether the producer is still producing.
func (p *pacedProducer) flowing() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// waitRelayed waits until the schema's sink has confirmed, to its
// replication slot, every WAL position written before the call: every
// state event committed before it is then in a committed Kafka
// transaction.
func waitRelayed(t *testing.T, db *testenv.DB, timeout time.Duration) {
	t.Helper()
	var target string
	if err := db.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, timeout, func() error {
		var confirmed *string
		var done bool
		err := db.Pool.QueryRow(context.Background(), `
			SELECT confirmed_flush_lsn::text, coalesce(confirmed_flush_lsn >= $2::pg_lsn, false)
			  FROM pg_replication_slots WHERE slot_name = $1`, slotOf(t, db), target).Scan(&confirmed, &done)
		if err == nil && !done {
			err = fmt.Errorf("slot confirmed %v, want %s", confirmed, target)
		}
		return err
	})
}

// wantVersions returns each payment's number of state versions once its
// history is applied in order, once.
func wantVersions(hs []history) map[string]int64 {
	out := map[string]int64{}
	for _, h := range hs {
		if n := len(h.inOrder().Transitions); n > 0 {
			out[h.key] = int64(n)
		}
	}
	return out
}

// checkPipelineOnce fails the test unless Postgres holds the effects of
// hs's events once each (checkExactlyOnce) and, once the relay published
// everything committed (within relayed), a read_committed consumer of the
// state topic sees each payment's state events once each, in order
// (checkStateOnce). It returns what that consumer read.
func checkPipelineOnce(t *testing.T, db *testenv.DB, brokers []string, state string, hs []history, relayed time.Duration) []stateRecord {
	t.Helper()
	checkExactlyOnce(t, db.Pool, hs)
	waitRelayed(t, db, relayed)
	recs := committedState(t, brokers, state)
	checkStateOnce(t, recs, wantVersions(hs))
	return recs
}

// checkStateOnce fails the test unless recs, the state topic as a
// read_committed consumer reads it, hold each payment's versions 1..want
// exactly once each, in order, and nothing else.
func checkStateOnce(t *testing.T, recs []stateRecord, want map[string]int64) {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int64{}
	repeated, outOfOrder := 0, 0
	for _, r := range recs {
		if seen[r.eventID] {
			repeated++
			continue
		}
		seen[r.eventID] = true
		next[r.ev.PaymentKey]++
		if id := envelope.StateEventID(r.ev.PaymentKey, next[r.ev.PaymentKey]); r.eventID != id {
			outOfOrder++
			t.Errorf("%s: event %s where %s was due", r.ev.PaymentKey, r.eventID, id)
		}
	}
	if repeated > 0 {
		t.Errorf("%d event ids seen more than once by a read_committed consumer", repeated)
	}
	missing := 0
	for key, n := range want {
		if next[key] != n {
			missing++
			if missing <= 5 {
				t.Errorf("%s: %d versions on the state topic, want %d", key, next[key], n)
			}
		}
	}
	for key := range next {
		if want[key] == 0 {
			t.Errorf("%s: on the state topic, not in the histories", key)
		}
	}
	if missing > 5 {
		t.Errorf("... %d payments in all without all their versions", missing)
	}
}

// deliveries counts the deliveries the processors stored.
func deliveries(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM deliveries`)
}

// slotOf is the name of the relay's replication slot of db's schema.
func slotOf(t testing.TB, db *testenv.DB) string {
	t.Helper()
	slot, err := sink.Slot(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return slot
}
