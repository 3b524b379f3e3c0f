package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/topics"
)

// DefaultCheckpointTopic is Config.CheckpointTopic's default.
const DefaultCheckpointTopic = "paystream.sink.checkpoints.v1"

// checkpoint is the value of a checkpoint record, keyed by slot name: the
// position in the WAL up to which every state message is in the state topic,
// written in the same Kafka transaction as the events it covers.
type checkpoint struct {
	// LSN is the end LSN of the last Postgres transaction the Kafka
	// transaction carried (pgoutput's Commit.TransactionEndLSN): the
	// position the relay confirms to the slot.
	LSN pglogrepl.LSN `json:"lsn"`
	// SystemID and Timeline identify the WAL history the LSN belongs to.
	// A checkpoint of another history (the database restored from a
	// backup, a new cluster) says nothing about this one's positions and
	// is ignored.
	SystemID string `json:"system_id"`
	Timeline int32  `json:"timeline"`
}

func (c checkpoint) MarshalJSON() ([]byte, error) {
	type plain struct {
		LSN      string `json:"lsn"`
		SystemID string `json:"system_id"`
		Timeline int32  `json:"timeline"`
	}
	return json.Marshal(plain{c.LSN.String(), c.SystemID, c.Timeline})
}

func (c *checkpoint) UnmarshalJSON(b []byte) error {
	var p struct {
		LSN      string `json:"lsn"`
		SystemID string `json:"system_id"`
		Timeline int32  `json:"timeline"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	lsn, err := pglogrepl.ParseLSN(p.LSN)
	if err != nil {
		return fmt.Errorf("checkpoint lsn: %w", err)
	}
	*c = checkpoint{LSN: lsn, SystemID: p.SystemID, Timeline: p.Timeline}
	return nil
}

// ensureCheckpointTopic creates the checkpoint topic as paystream migrate
// does (topics.CheckpointSpec: compacted, one partition) unless it exists,
// so a relay also runs where migrate ran without brokers.
func ensureCheckpointTopic(ctx context.Context, adm *kadm.Client, topic string) error {
	listed, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("look up checkpoint topic: %w", err)
	}
	if listed.Has(topic) {
		return nil
	}
	spec := topics.CheckpointSpec(topic, -1)
	configs := make(map[string]*string, len(spec.Configs))
	for k, v := range spec.Configs {
		configs[k] = &v
	}
	resp, err := adm.CreateTopic(ctx, spec.Partitions, spec.ReplicationFactor, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create checkpoint topic %s: %w", topic, err)
	}
	return nil
}

// checkpointReadTimeout bounds reading the checkpoint topic back: it is
// compacted and small, so this is far more than a healthy read takes.
const checkpointReadTimeout = 30 * time.Second

// readCheckpoint returns the newest committed checkpoint of slot, or the
// zero checkpoint when there is none. Call it only after fencing the
// relay's transactional id: then no transaction of an earlier relay is
// still open, and the committed end of the topic read here includes every
// checkpoint that will ever commit before ours.
//
// opts returns the options of a new client of the given role (see
// Relay.kafkaOpts).
func readCheckpoint(ctx context.Context, opts func(client string, extra ...kgo.Opt) []kgo.Opt, topic, slot string) (checkpoint, error) {
	admCl, err := kgo.NewClient(opts(ClientAdmin)...)
	if err != nil {
		return checkpoint{}, fmt.Errorf("kafka client: %w", err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return checkpoint{}, fmt.Errorf("list checkpoint start offsets: %w", err)
	}
	// The last stable offsets: everything below is committed or aborted.
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return checkpoint{}, fmt.Errorf("list checkpoint end offsets: %w", err)
	}
	todo := map[int32]int64{} // partition → offset to read up to
	from := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(topic, o.Partition); ok && o.Offset > s.Offset {
			todo[o.Partition] = o.Offset
			from[o.Partition] = kgo.NewOffset().At(s.Offset)
		}
	})
	if len(todo) == 0 {
		return checkpoint{}, nil
	}
	cl, err := kgo.NewClient(opts(ClientCheckpoint,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Commit and abort markers are returned too, so the read can tell
		// it reached the end when the last records are markers.
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return checkpoint{}, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()

	// Bounded: a read that stops short of the last stable offset (seen
	// against the embedded kfake broker after a restart) fails, logged,
	// and the relay starts over, rather than standing still unnoticed.
	rctx, cancel := context.WithTimeout(ctx, checkpointReadTimeout)
	defer cancel()
	var best checkpoint
	for len(todo) > 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return checkpoint{}, fmt.Errorf("read checkpoint topic up to its last stable offsets %v (partition → offset still to reach): %w", todo, err)
		}
		var fetchErr error
		fs.EachError(func(_ string, p int32, err error) {
			fetchErr = fmt.Errorf("read checkpoint topic partition %d: %w", p, err)
		})
		if fetchErr != nil {
			return checkpoint{}, fetchErr
		}
		var decodeErr error
		fs.EachRecord(func(rec *kgo.Record) {
			if end, ok := todo[rec.Partition]; ok && rec.Offset+1 >= end {
				delete(todo, rec.Partition)
			}
			if rec.Attrs.IsControl() || string(rec.Key) != slot {
				return
			}
			var c checkpoint
			if err := json.Unmarshal(rec.Value, &c); err != nil {
				decodeErr = fmt.Errorf("checkpoint at offset %d: %w", rec.Offset, err)
				return
			}
			if c.LSN > best.LSN {
				best = c
			}
		})
		if decodeErr != nil {
			return checkpoint{}, decodeErr
		}
	}
	return best, nil
}

// checkpointRecord is the record that carries c in a Kafka transaction.
func checkpointRecord(topic, slot string, c checkpoint) (*kgo.Record, error) {
	v, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	return &kgo.Record{Topic: topic, Key: []byte(slot), Value: v}, nil
}
