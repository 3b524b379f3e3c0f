package testenv

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestEventually(t *testing.T) {
	t.Parallel()

	t.Run("ReturnsOnceTheConditionHolds", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		Eventually(t, 5*time.Second, func() bool { return calls.Add(1) == 4 }, "fourth call")
		if n := calls.Load(); n != 4 {
			t.Fatalf("cond called %d times, want 4", n)
		}
	})

	t.Run("WorksInCleanupAfterTheTestsContextIsDone", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		t.Cleanup(func() {
			if t.Context().Err() == nil {
				t.Error("test context still live in Cleanup; this test checks nothing")
			}
			Eventually(t, 5*time.Second, func() bool { return calls.Add(1) == 3 }, "third call")
			if n := calls.Load(); n != 3 {
				t.Errorf("cond called %d times, want 3", n)
			}
		})
	})

	t.Run("FailsWithTheMessageAfterTheTimeout", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		var calls atomic.Int32
		fatals, _ := runFake(t, func(tb testing.TB) {
			Eventually(tb, 100*time.Millisecond, func() bool { calls.Add(1); return false }, "%d payments stored", 3)
		})
		if elapsed := time.Since(start); elapsed < 100*time.Millisecond {
			t.Errorf("gave up after %s, before the 100ms timeout", elapsed)
		}
		if len(fatals) != 1 || !strings.Contains(fatals[0], "condition not met within 100ms") || !strings.Contains(fatals[0], "3 payments stored") {
			t.Fatalf("fatals = %q, want one naming the timeout and '3 payments stored'", fatals)
		}
		// Backoff: from 5ms doubling, 100ms allows a handful of checks, not hundreds.
		if n := calls.Load(); n < 3 || n > 10 {
			t.Errorf("cond called %d times in 100ms, want a few with backoff", n)
		}
	})
}

func TestWaitFor(t *testing.T) {
	t.Parallel()

	t.Run("ReturnsOnceFnSucceeds", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		WaitFor(t, 5*time.Second, func() error {
			if calls.Add(1) < 3 {
				return errors.New("not yet")
			}
			return nil
		})
		if n := calls.Load(); n != 3 {
			t.Fatalf("fn called %d times, want 3", n)
		}
	})

	t.Run("FailsWithTheLastError", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		fatals, _ := runFake(t, func(tb testing.TB) {
			WaitFor(tb, 50*time.Millisecond, func() error { return fmt.Errorf("attempt %d failed", calls.Add(1)) })
		})
		want := fmt.Sprintf("attempt %d failed", calls.Load())
		if len(fatals) != 1 || !strings.Contains(fatals[0], "not done within 50ms") || !strings.Contains(fatals[0], want) {
			t.Fatalf("fatals = %q, want one naming the timeout and the last error %q", fatals, want)
		}
	})
}

func TestMessage(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		in   []any
		want string
	}{
		{nil, "(no description)"},
		{[]any{"plain"}, "plain"},
		{[]any{"%d of %s", 2, "x"}, "2 of x"},
		{[]any{42}, "42"},
	} {
		if got := message(tt.in); got != tt.want {
			t.Errorf("message(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
