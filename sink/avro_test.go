package sink_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// registryURL is the Schema Registry of the Avro tests: the real server at
// PAYSTREAM_TEST_SCHEMA_REGISTRY_URL when set, else franz-go's srfake, an
// in-process server speaking the Confluent API on loopback (no
// Confluent-API registry can be built here: see docs/consumers.md, "Avro
// and Schema Registry").
func registryURL(t *testing.T) string {
	t.Helper()
	if url := os.Getenv("PAYSTREAM_TEST_SCHEMA_REGISTRY_URL"); url != "" {
		return url
	}
	fake := srfake.New()
	t.Cleanup(fake.Close)
	return fake.URL()
}

// avroPython returns a Python interpreter with
// examples/python/requirements-avro.txt installed: PAYSTREAM_TEST_PYTHON_AVRO
// if set, else a virtualenv under the user's cache, created and filled
// with pip the first time.
func avroPython(t *testing.T) string {
	t.Helper()
	if py := os.Getenv("PAYSTREAM_TEST_PYTHON_AVRO"); py != "" {
		return py
	}
	_, file, _, _ := runtime.Caller(0)
	reqs := filepath.Join(filepath.Dir(file), "..", "examples", "python", "requirements-avro.txt")
	want, err := os.ReadFile(reqs)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	venv := filepath.Join(cache, "paystream", "venv-avro")
	py := filepath.Join(venv, "bin", "python")
	marker := filepath.Join(venv, "requirements-avro.txt")
	if have, err := os.ReadFile(marker); err == nil && bytes.Equal(have, want) {
		return py
	}
	for _, args := range [][]string{
		{"python3", "-m", "venv", "--clear", venv},
		{py, "-m", "pip", "install", "-q", "-r", reqs},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	if err := os.WriteFile(marker, want, 0o644); err != nil {
		t.Fatal(err)
	}
	return py
}

// avroEvent is a state event as the processor writes it: the JSON of
// envelope.State.
func avroEvent(t *testing.T, key string, version, amount int64) statelog.Event {
	t.Helper()
	at := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC).Add(time.Duration(version) * time.Second)
	prev := payment.StatusPending
	if version == 1 {
		prev = ""
	}
	p, err := json.Marshal(envelope.State{
		EventID: envelope.StateEventID(key, version), PaymentKey: key, Source: "acme", PaymentID: key[len("acme:"):],
		Version: version, Status: payment.StatusPaid, PreviousStatus: prev, Kind: "capture",
		AmountMinor: amount, Currency: "BRL",
		Payment:    payment.State{Status: payment.StatusPaid, Version: version, AmountMinor: amount, Currency: "BRL"},
		OccurredAt: at, RecordedAt: at,
	})
	if err != nil {
		t.Fatal(err)
	}
	return statelog.Event{Key: key, Version: version, Payload: p}
}

