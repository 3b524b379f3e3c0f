package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/topics"
)

// DefaultCheckpointTopic is Config.CheckpointTopic's default.
const DefaultCheckpointTopic = "paystream.sink.checkpoints.v1"

// checkpoint is the value of a checkpoint record, keyed by the relay's
// identity (Identity.Key): the position in the WAL up to which every state
// message is in the state topic, written in the same Kafka transaction as
// the events it covers.
type checkpoint struct {
	// LSN is the end LSN of the last Postgres transaction the Kafka
	// transaction carried (pgoutput's Commit.TransactionEndLSN): the
	// position the relay confirms to the slot.
	LSN pglogrepl.LSN
	// SystemID and Timeline identify the WAL history the LSN belongs to
	// (see history.holds).
	SystemID string
	Timeline int32
	// CommitTime is the commit time of the Postgres transaction ending at
	// LSN, by the server's clock: where `paystream republish` starts after
	// a lost slot. Zero in the checkpoints of earlier relays.
	CommitTime time.Time
}

// checkpointJSON is checkpoint's encoding.
type checkpointJSON struct {
	LSN        string    `json:"lsn"`
	SystemID   string    `json:"system_id"`
	Timeline   int32     `json:"timeline"`
	CommitTime time.Time `json:"commit_time,omitzero"`
}

func (c checkpoint) MarshalJSON() ([]byte, error) {
	return json.Marshal(checkpointJSON{c.LSN.String(), c.SystemID, c.Timeline, c.CommitTime.UTC()})
}

func (c *checkpoint) UnmarshalJSON(b []byte) error {
	var p checkpointJSON
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	lsn, err := pglogrepl.ParseLSN(p.LSN)
	if err != nil {
		return fmt.Errorf("checkpoint lsn: %w", err)
	}
	*c = checkpoint{LSN: lsn, SystemID: p.SystemID, Timeline: p.Timeline, CommitTime: p.CommitTime}
	return nil
}

// history is the WAL history of the server a relay reads: its system, its
// timeline, and where each ancestor timeline ended (the server's timeline
// history file). A promoted standby, or a point-in-time restore, starts a
// new timeline that shares the WAL of its ancestors up to where it left
// them, and nothing after.
type history struct {
	SystemID string
	Timeline int32
	// ends maps each ancestor timeline to its switch point: the first
	// position that is not this history's.
	ends map[int32]pglogrepl.LSN
}

// holds reports whether c is a position of this history: of its system,
// and on its timeline or on an ancestor at or before the switch point. A
// checkpoint of the old primary past the point where the promoted standby
// left it (commits the standby never received), or of the history a
// restore went back from, is not.
func (h history) holds(c checkpoint) bool {
	if c.SystemID != h.SystemID {
		return false
	}
	if c.Timeline == h.Timeline {
		return true
	}
	end, ok := h.ends[c.Timeline]
	return ok && c.LSN <= end
}

// readHistory returns the history of the server conn (a replication
// connection) is on, sys being its IDENTIFY_SYSTEM.
func readHistory(ctx context.Context, conn *pgconn.PgConn, sys pglogrepl.IdentifySystemResult) (history, error) {
	h := history{SystemID: sys.SystemID, Timeline: sys.Timeline}
	if sys.Timeline <= 1 {
		return h, nil
	}
	res, err := pglogrepl.TimelineHistory(ctx, conn, sys.Timeline)
	if err != nil {
		return history{}, fmt.Errorf("read the history of timeline %d: %w", sys.Timeline, err)
	}
	if h.ends, err = parseTimelineHistory(res.Content); err != nil {
		return history{}, fmt.Errorf("timeline %d history file %s: %w", sys.Timeline, res.FileName, err)
	}
	return h, nil
}

// parseTimelineHistory parses a timeline history file: per line an ancestor
// timeline, the LSN where it was left, and a reason; '#' starts a comment.
func parseTimelineHistory(content []byte) (map[int32]pglogrepl.LSN, error) {
	ends := map[int32]pglogrepl.LSN{}
	for line := range strings.Lines(string(content)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return nil, fmt.Errorf("malformed line %q", line)
		}
		tli, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("line %q: timeline: %w", line, err)
		}
		lsn, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %q: switch point: %w", line, err)
		}
		ends[int32(tli)] = lsn
	}
	return ends, nil
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
	return createTopic(ctx, adm, topics.CheckpointSpec(topic, -1), "checkpoint topic")
}

// createTopic creates the topic of spec, unless another client just did;
// what names it in the error ("create checkpoint topic NAME: ...").
func createTopic(ctx context.Context, adm *kadm.Client, spec topics.Spec, what string) error {
	configs := make(map[string]*string, len(spec.Configs))
	for k, v := range spec.Configs {
		configs[k] = &v
	}
	resp, err := adm.CreateTopic(ctx, spec.Partitions, spec.ReplicationFactor, configs, spec.Name)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create %s %s: %w", what, spec.Name, err)
	}
	return nil
}

// checkpointReadTimeout bounds reading the checkpoint topic back. The
// topic is compacted and small, but the read waits for every transaction
// open on it when it started, other relays' included, to end.
const checkpointReadTimeout = time.Minute

// readCheckpoint returns the newest committed checkpoint of h, the history
// of the relay's server, among the records keyed by one of keys (the
// relay's identity, and the slot name of earlier relays), or the zero
// checkpoint when there is none. "Newest" is the largest LSN among the
// checkpoints h holds: a record of another system, of a timeline h does
// not descend from, or of an ancestor past where h left it, is ignored
// however large its LSN.
//
// Call it only after fencing the relay's transactional id: then no
// transaction of an earlier relay is still open. It reads up to the high
// watermark it finds when it starts, with read_committed, so it waits for
// every transaction open on the topic then (another relay's, which can
// hold back the last stable offset below our own newest checkpoint) to
// commit or abort: a checkpoint is never read stale.
//
// opts returns the options of a new client of the given role (see
// Relay.kafkaOpts).
func readCheckpoint(ctx context.Context, log *slog.Logger, opts func(client string, extra ...kgo.Opt) []kgo.Opt,
	topic string, keys []string, h history) (checkpoint, error) {
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
	// The high watermarks, not the last stable offsets: a record below the
	// high watermark may still be in an open transaction.
	ends, err := adm.ListEndOffsets(ctx, topic)
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

	// Bounded: a read that cannot reach the high watermark (a transaction
	// left open by a producer with a long timeout; seen against the
	// embedded kfake broker after a restart) fails, logged, and the relay
	// starts over, rather than standing still unnoticed.
	rctx, cancel := context.WithTimeout(ctx, checkpointReadTimeout)
	defer cancel()
	slow := time.AfterFunc(5*time.Second, func() {
		log.Warn("reading the checkpoint topic waits for a transaction open on it (another relay's?) to end",
			"topic", topic, "partition_offsets_to_reach", fmt.Sprint(todo))
	})
	defer slow.Stop()
	var best checkpoint
	for len(todo) > 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return checkpoint{}, fmt.Errorf("read checkpoint topic up to its high watermarks %v (partition → offset still to reach): %w", todo, err)
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
			if rec.Attrs.IsControl() || !slices.Contains(keys, string(rec.Key)) {
				return
			}
			var c checkpoint
			if err := json.Unmarshal(rec.Value, &c); err != nil {
				decodeErr = fmt.Errorf("checkpoint at offset %d: %w", rec.Offset, err)
				return
			}
			if h.holds(c) && c.LSN >= best.LSN {
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
func checkpointRecord(topic, key string, c checkpoint) (*kgo.Record, error) {
	v, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: v}, nil
}
