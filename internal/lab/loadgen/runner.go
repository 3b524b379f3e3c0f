package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"
)

// Config configures Run.
type Config struct {
	// URL is ingest's base URL, e.g. http://127.0.0.1:8080. Required.
	URL string
	// Generator decides what to send. Required.
	Generator *Generator
	// Rate is the target in requests per second, over all workers; 0 sends
	// as fast as the workers can. Defaults to 0.
	Rate float64
	// Concurrency is the number of workers, each with at most one request
	// in flight. Defaults to 16.
	Concurrency int
	// Duration stops the run after this long. Requests stops it after that
	// many requests. At least one is required; with both, the first
	// reached stops it.
	Duration time.Duration
	Requests int64
	// Client sends the requests. Defaults to a keep-alive client with one
	// idle connection per worker and a 10s timeout.
	Client *http.Client
	// Sender, when set, sends the requests instead of Client (URL is then
	// only checked to be set): NewFastSender's costs the sending machine
	// less CPU.
	Sender Sender
	// Progress, when set, is called every ProgressInterval (from one
	// goroutine) with the run so far, and once more at the end.
	Progress func(Snapshot)
	// ProgressInterval defaults to 1s.
	ProgressInterval time.Duration
}

// Snapshot is a run's progress.
type Snapshot struct {
	// Elapsed is the time since the run started.
	Elapsed time.Duration
	// Sent counts finished requests: answered or failed.
	Sent int64
	// Errors counts requests not answered 2xx (transport errors included).
	Errors int64
	// RPS is the rate of finished requests since the previous snapshot.
	RPS float64
	// P99 is the 99th percentile latency of the answers so far.
	P99 time.Duration
	// Final is set on the last snapshot of a run.
	Final bool
}

// Result is what a run measured.
type Result struct {
	// Elapsed is from the first request to the last answer.
	Elapsed time.Duration
	// Sent counts finished requests: answered or failed.
	Sent int64
	// Duplicates counts requests that re-sent an event.
	Duplicates int64
	// Status counts answers by HTTP status code.
	Status map[int]int64
	// Errors counts requests that got no answer, by kind (timeout,
	// connection refused, connection reset, other).
	Errors map[string]int64
	// Latency holds the time from sending each answered request to reading
	// its whole answer.
	Latency *Histogram
	// Rate and Concurrency are the run's settings, for the report.
	Rate        float64
	Concurrency int
}

// Throughput returns finished requests per second.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Sent) / r.Elapsed.Seconds()
}

// OK returns the number of 2xx answers.
func (r *Result) OK() int64 {
	var n int64
	for code, c := range r.Status {
		if code >= 200 && code < 300 {
			n += c
		}
	}
	return n
}

// Failed returns the number of requests not answered 2xx.
func (r *Result) Failed() int64 { return r.Sent - r.OK() }

// run is the shared state of one Run.
type run struct {
	cfg      Config
	lat      Histogram
	sent     atomic.Int64
	failed   atomic.Int64
	dups     atomic.Int64
	claimed  atomic.Int64
	status   [600]atomic.Int64
	errMu    sync.Mutex
	errKinds map[string]int64
}

// Run sends requests until cfg.Duration passed, cfg.Requests were sent or
// ctx is canceled, and returns what it measured. Requests in flight when
// the duration ends are waited for; canceling ctx abandons them. Only a
// configuration error, or a request that cannot be built, is an error:
// failed requests are counted in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	switch {
	case cfg.URL == "":
		return nil, errors.New("loadgen config: URL is required")
	case cfg.Generator == nil:
		return nil, errors.New("loadgen config: Generator is required")
	case cfg.Duration <= 0 && cfg.Requests <= 0:
		return nil, errors.New("loadgen config: Duration or Requests is required")
	case cfg.Rate < 0 || math.IsInf(cfg.Rate, 0) || math.IsNaN(cfg.Rate):
		return nil, fmt.Errorf("loadgen config: Rate %v: want a positive number of requests per second, or 0 for no limit", cfg.Rate)
	case cfg.Concurrency < 0:
		return nil, errors.New("loadgen config: Concurrency must be positive")
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 16
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = time.Second
	}
	if cfg.Client == nil {
		cfg.Client = NewClient(cfg.Concurrency, 10*time.Second)
	}
	if cfg.Sender == nil {
		cfg.Sender = &HTTPSender{BaseURL: cfg.URL, Client: cfg.Client}
	}
	var lim *rate.Limiter
	if cfg.Rate > 0 {
		// A burst of 10ms worth of requests lets workers that were held up
		// (a GC pause, a busy CPU) catch up instead of losing their slots,
		// so the average rate holds; beyond that the run falls behind and
		// the report says so.
		lim = rate.NewLimiter(rate.Limit(cfg.Rate), max(1, int(math.Ceil(cfg.Rate/100))))
	}

	r := &run{cfg: cfg, errKinds: map[string]int64{}}
	start := time.Now()
	// stop ends the sending; requests in flight finish on ctx.
	stop, cancelStop := context.WithCancel(ctx)
	defer cancelStop()
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		stop, cancel = context.WithDeadline(stop, start.Add(cfg.Duration))
		defer cancel()
	}

	elapsed, err := r.drive(start, cfg.Concurrency, cancelStop, func() error { return r.worker(ctx, stop, lim) })
	if err != nil {
		return nil, err
	}
	return r.result(elapsed, cfg.Rate, cfg.Concurrency, cfg.Progress), nil
}

