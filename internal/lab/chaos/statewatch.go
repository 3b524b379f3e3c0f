package chaos

import (
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/lab/topicwatch"
)

// stateWatcher reads the state topic read_committed from its start and
// counts the distinct event ids it has seen, so the harness knows when the
// relay has published what the processors committed. Verify does the real
// check of the topic afterwards.
type stateWatcher struct {
	tw   *topicwatch.Watcher
	mu   sync.Mutex
	seen map[string]struct{}
}

func watchState(brokers []string, topic string) (*stateWatcher, error) {
	w := &stateWatcher{seen: map[string]struct{}{}}
	tw, err := topicwatch.Start(brokers, topic, w.record, kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("state topic: %w", err)
	}
	w.tw = tw
	return w, nil
}

// record notes the event ids of one fetch's records.
func (w *stateWatcher) record(fetches kgo.Fetches) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fetches.EachRecord(func(r *kgo.Record) {
		for _, h := range r.Headers {
			if h.Key == envelope.HeaderEventID {
				w.seen[string(h.Value)] = struct{}{}
			}
		}
	})
}

// distinct is the number of distinct state event ids seen so far.
func (w *stateWatcher) distinct() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen)
}

func (w *stateWatcher) close() { w.tw.Close() }
