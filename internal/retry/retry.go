// Package retry is paystream's one policy for retrying an operation until
// it works: exponential backoff with jitter, on
// github.com/cenkalti/backoff/v5. The loops that retry without giving up —
// a processor's batch transaction and partition claim, the sink's relay —
// take their waits from a [Backoff], each with its own bounds.
//
// Jitter is what the hand-written doubling before it lacked: processes
// that failed together (a database restart, a broker's leader election)
// came back in step, every time, at the same instants.
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy bounds the waits between attempts. The n-th wait (n from 0) is
// drawn uniformly between half and all of min(Initial·2ⁿ, Max): never
// longer than the doubling without jitter would wait, never shorter than
// half of it.
type Policy struct {
	// Initial is the longest first wait. Defaults to 100ms.
	Initial time.Duration
	// Max is the longest wait. Defaults to 5s; an Initial above it is
	// lowered to it.
	Max time.Duration
}

// Backoff is one retry loop's state under a [Policy]. It is not safe for
// concurrent use.
type Backoff struct {
	exp backoff.ExponentialBackOff
	max time.Duration
}

// jitter is backoff's randomization factor giving waits in [d/2, d]: it
// draws from [c·(1-f), c·(1+f)] around its interval c, so c = 3d/4 and
// f = 1/3.
const jitter = 1.0 / 3

// Backoff returns a new backoff under p, at its first wait.
func (p Policy) Backoff() *Backoff {
	if p.Max <= 0 {
		p.Max = 5 * time.Second
	}
	if p.Initial <= 0 {
		p.Initial = 100 * time.Millisecond
	}
	p.Initial = min(p.Initial, p.Max)
	b := &Backoff{
		exp: backoff.ExponentialBackOff{
			InitialInterval:     p.Initial * 3 / 4,
			RandomizationFactor: jitter,
			Multiplier:          2,
			MaxInterval:         p.Max * 3 / 4,
		},
		max: p.Max,
	}
	b.exp.Reset()
	return b
}

// Next returns the wait before the next attempt and doubles the waits
// after it, up to Max.
func (b *Backoff) Next() time.Duration {
	return min(b.exp.NextBackOff(), b.max)
}

// Again returns a wait drawn as Next draws it, without lengthening the
// waits after it: for polling while something expected holds (a lock its
// owner is about to release), which is no reason to back off further.
func (b *Backoff) Again() time.Duration {
	exp := b.exp
	return min(exp.NextBackOff(), b.max)
}

// Reset starts the waits over from Initial.
func (b *Backoff) Reset() {
	b.exp.Reset()
}
