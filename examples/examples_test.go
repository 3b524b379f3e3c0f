// Package examples runs the consumer examples that data teams copy — the
// Python one (examples/python), the Java one (examples/java) and the Kafka
// Connect recipe (examples/connect) — against a state topic written by the
// real sink relay, with an aborted Kafka transaction and re-sent events on
// it, and checks each example's summary: every committed event once, in
// version order per payment, nothing of the aborted transaction.
//
// A test whose tool is missing (python3 and pip, java and mvn) is skipped
// with a message naming it. Dependencies are installed once into
// $PAYSTREAM_CACHE_DIR (default ~/.cache/paystream), under a directory named
// after a hash of what they are built from.
package examples

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
	"github.com/paystream/paystream/sink/sinktest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// summary is the JSON line an example prints last.
type summary struct {
	Events     int `json:"events"`       // events handled: each committed event once
	Payments   int `json:"payments"`     // distinct payments
	Duplicates int `json:"duplicates"`   // records skipped as already handled
	OutOfOrder int `json:"out_of_order"` // events whose version was not the payment's last plus one
	Records    int `json:"records"`      // data records read
}

// stateTopic is a state topic written by publishState, with what a
// read_committed consumer reading it whole must report.
type stateTopic struct {
	brokers []string
	topic   string
	want    summary
	// committed are the committed data records, in partition order.
	committed []*kgo.Record
}

// The fixture's shape: payments × versions events from the relay, resent of
// them re-sent in a committed transaction, aborted records in an aborted one.
const (
	fixturePayments = 40
	fixtureVersions = 4
	fixtureResent   = 2
	fixtureAborted  = 6
)

// transition is what version v of a fixture payment is.
func transition(v int64) (from, to payment.Status, kind string, amount int64) {
	switch v {
	case 1:
		return "", payment.StatusPending, "status", 1050
	case 2:
		return payment.StatusPending, payment.StatusPaid, "capture", 1050
	case 3:
		return payment.StatusPaid, payment.StatusPartiallyRefunded, "refund", 50
	default:
		return payment.StatusPartiallyRefunded, payment.StatusRefunded, "refund", 1000
	}
}

func fixtureEvent(t *testing.T, key string, v int64) statelog.Event {
	t.Helper()
	from, to, kind, amount := transition(v)
	at := time.Date(2026, 11, 29, 18, 0, int(v), 0, time.UTC)
	st := envelope.State{
		EventID: envelope.StateEventID(key, v), PaymentKey: key, Source: "acme", PaymentID: strings.TrimPrefix(key, "acme:"),
		Version: v, Status: to, PreviousStatus: from, Kind: kind, AmountMinor: amount, Currency: "BRL",
		Payment:    payment.State{Status: to, Version: v, AmountMinor: 1050, Currency: "BRL"},
		OccurredAt: at, RecordedAt: at.Add(time.Second),
	}
	payload, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return statelog.Event{Key: key, Version: v, Payload: payload}
}

