package retry

import (
	"fmt"
	"testing"
	"time"
)

// ceiling is the n-th wait without jitter: min(initial·2ⁿ, max).
func ceiling(initial, max time.Duration, n int) time.Duration {
	d := initial
	for range n {
		if d >= max/2 {
			return max
		}
		d *= 2
	}
	return min(d, max)
}

// slack absorbs the nanoseconds lost dividing the bounds by 4/3.
const slack = time.Microsecond

// TestBounds: every wait lies in [ceiling/2, ceiling], ceiling being
// min(Initial·2ⁿ, Max), for the bounds each loop uses.
func TestBounds(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{
		{Initial: 50 * time.Millisecond, Max: 5 * time.Second},        // processor batch and claim
		{Initial: 100 * time.Millisecond, Max: 5 * time.Second},       // sink relay
		{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}, // tests' RetryBackoffMax
		{Initial: 3 * time.Second, Max: time.Second},                  // Initial above Max
		{Initial: 7, Max: 1001},                                       // nanoseconds: rounding
	} {
		t.Run(fmt.Sprint(p.Initial, "-", p.Max), func(t *testing.T) {
			t.Parallel()
			initial := min(p.Initial, p.Max)
			for range 200 {
				b := p.Backoff()
				for n := range 30 {
					d, c := b.Next(), ceiling(initial, p.Max, n)
					if d > c || d < c/2-slack {
						t.Fatalf("wait %d = %v, want within [%v, %v]", n, d, c/2, c)
					}
				}
			}
		})
	}
}

// TestDefaults: the zero Policy waits at most 100ms first and 5s at most.
func TestDefaults(t *testing.T) {
	t.Parallel()
	b := Policy{}.Backoff()
	if d := b.Next(); d > 100*time.Millisecond || d < 50*time.Millisecond-slack {
		t.Errorf("first wait %v, want within [50ms, 100ms]", d)
	}
	for range 20 {
		b.Next()
	}
	if d := b.Next(); d > 5*time.Second || d < 2500*time.Millisecond-slack {
		t.Errorf("wait after 21 attempts %v, want within [2.5s, 5s]", d)
	}
}

// TestJitter: waits of one step spread over their whole range (the
// hand-written doubling waited exactly the ceiling every time), and two
// loops that fail in step wait differently.
func TestJitter(t *testing.T) {
	t.Parallel()
	const draws = 10000
	p := Policy{Initial: 50 * time.Millisecond, Max: 5 * time.Second}
	for _, step := range []int{0, 3, 12} {
		c := ceiling(p.Initial, p.Max, step)
		lo, hi, sum := c, time.Duration(0), 0.0
		for range draws {
			b := p.Backoff()
			for range step {
				b.Next()
			}
			d := b.Next()
			lo, hi, sum = min(lo, d), max(hi, d), sum+float64(d)
		}
		mean := time.Duration(sum / draws)
		t.Logf("step %d, ceiling %v: %d waits in [%v, %v], mean %v", step, c, draws, lo, hi, mean)
		if lo > c*55/100 || hi < c*95/100 {
			t.Errorf("step %d: waits in [%v, %v], want them spread over [%v, %v]", step, lo, hi, c/2, c)
		}
		if mean < c*73/100 || mean > c*77/100 {
			t.Errorf("step %d: mean wait %v, want about 3/4 of %v (uniform over [c/2, c])", step, mean, c)
		}
	}
	a, b := p.Backoff(), p.Backoff()
	same := 0
	for range 100 {
		if a.Next() == b.Next() {
			same++
		}
	}
	if same > 5 {
		t.Errorf("two backoffs drew the same wait %d times in 100: no jitter", same)
	}
}

// TestReset: after reaching Max, Reset starts over from Initial.
func TestReset(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	b := p.Backoff()
	for range 10 {
		b.Next()
	}
	if d := b.Next(); d < 2500*time.Millisecond-slack {
		t.Fatalf("after 10 waits: %v, want at least Max/2", d)
	}
	b.Reset()
	for n := range 4 {
		c := ceiling(p.Initial, p.Max, n)
		if d := b.Next(); d > c || d < c/2-slack {
			t.Errorf("wait %d after Reset = %v, want within [%v, %v]", n, d, c/2, c)
		}
	}
}

// TestAgain: Again draws at the current step and does not lengthen the
// waits after it.
func TestAgain(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	b := p.Backoff()
	b.Next() // step 0 used; the next is step 1: [100ms, 200ms]
	for range 1000 {
		if d := b.Again(); d > 200*time.Millisecond || d < 100*time.Millisecond-slack {
			t.Fatalf("Again at step 1 = %v, want within [100ms, 200ms]", d)
		}
	}
	if d := b.Next(); d > 200*time.Millisecond || d < 100*time.Millisecond-slack {
		t.Errorf("Next after 1000 Again = %v, want step 1's [100ms, 200ms]", d)
	}
}

func ExampleBackoff() {
	b := Policy{Initial: 50 * time.Millisecond, Max: 5 * time.Second}.Backoff()
	for _, ceiling := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond} {
		d := b.Next() // wait d, then try again; b.Reset() after a success
		fmt.Println(d >= ceiling/2-time.Microsecond && d <= ceiling)
	}
	// Output:
	// true
	// true
	// true
}
