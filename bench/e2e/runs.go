package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/paystream/paystream/bench/internal/rig"
	"github.com/paystream/paystream/internal/lab/loadgen"
)

// result is what one target measured.
type result struct {
	Name string `json:"name"`
	// Deliveries is the workload's length (over every round once merged).
	Deliveries int             `json:"deliveries"`
	Load       *loadgen.Result `json:"load"`
	Accepted   int64           `json:"accepted"`
	// AcceptedPerSec is 2xx answers per second of the load.
	AcceptedPerSec float64 `json:"accepted_per_sec"`
	AcceptP50      float64 `json:"accept_p50_ms"`
	AcceptP99      float64 `json:"accept_p99_ms"`
	// EndToEnd runs from the first request to the last delivery recorded.
	EndToEnd       float64 `json:"end_to_end_sec"`
	EndToEndPerSec float64 `json:"end_to_end_deliveries_per_sec"`
	// Published counts the state events matched to an accepted webhook.
	Published   int     `json:"published"`
	PublishP50  float64 `json:"accepted_to_published_p50_ms"`
	PublishP99  float64 `json:"accepted_to_published_p99_ms"`
	PublishNote string  `json:"accepted_to_published_note,omitempty"`
	// CPU is each process's CPU microseconds per delivery.
	CPU                 map[string]float64 `json:"cpu_us_per_delivery"`
	WALBytes            int64              `json:"wal_bytes"`
	WALBytesPerDelivery float64            `json:"wal_bytes_per_delivery"`
	// Check says whether every payment ended as the workload says.
	Check string `json:"check"`
	// ProcessorTransactions are the processor's batch transactions, and
	// DeliveriesPerTransaction their mean size (paystream only: the
	// baseline commits once per delivery).
	ProcessorTransactions    int64   `json:"processor_transactions,omitempty"`
	DeliveriesPerTransaction float64 `json:"deliveries_per_processor_transaction,omitempty"`
	// BatchesPerTransaction is how many partitions' batches a transaction
	// carried, on average.
	BatchesPerTransaction float64 `json:"batches_per_processor_transaction,omitempty"`
	// SinkTransactions are the relay's Kafka transactions, and
	// EventsPerSinkTransaction their mean number of state events.
	SinkTransactions         int64   `json:"sink_kafka_transactions,omitempty"`
	EventsPerSinkTransaction float64 `json:"state_events_per_sink_transaction,omitempty"`
	// Pacing is set in a run at a fixed arrival rate (-rate).
	Pacing *pacing `json:"pacing,omitempty"`

	publishLat []time.Duration // accepted → published, per state event
}

// mergeResults combines the rounds of one design into one result, as if
// they were one run: counts, times, CPU and WAL add up, so rates and
// figures per delivery are over every round, and the latency percentiles
// are over every sample.
func mergeResults(rs []*result) *result {
	if len(rs) == 1 {
		return rs[0]
	}
	m := &result{Name: rs[0].Name, Load: &loadgen.Result{}, CPU: map[string]float64{}, PublishNote: rs[0].PublishNote}
	var (
		checks                   []string
		cpu                      = map[string]float64{} // µs
		records, batches, events float64
	)
	for i, r := range rs {
		m.Deliveries += r.Deliveries
		m.Load.Merge(r.Load)
		m.EndToEnd += r.EndToEnd
		m.Published += r.Published
		m.publishLat = append(m.publishLat, r.publishLat...)
		for k, v := range r.CPU {
			cpu[k] += v * float64(r.Deliveries)
		}
		m.WALBytes += r.WALBytes
		checks = append(checks, fmt.Sprintf("round %d %s", i+1, r.Check))
		m.ProcessorTransactions += r.ProcessorTransactions
		records += r.DeliveriesPerTransaction * float64(r.ProcessorTransactions)
		batches += r.BatchesPerTransaction * float64(r.ProcessorTransactions)
		m.SinkTransactions += r.SinkTransactions
		events += r.EventsPerSinkTransaction * float64(r.SinkTransactions)
		if r.Pacing != nil {
			if m.Pacing == nil {
				m.Pacing = &pacing{Rate: r.Pacing.Rate}
			}
			m.Pacing.Late += r.Pacing.Late
			m.Pacing.MaxLateMS = max(m.Pacing.MaxLateMS, r.Pacing.MaxLateMS)
		}
		if r.PublishNote != rs[0].PublishNote {
			m.PublishNote += fmt.Sprintf("; round %d: %s", i+1, r.PublishNote)
		}
	}
	m.fill(m.Load)
	m.EndToEndPerSec = float64(m.Deliveries) / m.EndToEnd
	for k, v := range cpu {
		m.CPU[k] = v / float64(m.Deliveries)
	}
	m.WALBytesPerDelivery = float64(m.WALBytes) / float64(m.Deliveries)
	m.Check = strings.Join(checks, "; ")
	if m.ProcessorTransactions > 0 {
		m.DeliveriesPerTransaction = records / float64(m.ProcessorTransactions)
		m.BatchesPerTransaction = batches / float64(m.ProcessorTransactions)
	}
	if m.SinkTransactions > 0 {
		m.EventsPerSinkTransaction = events / float64(m.SinkTransactions)
	}
	if len(m.publishLat) > 0 {
		m.PublishP50, m.PublishP99 = ms(quantile(m.publishLat, 0.5)), ms(quantile(m.publishLat, 0.99))
	}
	return m
}

