package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/paystream/paystream/internal/dlq"
	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/sink"
)

// dlqSection is the stuck page's dead-lettered webhooks: the newest
// records written within the window.
type dlqSection struct {
	// Err says why the DLQ could not be read; the rest of the page still
	// shows.
	Err     string
	Window  time.Duration
	Scanned int64
	// Records are the newest matching records, newest first.
	Records []dlqRow
	// More is how many older records of the window are not shown.
	More int
}

type dlqRow struct {
	Position  string
	Written   time.Time
	Source    string
	EventID   string
	Reason    string
	BodyBytes int64
	Decode    string
	Replayed  *dlq.Marker
	// Command is the `paystream` command that replays the record: shown,
	// never run by the console.
	Command string
}

func (s *Server) readDLQ(ctx context.Context) dlqSection {
	sec := dlqSection{Window: s.cfg.DLQWindow}
	if s.dlq == nil {
		sec.Err = "Kafka is not configured (--kafka-brokers)"
		return sec
	}
	keep := s.cfg.PageSize
	type kept struct {
		rec       *dlq.Record
		bodyBytes int
	}
	var ring []kept
	total := 0
	err := s.dlq.Scan(ctx, dlq.Filter{Since: s.cfg.Now().Add(-s.cfg.DLQWindow)}, func(p dlq.Progress) { sec.Scanned = p.Scanned },
		func(rec *dlq.Record) error {
			total++
			k := kept{rec: rec, bodyBytes: len(rec.Envelope.Body)}
			rec.Value, rec.Envelope.Body = nil, nil // bodies are never shown
			if len(ring) == keep {
				ring = ring[1:]
			}
			ring = append(ring, k)
			return nil
		})
	if err != nil {
		if errors.Is(err, dlq.ErrNoTopic) {
			sec.Err = fmt.Sprintf("the DLQ topic %s does not exist", s.cfg.DLQTopic)
		} else {
			sec.Err = "read the DLQ topic: " + err.Error()
		}
		return sec
	}
	replays, err := s.dlq.Replays(ctx)
	if err != nil {
		sec.Err = "read the replays topic: " + err.Error()
	}
	slices.SortFunc(ring, func(a, b kept) int { return b.rec.Timestamp.Compare(a.rec.Timestamp) })
	for _, k := range ring {
		rec := k.rec
		row := dlqRow{Position: rec.Position.String(), Written: rec.Timestamp, Decode: rec.DecodeError,
			Command: s.replayCommand(rec.Position)}
		if rec.DecodeError == "" {
			row.Source, row.Reason, row.EventID = rec.Envelope.Source, rec.Envelope.Reason, rec.EventID()
			row.BodyBytes = int64(k.bodyBytes)
		}
		if m, ok := replays[rec.Position]; ok {
			row.Replayed = &m
		}
		sec.Records = append(sec.Records, row)
	}
	sec.More = total - len(ring)
	return sec
}

// replayCommand is the command that replays the DLQ record at pos, as
// `paystream dlq replay` takes it (the sources file from
// PAYSTREAM_SOURCES, or --sources).
func (s *Server) replayCommand(pos dlq.Position) string {
	cmd := "paystream dlq replay " + pos.String()
	if s.cfg.DLQTopic != "paystream.webhooks.dlq.v1" {
		cmd += " --dlq-topic " + s.cfg.DLQTopic
	}
	if s.cfg.RawTopic != "paystream.webhooks.raw.v1" {
		cmd += " --raw-topic " + s.cfg.RawTopic
	}
	return cmd + " --sources " + s.cfg.SourcesFile
}

type healthPage struct {
	Now        time.Time
	Group      string
	Topic      string
	Partitions []partitionRow
	TotalLag   int64
	KafkaErr   string
	DBErr      string
	Slot       store.SlotStatus
	SlotErr    string
	Retention  retentionView
	RetErr     string
}

type partitionRow struct {
	Partition int32
	// Owner is the group member Kafka assigned the partition to.
	Owner      string
	OwnerEpoch int64
	Stored     int64
	HasStored  bool
	End        int64
	HasEnd     bool
	Lag        int64
	LastCommit time.Time
}

type retentionView struct {
	Oldest, Newest time.Time
	Count          int
	// AheadDays is how many days past today the newest partition is.
	AheadDays   int
	DefaultRows int64
	// Warnings say what looks wrong.
	Warnings []string
}

// partitionsAhead is how many days ahead retention creates partitions by
// default (processor.RetentionConfig.PartitionsAhead).
const partitionsAhead = 3