// drive runs n copies of work at once, with the progress reporter, from
// start until they all return, then stops the reporter and returns how
// long that took. The first error a copy returns calls stop (the others
// then end) and is returned.
func (r *run) drive(start time.Time, n int, stop func(), work func() error) (time.Duration, error) {
	progressDone, progressStopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(progressStopped)
		r.progress(start, progressDone)
	}()
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for range n {
		wg.Go(func() {
			if err := work(); err != nil {
				errc <- err
				stop()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(progressDone)
	<-progressStopped
	close(errc)
	return elapsed, <-errc
}

// result is what the run did in elapsed, also reported to progress (when
// not nil) as the final Snapshot.
func (r *run) result(elapsed time.Duration, rate float64, concurrency int, progress func(Snapshot)) *Result {
	res := &Result{
		Elapsed:     elapsed,
		Sent:        r.sent.Load(),
		Duplicates:  r.dups.Load(),
		Status:      map[int]int64{},
		Errors:      r.errKinds,
		Latency:     &r.lat,
		Rate:        rate,
		Concurrency: concurrency,
	}
	for code := range r.status {
		if n := r.status[code].Load(); n > 0 {
			res.Status[code] = n
		}
	}
	if progress != nil {
		progress(Snapshot{Elapsed: elapsed, Sent: res.Sent, Errors: r.failed.Load(), RPS: res.Throughput(), P99: r.lat.Quantile(0.99), Final: true})
	}
	return res
}

// NewClient returns an HTTP client suited to a load test over loopback:
// keep-alive with up to conns idle connections, no compression, timeout
// per request.
func NewClient(conns int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
}

func (r *run) worker(ctx, stop context.Context, lim *rate.Limiter) error {
	for {
		if stop.Err() != nil {
			return nil
		}
		if r.cfg.Requests > 0 && r.claimed.Add(1) > r.cfg.Requests {
			return nil
		}
		if lim != nil && lim.Wait(stop) != nil {
			return nil // stopped, or the next slot is past the deadline
		}
		req, dup, err := r.cfg.Generator.Next(time.Now())
		if err != nil {
			return fmt.Errorf("build request: %w", err)
		}
		if dup {
			r.dups.Add(1)
		}
		if _, _, err := r.send(ctx, req); err != nil {
			return err
		}
	}
}

// send sends req and counts its answer or failure. It returns the answer's
// status and time (0 and the zero time when there was none), and an error
// only when req could not be built.
func (r *run) send(ctx context.Context, req *Request) (status int, answered time.Time, err error) {
	start := time.Now()
	status, err = r.cfg.Sender.Send(ctx, req)
	answered = time.Now()
	switch {
	case errors.Is(err, errBuild):
		return 0, time.Time{}, err
	case err != nil && ctx.Err() != nil:
		return 0, time.Time{}, nil // abandoned: not a failure of the target
	case err != nil:
		r.sent.Add(1)
		r.failed.Add(1)
		r.errMu.Lock()
		r.errKinds[errorKind(err)]++
		r.errMu.Unlock()
		return 0, time.Time{}, nil
	}
	r.lat.Record(answered.Sub(start))
	if status > 0 && status < len(r.status) {
		r.status[status].Add(1)
	}
	if status < 200 || status > 299 {
		r.failed.Add(1)
	}
	r.sent.Add(1)
	return status, answered, nil
}

func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection reset"
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, fasthttp.ErrTimeout):
		return "timeout"
	}
	return "other"
}

func (r *run) progress(start time.Time, done <-chan struct{}) {
	if r.cfg.Progress == nil {
		return
	}
	t := time.NewTicker(r.cfg.ProgressInterval)
	defer t.Stop()
	last, lastAt := int64(0), start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			sent := r.sent.Load()
			rps := float64(sent-last) / now.Sub(lastAt).Seconds()
			last, lastAt = sent, now
			r.cfg.Progress(Snapshot{Elapsed: now.Sub(start), Sent: sent, Errors: r.failed.Load(), RPS: rps, P99: r.lat.Quantile(0.99)})
		}
	}
}

// Merge adds o, a run of the same target, to r: counts and latencies add
// up, and so do elapsed times, so Throughput is over both runs.
func (r *Result) Merge(o *Result) {
	r.Elapsed += o.Elapsed
	r.Sent += o.Sent
	r.Duplicates += o.Duplicates
	if r.Status == nil {
		r.Status = map[int]int64{}
	}
	for c, n := range o.Status {
		r.Status[c] += n
	}
	if r.Errors == nil {
		r.Errors = map[string]int64{}
	}
	for k, n := range o.Errors {
		r.Errors[k] += n
	}
	if r.Latency == nil {
		r.Latency = &Histogram{}
	}
	r.Latency.Merge(o.Latency)
	r.Rate, r.Concurrency = o.Rate, o.Concurrency
}

// StatusCodes returns the result's status codes in ascending order.
func (r *Result) StatusCodes() []int {
	codes := make([]int, 0, len(r.Status))
	for c := range r.Status {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	return codes
}
