package main

import (
	"sync/atomic"
	"time"

	"github.com/paystream/paystream/internal/lab/loadgen"
)

// lateAfter is how far behind its slot a request may start before it
// counts as late: the target (or the load generator's workers) did not keep
// up with the rate.
const lateAfter = 10 * time.Millisecond

// paced is a loadgen.Schedule whose request i is not built before
// start + i/rate. loadgen.RunSchedule's workers take requests in index
// order, so the requests arrive at the rate for as long as a worker is free
// at each slot; a request that starts later than lateAfter behind its slot
// is counted.
type paced struct {
	loadgen.Schedule
	start    time.Time
	interval time.Duration
	late     atomic.Int64
	maxLate  atomic.Int64 // nanoseconds
}

// newPaced paces s at rate requests per second from now on.
func newPaced(s loadgen.Schedule, rate float64) *paced {
	return &paced{Schedule: s, start: time.Now(), interval: time.Duration(float64(time.Second) / rate)}
}

// Request waits for request i's slot, then builds it.
func (p *paced) Request(i int, now time.Time) (*loadgen.Request, error) {
	slot := p.start.Add(time.Duration(i) * p.interval)
	if d := time.Until(slot); d > 0 {
		time.Sleep(d)
	} else if late := -d; late > lateAfter {
		p.late.Add(1)
		for {
			m := p.maxLate.Load()
			if int64(late) <= m || p.maxLate.CompareAndSwap(m, int64(late)) {
				break
			}
		}
	}
	return p.Schedule.Request(i, time.Now())
}

// pacing is what a paced run reports about keeping the rate.
type pacing struct {
	// Rate is the offered arrival rate, requests per second.
	Rate float64 `json:"rate"`
	// Late counts requests that started more than 10 ms after their slot.
	Late int64 `json:"late_requests"`
	// MaxLateMS is how late the latest one was.
	MaxLateMS float64 `json:"max_late_ms"`
}

func (p *paced) report(rate float64) *pacing {
	return &pacing{Rate: rate, Late: p.late.Load(), MaxLateMS: ms(time.Duration(p.maxLate.Load()))}
}

// schedule returns the workload to send: as it is, or paced at -rate.
// done, called after the run, returns the pacing report (nil unpaced).
func (b *bench) schedule() (s loadgen.Schedule, done func() *pacing) {
	if b.rate <= 0 {
		return b.workload, func() *pacing { return nil }
	}
	p := newPaced(b.workload, b.rate)
	return p, func() *pacing { return p.report(b.rate) }
}