func (s *Server) health(r *http.Request) (any, error) {
	ctx := r.Context()
	p := healthPage{Now: s.cfg.Now(), Group: s.cfg.Group, Topic: s.cfg.RawTopic}
	rows := map[int32]*partitionRow{}
	row := func(partition int32) *partitionRow {
		if rows[partition] == nil {
			rows[partition] = &partitionRow{Partition: partition}
		}
		return rows[partition]
	}
	stored, err := store.PartitionOffsets(ctx, s.pool, s.cfg.Group, s.cfg.RawTopic)
	if err != nil {
		p.DBErr = err.Error()
	}
	for _, o := range stored {
		pr := row(o.Partition)
		pr.Stored, pr.HasStored, pr.OwnerEpoch, pr.LastCommit = o.NextOffset, true, o.OwnerEpoch, o.UpdatedAt
	}
	if s.adm == nil {
		p.KafkaErr = "Kafka is not configured (--kafka-brokers): no end offsets, lag or owners"
	} else if err := s.kafkaHealth(ctx, row); err != nil {
		p.KafkaErr = err.Error()
	}
	for _, pr := range rows {
		if pr.HasEnd {
			pr.Lag = max(pr.End-max(pr.Stored, 0), 0)
			p.TotalLag += pr.Lag
		}
		p.Partitions = append(p.Partitions, *pr)
	}
	slices.SortFunc(p.Partitions, func(a, b partitionRow) int { return int(a.Partition - b.Partition) })

	if name, err := sink.Slot(ctx, s.pool); err != nil {
		p.SlotErr = err.Error()
	} else if p.Slot, err = store.ReadSlot(ctx, s.pool, name); err != nil {
		p.SlotErr = err.Error()
	}

	if v, err := store.ReadRetention(ctx, s.pool); err != nil {
		p.RetErr = err.Error()
	} else {
		p.Retention = retentionOf(v, p.Now)
	}
	return p, nil
}

// kafkaHealth fills each partition's end offset and owner.
func (s *Server) kafkaHealth(ctx context.Context, row func(int32) *partitionRow) error {
	ends, err := s.adm.ListEndOffsets(ctx, s.cfg.RawTopic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("list end offsets of %s: %w", s.cfg.RawTopic, err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			pr := row(o.Partition)
			pr.End, pr.HasEnd = o.Offset, true
		}
	})
	groups, err := s.adm.DescribeGroups(ctx, s.cfg.Group)
	if err == nil {
		err = groups.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return nil // no member has joined: no owner
	}
	if err != nil {
		return fmt.Errorf("describe group %s: %w", s.cfg.Group, err)
	}
	g := groups[s.cfg.Group]
	for _, m := range g.Members {
		a, ok := m.Assigned.AsConsumer()
		if !ok {
			continue
		}
		who := m.ClientID + "@" + strings.TrimPrefix(m.ClientHost, "/")
		if m.InstanceID != nil {
			who = *m.InstanceID + " (" + who + ")"
		}
		for _, t := range a.Topics {
			if t.Topic != s.cfg.RawTopic {
				continue
			}
			for _, partition := range t.Partitions {
				row(partition).Owner = who
			}
		}
	}
	return nil
}

// retentionOf reads what retention left: its partitions ahead tell that
// a run created them, its oldest partition that runs drop what expired.
func retentionOf(v store.RetentionView, now time.Time) retentionView {
	out := retentionView{Count: len(v.Partitions), DefaultRows: v.DefaultRows}
	today := now.UTC().Truncate(24 * time.Hour)
	if len(v.Partitions) == 0 {
		out.Warnings = append(out.Warnings, "deliveries has no daily partition: every row goes to deliveries_default; run `paystream retention`")
		return out
	}
	out.Oldest, out.Newest = v.Partitions[0].Day, v.Partitions[len(v.Partitions)-1].Day
	out.AheadDays = int(out.Newest.Sub(today).Hours() / 24)
	if out.AheadDays < 1 {
		out.Warnings = append(out.Warnings, fmt.Sprintf("no partition for tomorrow: retention (which creates %d days ahead) has not run for %d days or more",
			partitionsAhead, partitionsAhead-out.AheadDays))
	}
	if v.DefaultRows > 0 {
		out.Warnings = append(out.Warnings, fmt.Sprintf("about %d rows in deliveries_default (days without a partition): retention moves them out", v.DefaultRows))
	}
	return out
}
