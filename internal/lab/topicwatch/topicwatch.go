// Package topicwatch reads a topic from its start in the background, as a
// data team's consumer does (read_committed), and hands each fetch to the
// caller. The chaos suite and the end-to-end bench both watch the state
// topic this way; what each keeps of the records is its own.
package topicwatch

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Watcher polls one topic until Close.
type Watcher struct {
	cl   *kgo.Client
	done chan struct{}
}

// Start consumes topic on brokers from its start, read_committed (so a
// record counts once its Kafka transaction commits, not when it is
// written), and calls onFetch with every fetch, from one goroutine. opts
// add to the client's options, e.g. how long a fetch may wait.
func Start(brokers []string, topic string, onFetch func(kgo.Fetches), opts ...kgo.Opt) (*Watcher, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("consumer of %s: %w", topic, err)
	}
	w := &Watcher{cl: cl, done: make(chan struct{})}
	go w.run(onFetch)
	return w, nil
}

func (w *Watcher) run(onFetch func(kgo.Fetches)) {
	defer close(w.done)
	for {
		fetches := w.cl.PollFetches(context.Background())
		if fetches.IsClientClosed() {
			return
		}
		onFetch(fetches)
	}
}

// Close stops the consumer and returns once onFetch will not be called
// again.
func (w *Watcher) Close() {
	w.cl.Close()
	<-w.done
}
