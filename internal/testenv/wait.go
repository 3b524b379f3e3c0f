package testenv

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// Poll delays: the first check is immediate, then the delay doubles from
// minPoll up to maxPoll.
const (
	minPoll = 5 * time.Millisecond
	maxPoll = 250 * time.Millisecond
)

// Eventually polls cond, with backoff, until it returns true, and fails
// the test if it has not within timeout. msgAndArgs, a format string and
// its arguments, says what was awaited:
//
//	testenv.Eventually(t, 10*time.Second, func() bool { return count() == 3 }, "3 payments stored")
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	var polls int
	if poll(timeout, func() error {
		polls++
		if cond() {
			return nil
		}
		return errFalse
	}) != nil {
		t.Fatalf("testenv: condition not met within %s (%d checks): %s", timeout, polls, message(msgAndArgs))
	}
}

// WaitFor polls fn, with backoff, until it returns nil, and fails the test
// with fn's last error if it has not within timeout. It suits conditions
// that can say why they are not met yet:
//
//	testenv.WaitFor(t, 10*time.Second, func() error {
//		if n := count(); n != 3 {
//			return fmt.Errorf("%d payments stored, want 3", n)
//		}
//		return nil
//	})
func WaitFor(t testing.TB, timeout time.Duration, fn func() error) {
	t.Helper()
	var polls int
	if err := poll(timeout, func() error { polls++; return fn() }); err != nil {
		t.Fatalf("testenv: not done within %s (%d checks): %v", timeout, polls, err)
	}
}

var errFalse = errors.New("condition false")

// poll calls fn until it returns nil or the timeout passes, and returns
// fn's last error. fn always runs at least once, and once more at the
// deadline. It ignores the test's context, which is already done when a
// Cleanup waits for something to drain.
func poll(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for delay := minPoll; ; delay = min(2*delay, maxPoll) {
		err := fn()
		if err == nil {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return err
		}
		time.Sleep(min(delay, left))
	}
}

func message(msgAndArgs []any) string {
	switch {
	case len(msgAndArgs) == 0:
		return "(no description)"
	case len(msgAndArgs) == 1:
		return fmt.Sprint(msgAndArgs[0])
	default:
		if format, ok := msgAndArgs[0].(string); ok {
			return fmt.Sprintf(format, msgAndArgs[1:]...)
		}
		return fmt.Sprint(msgAndArgs...)
	}
}
