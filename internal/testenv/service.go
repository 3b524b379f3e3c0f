package testenv

import (
	"context"
	"sync"
	"testing"
)

// Service is a component's Run loop (a processor, a relay) running in the
// test's process.
type Service struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Start runs run in a goroutine until Stop or the end of the test, and
// fails the test, naming the component name, if run returns an error. The
// test ends only once run returned: a component left running would act on
// the next test's topics and schema.
func Start(t testing.TB, name string, run func(context.Context) error) *Service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := run(ctx); err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
	}()
	t.Cleanup(s.Stop)
	return s
}

// Stop cancels the component's context and waits for Run to return (it
// drains first). Calling it again does nothing.
func (s *Service) Stop() {
	s.once.Do(func() {
		s.cancel()
		<-s.done
	})
}