// publishState runs the real sink relay on a fresh schema and state topic
// (3 partitions) and commits, as the processor does, versions 1 and 2 of
// fixturePayments payments in Postgres transactions of 8 events; once they
// are on the topic it writes, in its own Kafka transactions on the same
// partitions, an aborted transaction of fixtureAborted records (version 3
// of 5 payments, version 1 of a payment that does not exist) and a
// committed one re-sending fixtureResent events byte for byte (as a relay
// that lost its place does); then versions 3 and 4 through the relay. It
// returns once every committed record is on the topic.
func publishState(t *testing.T) stateTopic {
	t.Helper()
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	topic, latest, ckpt := testenv.Topic(t, "state", 3), testenv.Topic(t, "latest", 3), testenv.Topic(t, "ckpt", 1)
	ctx := t.Context()
	sinktest.StartRelay(t, db.Pool, sink.Config{
		Brokers: brokers, Topic: topic, LatestTopic: latest, CheckpointTopic: ckpt, MaxBatchDelay: 5 * time.Millisecond,
	})

	emit := func(versions ...int64) {
		for _, v := range versions {
			for first := 0; first < fixturePayments; first += 8 {
				var events []statelog.Event
				for p := first; p < min(first+8, fixturePayments); p++ {
					events = append(events, fixtureEvent(t, fmt.Sprintf("acme:pay_%03d", p), v))
				}
				frame, err := statelog.EncodeMessage(events)
				if err == nil {
					_, err = db.Pool.Exec(ctx, statelog.EmitMessageSQL, frame)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	waitForRecords := func(n int) []*kgo.Record {
		var recs []*kgo.Record
		testenv.WaitFor(t, time.Minute, func() error {
			recs = testenv.ReadTopic(t, brokers, topic, kgo.ReadCommitted())
			if len(recs) != n {
				return fmt.Errorf("%d committed records on %s, want %d", len(recs), topic, n)
			}
			return nil
		})
		return recs
	}

	emit(1, 2)
	first := waitForRecords(fixturePayments * 2)
	byID := map[string]*kgo.Record{}
	for _, r := range first {
		byID[header(r, envelope.HeaderEventID)] = r
	}
	var aborted, resent []*kgo.Record
	for p := range 5 { // version 3 of 5 payments, with the headers of their version 2
		key := fmt.Sprintf("acme:pay_%03d", p)
		v2 := byID[envelope.StateEventID(key, 2)]
		ev := fixtureEvent(t, key, 3)
		aborted = append(aborted, withEvent(v2, ev))
	}
	ghost := fixtureEvent(t, "acme:aborted_ghost", 1)
	aborted = append(aborted, withEvent(first[0], ghost))
	for _, id := range []string{"acme:pay_000:1", "acme:pay_001:2"} {
		r := byID[id]
		resent = append(resent, &kgo.Record{Topic: topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers})
	}
	if len(aborted) != fixtureAborted || len(resent) != fixtureResent {
		t.Fatalf("fixture: %d aborted, %d re-sent records", len(aborted), len(resent))
	}
	produceTransaction(t, brokers, aborted, false)
	produceTransaction(t, brokers, resent, true)

	emit(3, 4)
	committed := waitForRecords(fixturePayments*fixtureVersions + fixtureResent)
	// The aborted records are on the topic: a read_uncommitted consumer
	// gets them, so a summary without them shows read_committed at work.
	if all := testenv.ReadTopic(t, brokers, topic, kgo.ReadUncommitted()); len(all) != len(committed)+fixtureAborted {
		t.Fatalf("%d records on %s read uncommitted, want %d committed + %d aborted", len(all), topic, len(committed), fixtureAborted)
	}
	return stateTopic{
		brokers: brokers, topic: topic, committed: committed,
		want: summary{
			Events: fixturePayments * fixtureVersions, Payments: fixturePayments,
			Duplicates: fixtureResent, OutOfOrder: 0, Records: fixturePayments*fixtureVersions + fixtureResent,
		},
	}
}

// withEvent copies r (its partition and headers) with ev's key, value and
// event id (headers event-id and ce_id) and subject (ce_subject).
func withEvent(r *kgo.Record, ev statelog.Event) *kgo.Record {
	c := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: []byte(ev.Key), Value: ev.Payload}
	for _, h := range r.Headers {
		switch h.Key {
		case envelope.HeaderEventID, "ce_id":
			h.Value = []byte(ev.EventID())
		case "ce_subject":
			h.Value = []byte(ev.Key)
		}
		c.Headers = append(c.Headers, h)
	}
	return c
}

// produceTransaction writes recs, each to its Partition, in one Kafka
// transaction, committed or aborted.
func produceTransaction(t *testing.T, brokers []string, recs []*kgo.Record, commit bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(testenv.Group(t)),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(t.Context(), kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// runExample runs cmd (in the repository's root) to its end and returns
// the summary on its last line of output.
func runExample(t *testing.T, cmd *exec.Cmd) summary {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Dir = ".."
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstderr:\n%s", strings.Join(cmd.Args, " "), err, tail(stderr.String(), 3000))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var s summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("%s: last line %q is no summary: %v\nstderr:\n%s", cmd.Args[0], lines[len(lines)-1], err, tail(stderr.String(), 3000))
	}
	t.Logf("%s ran in %s: %s", filepath.Base(cmd.Args[0]), time.Since(start).Round(10*time.Millisecond), lines[len(lines)-1])
	return s
}

// runTwice runs the example that cmd makes for a consumer group twice in
// one new group (runExample): the first run must report st.want, the
// second nothing, the first having committed its offsets.
func runTwice(t *testing.T, st stateTopic, cmd func(group string) *exec.Cmd) {
	t.Helper()
	group := testenv.Group(t)
	if got := runExample(t, cmd(group)); got != st.want {
		t.Errorf("first run: %+v, want %+v", got, st.want)
	}
	if got := runExample(t, cmd(group)); got != (summary{}) {
		t.Errorf("second run of the group: %+v, want nothing read", got)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// cacheDir is where the examples' dependencies are installed:
// $PAYSTREAM_CACHE_DIR (as deploy/stack.sh), default ~/.cache/paystream.
func cacheDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("PAYSTREAM_CACHE_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatalf("no cache directory: set PAYSTREAM_CACHE_DIR (%v)", err)
	}
	return filepath.Join(home, ".cache", "paystream")
}

// cached returns dir/<hash of key>, which build fills the first time (in a
// temporary directory renamed into place once complete, so a concurrent
// or interrupted run never sees half of it).
func cached(t *testing.T, dir, key string, build func(into string) error) string {
	t.Helper()
	sum := sha256.Sum256([]byte(key))
	final := filepath.Join(dir, hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(final); err == nil {
		return final
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	if err := build(tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, final); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, serr := os.Stat(final); serr != nil { // not built meanwhile by another run
			t.Fatal(err)
		}
	}
	t.Logf("built %s in %s", final, time.Since(start).Round(100*time.Millisecond))
	return final
}

// hashFiles returns the contents of the files under root, for a cache key.
func hashFiles(t *testing.T, root string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "target" || d.Name() == "__pycache__" {
				return fs.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(path)
		fmt.Fprintf(h, "%s %d\n", path, len(b))
		h.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// toolOutput runs a tool and returns its output, or skips t naming the tool
// when it is missing or does not run.
func toolOutput(t *testing.T, what string, name string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not found (%v): install %s to run this example", name, err, what)
	}
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Skipf("%s %s failed (%v): install %s to run this example\n%s", name, strings.Join(args, " "), err, what, tail(string(out), 500))
	}
	return string(out)
}
