package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
)

// stateWatcher reads the state topic read_committed from its start and
// counts the distinct event ids it has seen, so the harness knows when the
// relay has published what the processors committed. Verify does the real
// check of the topic afterwards.
type stateWatcher struct {
	cl   *kgo.Client
	done chan struct{}
	mu   sync.Mutex
	seen map[string]struct{}
}

func watchState(brokers []string, topic string) (*stateWatcher, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("state topic consumer: %w", err)
	}
	w := &stateWatcher{cl: cl, done: make(chan struct{}), seen: map[string]struct{}{}}
	go w.run()
	return w, nil
}

func (w *stateWatcher) run() {
	defer close(w.done)
	for {
		fetches := w.cl.PollFetches(context.Background())
		if fetches.IsClientClosed() {
			return
		}
		w.mu.Lock()
		fetches.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == envelope.HeaderEventID {
					w.seen[string(h.Value)] = struct{}{}
				}
			}
		})
		w.mu.Unlock()
	}
}

// distinct is the number of distinct state event ids seen so far.
func (w *stateWatcher) distinct() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen)
}

func (w *stateWatcher) close() {
	w.cl.Close()
	<-w.done
}