// TestRelayAvroToPythonConsumer: with StateFormat avro the relay registers
// the schema under the state and latest-state topics' subjects and writes
// every committed event in the Confluent wire format; examples/python/
// avro_consumer.py, reading read_committed through confluent-kafka's
// AvroDeserializer (which fetches the writer's schema from the registry
// by the value's id), prints every committed event once, each payment's in
// version order, money exact, and nothing of a rolled-back transaction.
// The latest-state topic holds each payment's newest event, in Avro too.
func TestRelayAvroToPythonConsumer(t *testing.T) {
	t.Parallel()
	py := avroPython(t)
	b := setup(t, 3)
	latest := b.topic + ".latest"
	url := registryURL(t)
	registry, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r, err := sink.New(b.db.Pool, sink.Config{
		Brokers: b.brokers, Topic: b.topic, LatestTopic: latest, CheckpointTopic: b.checkpoint,
		StateFormat: sink.FormatAvro, SchemaRegistry: registry,
		HeartbeatInterval: 100 * time.Millisecond, StandbyRetry: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("relay Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	running := &runningRelay{reg: reg}
	running.waitActive(t, "relay active")

	// 20 payments, 1 to 5 versions each, in transactions of up to 7
	// events; every third transaction is first tried and rolled back with
	// other amounts.
	const payments = 20
	want := map[string]int64{}
	var total int
	var batch []statelog.Event
	txns := 0
	flush := func() {
		txns++
		if txns%3 == 0 {
			rolled := make([]statelog.Event, len(batch))
			for i, e := range batch {
				rolled[i] = avroEvent(t, e.Key, e.Version, 666)
			}
			if err := emit(ctx, b.db.Pool, rolled, true); err != nil {
				t.Fatal(err)
			}
		}
		if err := emit(ctx, b.db.Pool, batch, false); err != nil {
			t.Fatal(err)
		}
		batch = nil
	}
	for v := int64(1); v <= 5; v++ {
		for p := range payments {
			if int64(p%5)+1 < v {
				continue
			}
			key := fmt.Sprintf("acme:pay_%02d", p)
			batch = append(batch, avroEvent(t, key, v, 1000*int64(p)+v))
			want[key] = v
			total++
			if len(batch) == 7 {
				flush()
			}
		}
	}
	if len(batch) > 0 {
		flush()
	}
	b.waitRelayed(t, time.Minute)

	// What a Go consumer sees: Confluent wire format, the registered id,
	// the headers naming it.
	recs := testenv.ReadCommitted(t, b.brokers, b.topic)
	if len(recs) != total {
		t.Fatalf("%d records on the state topic, want %d", len(recs), total)
	}
	var serde sr.Serde
	for _, rec := range recs {
		id, body, err := serde.DecodeID(rec.Value)
		if err != nil {
			t.Fatalf("%s: not the Confluent wire format: %v", testenv.Header(rec, envelope.HeaderEventID), err)
		}
		if got, want := testenv.Header(rec, "ce_dataschema"), url+"/schemas/ids/"+strconv.Itoa(id); got != want {
			t.Fatalf("ce_dataschema %q, want %q", got, want)
		}
		if ct := testenv.Header(rec, "content-type"); ct != sink.AvroContentType || len(body) == 0 {
			t.Fatalf("content-type %q", ct)
		}
	}

	// The latest-state topic: each payment's newest event, decodable with
	// its subject's schema.
	ls, err := registry.SchemaByVersion(ctx, sink.Subject(latest), -1)
	if err != nil {
		t.Fatal(err)
	}
	latestSchema := avro.MustParse(ls.Schema.Schema)
	newest := map[string]int64{}
	for _, rec := range testenv.ReadCommitted(t, b.brokers, latest) {
		id, body, err := serde.DecodeID(rec.Value)
		if err != nil || id != ls.ID {
			t.Fatalf("latest record: schema id %d (%v), want %d", id, err, ls.ID)
		}
		var ev struct {
			Version int64 `avro:"version"`
		}
		if err := avro.Unmarshal(latestSchema, body, &ev); err != nil {
			t.Fatal(err)
		}
		newest[string(rec.Key)] = max(newest[string(rec.Key)], ev.Version)
	}
	for key, v := range want {
		if newest[key] != v {
			t.Errorf("latest-state topic: %s at version %d, want %d", key, newest[key], v)
		}
	}

	// The Python consumer, through the registry's deserializer.
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer pcancel()
	cmd := exec.CommandContext(pctx, py, filepath.Join("..", "examples", "python", "avro_consumer.py"),
		"--brokers", b.brokers[0], "--registry", url, "--topic", b.topic, "--group", "avro-"+b.topic,
		"--max", strconv.Itoa(total), "--idle-exit", "30")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("avro_consumer.py: %v\n%s", err, stderr.Bytes())
	}
	next := map[string]int64{}
	partition := map[string]int{}
	lines := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		lines++
		var ev struct {
			EventID       string `json:"event_id"`
			HeaderEventID string `json:"header_event_id"`
			ContentType   string `json:"content_type"`
			Partition     int    `json:"partition"`
			PaymentKey    string `json:"payment_key"`
			Version       int64  `json:"version"`
			AmountMinor   int64  `json:"amount_minor"`
			PaymentAmount int64  `json:"payment_amount_minor"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		next[ev.PaymentKey]++
		if ev.Version != next[ev.PaymentKey] || ev.EventID != envelope.StateEventID(ev.PaymentKey, ev.Version) || ev.HeaderEventID != ev.EventID {
			t.Fatalf("python read %s (header %s) after version %d of %s: repeated, out of order or a gap",
				ev.EventID, ev.HeaderEventID, next[ev.PaymentKey]-1, ev.PaymentKey)
		}
		if p, ok := partition[ev.PaymentKey]; ok && p != ev.Partition {
			t.Fatalf("%s on partitions %d and %d", ev.PaymentKey, p, ev.Partition)
		}
		partition[ev.PaymentKey] = ev.Partition
		var n int
		if _, err := fmt.Sscanf(ev.PaymentKey, "acme:pay_%d", &n); err != nil {
			t.Fatal(err)
		}
		if wantAmount := 1000*int64(n) + ev.Version; ev.AmountMinor != wantAmount || ev.PaymentAmount != wantAmount {
			t.Fatalf("%s: amount_minor %d / payment %d, want %d (a rolled-back transaction's 666?)", ev.EventID, ev.AmountMinor, ev.PaymentAmount, wantAmount)
		}
		if ev.ContentType != sink.AvroContentType {
			t.Fatalf("%s: content-type %q", ev.EventID, ev.ContentType)
		}
	}
	if lines != total {
		t.Errorf("python printed %d events, want %d", lines, total)
	}
	for key, v := range want {
		if next[key] != v {
			t.Errorf("python: %s read up to version %d, want %d", key, next[key], v)
		}
	}
	t.Logf("%d events in %d transactions (every third tried and rolled back first), %d payments: python read each once, in order", total, txns, payments)
}
