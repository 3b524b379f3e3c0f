package simulate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/paystream/paystream/internal/lab/loadgen"
)

// Progress is a delivery's progress so far.
type Progress struct {
	Elapsed time.Duration
	// Sent counts finished attempts (retries included); Acked the planned
	// sends acknowledged; Total the planned sends.
	Sent, Acked, Total int
	// Status counts answers by HTTP status code; NetErrors requests that
	// got none.
	Status    map[int]int
	NetErrors int
	// Retries counts attempts after a first one; GivenUp sends abandoned
	// after the whole retry ladder.
	Retries, GivenUp int
	Final            bool
}

// DeliveryStats is what Deliver did.
type DeliveryStats struct {
	Elapsed time.Duration `json:"elapsed_ns"`
	// Events is the distinct webhooks; Planned the sends (with
	// duplicates); Duplicates the planned re-sends.
	Events     int `json:"events"`
	Planned    int `json:"planned"`
	Duplicates int `json:"duplicates"`
	// Attempts counts HTTP requests, retries included.
	Attempts int `json:"attempts"`
	Retries  int `json:"retries"`
	// OK counts 2xx answers; Status5xx every 5xx answer, of which
	// Status503 the 503s; OtherStatus the other non-2xx answers; NetErrors
	// the requests that got no answer.
	OK          int         `json:"ok"`
	Status5xx   int         `json:"status_5xx"`
	Status503   int         `json:"status_503"`
	OtherStatus int         `json:"other_status"`
	NetErrors   int         `json:"net_errors"`
	Status      map[int]int `json:"status"`
	// GivenUp counts sends abandoned after the whole retry ladder.
	GivenUp int `json:"given_up"`
	// Poison is the number of poison records planted.
	Poison int `json:"poison"`
	// P50, P99 and Max are the answers' latencies.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// delivery is the shared state of one Deliver.
type delivery struct {
	mu        sync.Mutex
	status    map[int]int
	netErrors int
	sent      int
	acked     int
	retries   int
	givenUp   int
	lat       loadgen.Histogram
}

// Deliver sends every planned webhook to IngestURL, like a gateway: each
// send is retried along the retry ladder until acknowledged with a 2xx or
// given up. Every 2xx is recorded in the oracle. progress, when not nil,
// is called every ProgressInterval and once at the end. It returns an error
// only for a configuration problem, a request it cannot build, a poison it
// cannot plant or ctx ending; failed sends are counted in DeliveryStats.
func (s *Simulation) Deliver(ctx context.Context, progress func(Progress)) (DeliveryStats, error) {
	if s.loaded {
		return DeliveryStats{}, errors.New("deliver: a loaded simulation can only verify")
	}
	if s.cfg.IngestURL == "" {
		return DeliveryStats{}, errors.New("deliver: IngestURL is required")
	}
	if !s.delivered.CompareAndSwap(false, true) {
		return DeliveryStats{}, errors.New("deliver: already delivered")
	}
	if len(s.cfg.KafkaBrokers) > 0 && s.cfg.RawTopic != "" {
		ends, err := endOffsets(ctx, kafkaClientOpts(s.cfg.KafkaBrokers, s.cfg.KafkaOpts), s.cfg.RawTopic)
		if err != nil {
			return DeliveryStats{}, fmt.Errorf("deliver: %w", err)
		}
		s.oracle.mu.Lock()
		s.oracle.StartOffsets = ends
		s.oracle.mu.Unlock()
	}
	if s.cfg.Sampler != nil {
		s.cfg.Sampler.Start()
	}
	var lim *rate.Limiter
	if s.cfg.Rate > 0 {
		lim = rate.NewLimiter(rate.Limit(s.cfg.Rate), s.cfg.Burst)
	}
	d := &delivery{status: map[int]int{}}
	start := time.Now()
	snapshot := func(final bool) Progress {
		d.mu.Lock()
		defer d.mu.Unlock()
		return Progress{Elapsed: time.Since(start), Sent: d.sent, Acked: d.acked, Total: len(s.plan),
			Status: maps.Clone(d.status), NetErrors: d.netErrors, Retries: d.retries, GivenUp: d.givenUp, Final: final}
	}
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if progress != nil {
		progressWG.Go(func() {
			t := time.NewTicker(s.cfg.ProgressInterval)
			defer t.Stop()
			for {
				select {
				case <-progressDone:
					return
				case <-t.C:
					progress(snapshot(false))
				}
			}
		})
	}

	sendCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	poisonAt := int64(len(s.plan) / 2)
	for w := range s.cfg.Concurrency {
		rng := mrand.New(mrand.NewPCG(uint64(s.cfg.Seed), uint64(w)))
		wg.Go(func() {
			for sendCtx.Err() == nil {
				k := next.Add(1) - 1
				if k >= int64(len(s.plan)) {
					return
				}
				if k == poisonAt && s.cfg.Poison > 0 {
					if err := s.plantPoison(sendCtx); err != nil {
						fail(err)
						return
					}
				}
				if lim != nil && lim.Wait(sendCtx) != nil {
					return
				}
				if s.cfg.MaxDelay > 0 && !sleep(sendCtx, time.Duration(rng.Int64N(int64(s.cfg.MaxDelay)))) {
					return
				}
				if err := s.send(sendCtx, d, s.oracle.Events[s.plan[k]]); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(progressDone)
	progressWG.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	stats := s.stats(d, time.Since(start))
	s.oracle.mu.Lock()
	s.oracle.Stats = stats
	s.oracle.mu.Unlock()
	if progress != nil {
		progress(snapshot(true))
	}
	if firstErr != nil {
		return stats, fmt.Errorf("deliver: %w", firstErr)
	}
	return stats, nil
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// send delivers one planned send of e, retrying along the ladder.
func (s *Simulation) send(ctx context.Context, d *delivery, e *OracleEvent) error {
	op := s.oracle.Payments[e.Payment]
	if err := s.expose(e.Payment, e.Step); err != nil {
		return err
	}
	sg := s.signers[op.Source]
	for attempt := 0; ; attempt++ {
		req, err := sg.build(&op.History, e.Step, e.EventID, time.Now())
		if err != nil {
			return fmt.Errorf("build webhook: %w", err)
		}
		hreq, err := req.HTTPRequest(ctx, s.cfg.IngestURL)
		if err != nil {
			return fmt.Errorf("build webhook: %w", err)
		}
		began := time.Now()
		resp, err := s.cfg.Client.Do(hreq)
		code := 0
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body) // the status is the answer; a body cut short after it changes nothing
			resp.Body.Close()
			code = resp.StatusCode
		}
		if ctx.Err() != nil {
			return nil // abandoned: not the target's failure
		}
		ok := code >= 200 && code < 300
		d.mu.Lock()
		d.sent++
		if attempt > 0 {
			d.retries++
		}
		if code != 0 {
			d.status[code]++
			d.lat.Record(time.Since(began))
		} else {
			d.netErrors++
		}
		if ok {
			d.acked++
		}
		d.mu.Unlock()
		s.oracle.ack(e, ok)
		if ok {
			return nil
		}
		if attempt >= len(s.cfg.RetryLadder) {
			s.oracle.giveUp(e)
			d.mu.Lock()
			d.givenUp++
			d.mu.Unlock()
			s.log.Warn("simulate: delivery given up", "source", op.Source, "event_id", e.EventID, "attempts", attempt+1, "last_status", code)
			return nil
		}
		if !sleep(ctx, s.cfg.RetryLadder[attempt]) {
			return nil
		}
	}
}

func (s *Simulation) stats(d *delivery, elapsed time.Duration) DeliveryStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := DeliveryStats{Elapsed: elapsed, Events: len(s.oracle.Events), Planned: len(s.plan),
		Duplicates: len(s.plan) - len(s.oracle.Events), Attempts: d.sent, Retries: d.retries,
		NetErrors: d.netErrors, Status: maps.Clone(d.status), GivenUp: d.givenUp, Poison: len(s.oracle.Poison),
		P50: d.lat.Quantile(0.5), P99: d.lat.Quantile(0.99), Max: d.lat.Max()}
	for code, n := range d.status {
		switch {
		case code >= 200 && code < 300:
			st.OK += n
		case code >= 500:
			st.Status5xx += n
			if code == http.StatusServiceUnavailable {
				st.Status503 += n
			}
		default:
			st.OtherStatus += n
		}
	}
	return st
}

// plantPoison produces cfg.Poison records no processor can decode, each
// keyed by a payment of its own, straight to the raw topic (ingest would
// refuse them: poison reaches the raw topic from an older or buggy ingest),
// with the key partitioner ingest uses.
func (s *Simulation) plantPoison(ctx context.Context) error {
	cl, err := kgo.NewClient(append(kafkaClientOpts(s.cfg.KafkaBrokers, s.cfg.KafkaOpts),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return fmt.Errorf("plant poison: %w", err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, s.cfg.Poison)
	for i := range recs {
		key := fmt.Sprintf("simulate:poison_%s_%d", s.oracle.IDs.Run, i)
		recs[i] = &kgo.Record{Topic: s.cfg.RawTopic, Key: []byte(key), Value: []byte("\x00 simulate poison: not an envelope {")}
	}
	res := cl.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		return fmt.Errorf("plant poison: %w", err)
	}
	s.oracle.mu.Lock()
	defer s.oracle.mu.Unlock()
	for _, r := range res {
		s.oracle.Poison = append(s.oracle.Poison, PoisonRecord{Key: string(r.Record.Key), Partition: r.Record.Partition, Offset: r.Record.Offset})
	}
	s.log.Info("simulate: poison planted", "records", len(recs))
	return nil
}
