package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestBucketBoundsAreContiguous(t *testing.T) {
	t.Parallel()
	// Every bucket starts right after the previous one ends, and a value
	// falls in the bucket whose bounds hold it.
	prev := uint64(0)
	for i := 1; i < numBuckets; i++ {
		lo := upperBound(i-1) + 1
		if upperBound(i) < lo {
			t.Fatalf("bucket %d: upper %d below lower %d", i, upperBound(i), lo)
		}
		if got := bucketOf(lo); got != i {
			t.Fatalf("bucketOf(%d) = %d, want %d", lo, got, i)
		}
		if got := bucketOf(upperBound(i)); got != i {
			t.Fatalf("bucketOf(upper %d) = %d, want %d", upperBound(i), got, i)
		}
		prev = upperBound(i)
	}
	if prev != ^uint64(0) {
		t.Fatalf("last bucket ends at %d, want max uint64", prev)
	}
}

// TestQuantileMatchesSortedSamples compares the histogram's quantiles with
// the exact ones from sorted samples: never below, at most 1/64 above.
func TestQuantileMatchesSortedSamples(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var h Histogram
	samples := make([]time.Duration, 100_000)
	for i := range samples {
		// Log-uniform from 1µs to 10s, like latencies.
		samples[i] = time.Duration(1000 * math.Pow(1e7, rng.Float64()))
		h.Record(samples[i])
	}
	slices.Sort(samples)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		exact := samples[int(q*float64(len(samples)))-1]
		got := h.Quantile(q)
		if got < exact || float64(got) > float64(exact)*(1+1.0/64)+1 {
			t.Errorf("Quantile(%v) = %v, exact %v", q, got, exact)
		}
	}
	if h.Max() != samples[len(samples)-1] {
		t.Errorf("Max = %v, want %v", h.Max(), samples[len(samples)-1])
	}
	if h.Count() != uint64(len(samples)) {
		t.Errorf("Count = %d", h.Count())
	}
}

func TestHistogramEmptyAndConcurrent(t *testing.T) {
	t.Parallel()
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Max() != 0 || h.Mean() != 0 {
		t.Fatal("empty histogram reports non-zero values")
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				h.Record(time.Duration(w*1000+i) * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	if h.Count() != 8000 {
		t.Fatalf("Count = %d, want 8000", h.Count())
	}
	if h.Max() != 7999*time.Microsecond {
		t.Fatalf("Max = %v", h.Max())
	}
	h.Record(-time.Second) // clamps to zero
	if h.Quantile(1.0/8001) != 0 {
		t.Errorf("smallest sample = %v, want 0", h.Quantile(1.0/8001))
	}
}

func TestHistogramMerge(t *testing.T) {
	t.Parallel()
	var a, b, all Histogram
	for i := range 1000 {
		d := time.Duration(i*i) * time.Microsecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(&b)
	if a.Count() != all.Count() || a.Max() != all.Max() || a.Mean() != all.Mean() {
		t.Fatalf("merged count %d max %v mean %v, want %d %v %v", a.Count(), a.Max(), a.Mean(), all.Count(), all.Max(), all.Mean())
	}
	for _, q := range []float64{0.5, 0.9, 0.99} {
		if a.Quantile(q) != all.Quantile(q) {
			t.Errorf("merged Quantile(%v) = %v, want %v", q, a.Quantile(q), all.Quantile(q))
		}
	}
}
