package loadgen

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram records durations in log-linear buckets: exact below 128ns,
// then 64 buckets per power of two, so a reported quantile is within 1/64
// (1.6%) of the true sample above it. It is safe for concurrent use and
// costs a few atomic adds per sample, whatever the number of samples.
type Histogram struct {
	counts [numBuckets]atomic.Uint64
	n      atomic.Uint64
	sum    atomic.Uint64 // nanoseconds
	max    atomic.Int64  // nanoseconds
}

const (
	subBits    = 6 // 64 sub-buckets per power of two
	subCount   = 1 << subBits
	numBuckets = (64-subBits)*subCount + subCount // indexes 0 .. (64-subBits)*64+63
)

// bucketOf returns the bucket of a value in nanoseconds.
func bucketOf(v uint64) int {
	l := bits.Len64(v)
	if l <= subBits+1 {
		return int(v) // 0..127: one bucket per value
	}
	m := v >> (l - subBits - 1) // in [64, 128)
	return (l-subBits)*subCount + int(m) - subCount
}

// upperBound returns the largest value that falls in bucket i.
func upperBound(i int) uint64 {
	if i < 2*subCount {
		return uint64(i)
	}
	octave, m := i/subCount, uint64(i%subCount+subCount)
	shift := octave - 1
	return (m+1)<<shift - 1
}

// Record adds one sample. Negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := max(int64(d), 0)
	h.counts[bucketOf(uint64(v))].Add(1)
	h.n.Add(1)
	h.sum.Add(uint64(v))
	for {
		cur := h.max.Load()
		if v <= cur || h.max.CompareAndSwap(cur, v) {
			return
		}
	}
}

// Count returns the number of samples.
func (h *Histogram) Count() uint64 { return h.n.Load() }

// Max returns the largest sample, exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Mean returns the average sample.
func (h *Histogram) Mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns an upper bound of the q-quantile (0 < q ≤ 1) of the
// samples: the top of the bucket holding the ⌈q·n⌉-th smallest sample,
// never above Max. It returns 0 without samples.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	rank = min(max(rank, 1), n)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return min(time.Duration(upperBound(i)), h.Max())
		}
	}
	return h.Max() // samples recorded while we read
}

// Merge adds o's samples to h.
func (h *Histogram) Merge(o *Histogram) {
	for i := range o.counts {
		if n := o.counts[i].Load(); n > 0 {
			h.counts[i].Add(n)
		}
	}
	h.n.Add(o.n.Load())
	h.sum.Add(o.sum.Load())
	for v := o.max.Load(); ; {
		cur := h.max.Load()
		if v <= cur || h.max.CompareAndSwap(cur, v) {
			return
		}
	}
}
