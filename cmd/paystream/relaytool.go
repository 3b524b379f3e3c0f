package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/paystream/paystream/sink"
)

// relayToolFlags are the flags of the commands that publish to the state
// topics as the sink's relay does, from outside it (backfill, republish):
// they take the relay's slot and transactional id, so they must name its
// Kafka and Postgres, topics, checkpoint topic, state format and
// deployment exactly as the sink's flags do.
type relayToolFlags struct {
	kafkaFlags
	dbFlags
	topicFlags
	checkpointFlags
	stateFormatFlags
	Deployment string `help:"The sink's --deployment, if it has one." env:"PAYSTREAM_DEPLOYMENT" placeholder:"NAME"`
}

// relayTool is what such a command works with: the relay's Kafka
// settings, a pool and the relay's state format.
type relayTool struct {
	brokers   []string
	kafkaOpts []kgo.Opt
	pool      *pgxpool.Pool
	format    sink.Format
	registry  *sr.Client
}

// open connects to Kafka and Postgres (connect) and reads the state
// format; the caller closes the pool.
func (f relayToolFlags) open(ctx context.Context, e *env) (relayTool, error) {
	brokers, kafkaOpts, pool, err := connect(ctx, e, f.kafkaFlags, f.dbFlags)
	if err != nil {
		return relayTool{}, err
	}
	format, registry, err := f.stateFormat()
	if err != nil {
		pool.Close()
		return relayTool{}, err
	}
	return relayTool{brokers: brokers, kafkaOpts: kafkaOpts, pool: pool, format: format, registry: registry}, nil
}

// throttled returns a progress callback that passes a call on to show at
// most once every interval, and always the last one (done == total): a
// long run's progress line is rewritten a few times a second, not at
// every Kafka transaction.
func throttled[N int | int64](every time.Duration, show func(done, total N)) func(done, total N) {
	var last time.Time
	return func(done, total N) {
		if time.Since(last) > every || done == total {
			show(done, total)
			last = time.Now()
		}
	}
}