// fill sets the load's numbers.
func (r *result) fill(res *loadgen.Result) {
	r.Load, r.Accepted = res, res.OK()
	r.AcceptedPerSec = float64(r.Accepted) / res.Elapsed.Seconds()
	r.AcceptP50, r.AcceptP99 = ms(res.Latency.Quantile(0.5)), ms(res.Latency.Quantile(0.99))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// answers keeps each event's first 2xx answer time.
type answers struct {
	l     *loadgen.Lifecycle
	first []atomic.Int64 // by event index: unix nanoseconds, 0 = not accepted
	index map[string]int // webhook-id → event index
}

func newAnswers(l *loadgen.Lifecycle) *answers {
	a := &answers{l: l, first: make([]atomic.Int64, l.Payments()*loadgen.LifecycleSteps), index: map[string]int{}}
	for i := range l.Len() {
		if !l.Repeat(i) {
			a.index[l.EventID(i)] = a.event(i)
		}
	}
	return a
}

func (a *answers) event(i int) int {
	p, step := a.l.Event(i)
	return step*a.l.Payments() + p
}

// record is loadgen's OnAnswer.
func (a *answers) record(i, status int, at time.Time) {
	if status < 200 || status > 299 {
		return
	}
	slot, t := &a.first[a.event(i)], at.UnixNano()
	for {
		cur := slot.Load()
		if (cur != 0 && cur <= t) || slot.CompareAndSwap(cur, t) {
			return
		}
	}
}

// expectedTransitions counts the accepted events that make a transition:
// created, paid and refunded (the late created makes none).
func (a *answers) expectedTransitions() int {
	n := 0
	for e := range a.first {
		if e/a.l.Payments() < loadgen.StepLateCreated && a.first[e].Load() != 0 {
			n++
		}
	}
	return n
}

// runPipeline drives paystream's three processes and measures them.
func (b *bench) runPipeline(ctx context.Context, suffix string) (*result, error) {
	fmt.Println("== paystream: ingest, processor and sink, each its own process")
	pr, err := b.setUpPipeline(ctx, suffix)
	if pr != nil {
		defer pr.tearDown()
	}
	if err != nil {
		return nil, err
	}
	w, err := watchState(b.brokers, pr.state)
	if err != nil {
		return nil, err
	}
	defer w.close()
	var m meter
	m.add("ingest", func() time.Duration { return rig.ProcessCPU(pr.ingest.pid()) })
	m.add("processor", func() time.Duration { return rig.ProcessCPU(pr.processor.pid()) })
	m.add("sink", func() time.Duration { return rig.ProcessCPU(pr.sink.pid()) })
	b.addShared(&m)

	ans := newAnswers(b.workload)
	cpu0, wal0, err := b.snapshot(ctx, &m)
	if err != nil {
		return nil, err
	}
	started := time.Now()
	if b.profileDir != "" {
		// Profiles of the middle of the load: a few seconds in, for a
		// third of the expected run.
		wg := pr.profile(ctx, b.profileDir, 3*time.Second, 8*time.Second)
		defer wg.Wait()
	}
	sender, err := b.sender(pr.ingestURL)
	if err != nil {
		return nil, err
	}
	sched, paced := b.schedule()
	load, err := loadgen.RunSchedule(ctx, loadgen.ScheduleConfig{URL: pr.ingestURL, Schedule: sched, Concurrency: b.concurrency, Sender: sender,
		OnAnswer: ans.record, Progress: progress("paystream", b.workload.Len())})
	if err != nil {
		return nil, err
	}
	r := &result{Name: "paystream", Deliveries: b.workload.Len(), Pacing: paced()}
	r.fill(load)

	// Wait for the last delivery in Postgres and the last state event.
	target, err := pr.rawRecords(ctx)
	if err != nil {
		return nil, fmt.Errorf("raw topic end offsets: %w", err)
	}
	wantEvents := ans.expectedTransitions()
	var recorded, published time.Time
	lastProgress, lastCount := time.Now(), -1
	for recorded.IsZero() || published.IsZero() {
		done, err := pr.consumed(ctx, b.admin)
		if err != nil {
			return nil, fmt.Errorf("read offsets: %w", err)
		}
		now := time.Now()
		if recorded.IsZero() && done >= target {
			recorded = now
		}
		n := w.count()
		if published.IsZero() && n >= wantEvents {
			published = now
		}
		fmt.Fprintf(os.Stderr, "\r   recorded %d/%d deliveries, %d/%d state events   ", done, target, n, wantEvents)
		if int(done)+n != lastCount {
			lastProgress, lastCount = now, int(done)+n
		}
		for _, p := range []*proc{pr.ingest, pr.processor, pr.sink} {
			if !p.alive() {
				return nil, fmt.Errorf("%s exited during the run", p.name)
			}
		}
		if now.Sub(lastProgress) > time.Minute || now.Sub(started) > timeout {
			return nil, fmt.Errorf("stuck: %d of %d deliveries recorded, %d of %d state events", done, target, n, wantEvents)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	fmt.Fprintln(os.Stderr)
	if err := b.finish(ctx, r, &m, cpu0, wal0); err != nil {
		return nil, err
	}
	pr.batchSizes(ctx, r)
	r.EndToEnd = recorded.Sub(started).Seconds()
	r.EndToEndPerSec = float64(b.workload.Len()) / r.EndToEnd

	// Accepted → published, per state event.
	var lat []time.Duration
	var mismatched int
	for trigger, arr := range w.arrivals() {
		e, ok := ans.index[trigger]
		if !ok {
			mismatched++
			continue
		}
		// Payment p's step s makes its version s+1.
		p, step := e%b.workload.Payments(), e/b.workload.Payments()
		if arr.paymentKey != "bench:"+b.workload.PaymentID(p) || arr.version != int64(step)+1 {
			mismatched++
			continue
		}
		if t := ans.first[e].Load(); t != 0 {
			lat = append(lat, arr.at.Sub(time.Unix(0, t)))
		}
	}
	r.Published, r.publishLat = len(lat), lat
	r.PublishP50, r.PublishP99 = ms(quantile(lat, 0.5)), ms(quantile(lat, 0.99))
	if mismatched > 0 {
		r.PublishNote = fmt.Sprintf("%d state events matched no webhook of the run by event id, payment key and version", mismatched)
	}
	r.Check, err = b.check(ctx, pr.schema, `SELECT count(*) FROM deliveries`, target)
	return r, err
}

// runBaseline drives the synchronous baseline and measures it.
func (b *bench) runBaseline(ctx context.Context, suffix string) (*result, error) {
	fmt.Println("== synchronous baseline: one Postgres transaction per request, in its own process")
	schema := "bench_sync_" + suffix
	if _, err := b.admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	if !b.keep {
		defer func() { _, _ = b.admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") }()
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := start("baseline", b.self, "baseline", "-addr", addr, "-database-url", withSearchPath(b.dbURL, schema),
		"-sources", b.sourcesPath, "-conns", strconv.Itoa(b.baselineConns))
	if err != nil {
		return nil, err
	}
	defer p.stop()
	if err := waitHTTP(ctx, p, "http://"+addr+"/readyz"); err != nil {
		return nil, err
	}
	var m meter
	m.add("baseline", func() time.Duration { return rig.ProcessCPU(p.pid()) })
	b.addShared(&m)

	cpu0, wal0, err := b.snapshot(ctx, &m)
	if err != nil {
		return nil, err
	}
	sender, err := b.sender("http://" + addr)
	if err != nil {
		return nil, err
	}
	sched, paced := b.schedule()
	load, err := loadgen.RunSchedule(ctx, loadgen.ScheduleConfig{URL: "http://" + addr, Schedule: sched, Concurrency: b.concurrency, Sender: sender,
		Progress: progress("baseline", b.workload.Len())})
	if err != nil {
		return nil, err
	}
	r := &result{Name: "baseline", Deliveries: b.workload.Len(), Pacing: paced()}
	r.fill(load)
	if err := b.finish(ctx, r, &m, cpu0, wal0); err != nil {
		return nil, err
	}
	// Each delivery is recorded before its answer.
	r.EndToEnd = load.Elapsed.Seconds()
	r.EndToEndPerSec = float64(b.workload.Len()) / r.EndToEnd
	r.PublishNote = "published = committed, before the 2xx answer: 0 by construction"
	r.Check, err = b.check(ctx, schema, `SELECT count(*) FROM webhook_events`, int64(b.workload.Payments()*loadgen.LifecycleSteps))
	return r, err
}

// addShared adds the shared services' processes to m.
func (b *bench) addShared(m *meter) {
	m.add(benchCPU, func() time.Duration { return rig.ProcessCPU(os.Getpid()) })
	if b.brokerPID > 0 {
		m.add("broker", func() time.Duration { return rig.ProcessCPU(b.brokerPID) })
		m.add(jitCPU, func() time.Duration { return threadsCPU(b.brokerPID, "CompilerThre") })
	}
	if b.postmasterPID > 0 {
		m.add("postgres", func() time.Duration { return treeCPU(b.postmasterPID) })
		m.add(walsendersCPU, func() time.Duration { return childrenCPU(b.postmasterPID, "postgres: walsender") })
	}
}

// snapshot samples the CPU times and the WAL position.
func (b *bench) snapshot(ctx context.Context, m *meter) (map[string]time.Duration, string, error) {
	cpu := m.sample()
	wal, err := walLSN(ctx, b.admin)
	if err != nil {
		return nil, "", fmt.Errorf("wal position: %w", err)
	}
	return cpu, wal, nil
}

// finish sets r's CPU and WAL per delivery since the snapshot.
func (b *bench) finish(ctx context.Context, r *result, m *meter, cpu0 map[string]time.Duration, wal0 string) error {
	cpu1, wal1, err := b.snapshot(ctx, m)
	if err != nil {
		return err
	}
	n := b.workload.Len()
	r.CPU = cpuPerDelivery(cpu0, cpu1, n)
	if r.WALBytes, err = walBytes(ctx, b.admin, wal0, wal1); err != nil {
		return fmt.Errorf("wal bytes: %w", err)
	}
	r.WALBytesPerDelivery = float64(r.WALBytes) / float64(n)
	return nil
}

// check verifies the run's outcome: every payment refunded, and the
// recorded rows (counted by countSQL) as many as want.
func (b *bench) check(ctx context.Context, schema, countSQL string, want int64) (string, error) {
	conn := b.admin
	if _, err := conn.Exec(ctx, "SET search_path TO "+schema); err != nil {
		return "", err
	}
	defer func() { _, _ = conn.Exec(context.Background(), "RESET search_path") }()
	var refunded, payments, rows, postings int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'refunded'), count(*) FROM payments`).Scan(&refunded, &payments); err != nil {
		return "", fmt.Errorf("check payments: %w", err)
	}
	if err := conn.QueryRow(ctx, countSQL).Scan(&rows); err != nil {
		return "", fmt.Errorf("check rows: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ledger_postings`).Scan(&postings); err != nil {
		return "", fmt.Errorf("check postings: %w", err)
	}
	verdict := "OK"
	if refunded != int64(b.workload.Payments()) || payments != refunded || rows != want {
		verdict = "MISMATCH"
	}
	return fmt.Sprintf("%s: %d/%d payments refunded, %d rows recorded (want %d), %d ledger postings",
		verdict, refunded, b.workload.Payments(), rows, want, postings), nil
}

// quantile returns the q-quantile of ds (nearest rank), 0 without samples.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	k := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(k, 0), len(ds)-1)]
}
