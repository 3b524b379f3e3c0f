package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// Schedule is a fixed list of requests, sent in order by RunSchedule;
// Lifecycle is one.
type Schedule interface {
	// Len returns the number of requests.
	Len() int
	// Request returns request i, signed at now.
	Request(i int, now time.Time) (*Request, error)
	// Repeat reports whether request i re-sends an event sent before.
	Repeat(i int) bool
}

// ScheduleConfig configures RunSchedule.
type ScheduleConfig struct {
	// URL is the target's base URL, e.g. http://127.0.0.1:8080. Required.
	URL string
	// Schedule is what to send. Required.
	Schedule Schedule
	// Concurrency is the number of workers (and keep-alive connections),
	// each with at most one request in flight. Defaults to 16.
	Concurrency int
	// Client sends the requests. Defaults to NewClient(Concurrency, 10s).
	Client *http.Client
	// Sender, when set, sends the requests instead of Client, as in
	// Config.
	Sender Sender
	// OnAnswer, when set, is called from the worker goroutines after each
	// answered request with its index, status code and when its answer
	// was read.
	OnAnswer func(i, status int, answered time.Time)
	// Progress and ProgressInterval are as in Config.
	Progress         func(Snapshot)
	ProgressInterval time.Duration
}

// RunSchedule sends every request of cfg.Schedule once, in order (request
// i is sent when a worker is free after i-1 was), as fast as the workers
// can, and returns what it measured. Result.Elapsed runs from the first
// request to the last answer. Canceling ctx abandons the run. As with Run,
// only a configuration error or a request that cannot be built is an
// error; failed requests are counted in the Result.
func RunSchedule(ctx context.Context, cfg ScheduleConfig) (*Result, error) {
	switch {
	case cfg.URL == "":
		return nil, errors.New("schedule config: URL is required")
	case cfg.Schedule == nil:
		return nil, errors.New("schedule config: Schedule is required")
	case cfg.Concurrency < 0:
		return nil, errors.New("schedule config: Concurrency must be positive")
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 16
	}
	if cfg.Client == nil {
		cfg.Client = NewClient(cfg.Concurrency, 10*time.Second)
	}
	if cfg.Sender == nil {
		cfg.Sender = &HTTPSender{BaseURL: cfg.URL, Client: cfg.Client}
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = time.Second
	}
	// The shared counters, histogram and progress reporter are Run's.
	r := &run{cfg: Config{Sender: cfg.Sender, Progress: cfg.Progress, ProgressInterval: cfg.ProgressInterval}, errKinds: map[string]int64{}}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var next atomic.Int64
	elapsed, err := r.drive(time.Now(), cfg.Concurrency, cancel, func() error {
		for ctx.Err() == nil {
			i := int(next.Add(1) - 1)
			if i >= cfg.Schedule.Len() {
				return nil
			}
			if err := r.sendScheduled(ctx, cfg, i); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return r.result(elapsed, 0, cfg.Concurrency, cfg.Progress), nil
}

// sendScheduled sends request i and records its answer.
func (r *run) sendScheduled(ctx context.Context, cfg ScheduleConfig, i int) error {
	req, err := cfg.Schedule.Request(i, time.Now())
	if err != nil {
		return fmt.Errorf("build request %d: %w", i, err)
	}
	if cfg.Schedule.Repeat(i) {
		r.dups.Add(1)
	}
	status, answered, err := r.send(ctx, req)
	if err != nil {
		return fmt.Errorf("request %d: %w", i, err)
	}
	if status != 0 && cfg.OnAnswer != nil {
		cfg.OnAnswer(i, status, answered)
	}
	return nil
}
