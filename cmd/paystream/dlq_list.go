package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/paystream/paystream/internal/dlq"
)

type dlqListCmd struct {
	dlqFlags
	Source string `help:"Only this source's records."`
	Since  string `help:"Only records written since this time: RFC 3339 (2026-11-29T18:00:00Z) or a duration ago (24h)." placeholder:"TIME|DURATION"`
	Reason string `help:"Only records whose reason contains this text (case-insensitive)."`
}

func (c *dlqListCmd) Help() string {
	return `Reads the DLQ topic from its start (from --since when set) to its end as it was when the command
started, and prints one line per matching record: its position (PARTITION/OFFSET, what show and
replay take), when it was written, its source, the event id found in its kept headers or body, the
reason ingest could not process it and whether it was replayed. --json prints one JSON object per
line. Progress goes to stderr on long scans.

  paystream dlq list --source acme --since 24h --reason "unknown type"`
}

// dlqListItem is one line of dlq list --json.
type dlqListItem struct {
	dlq.Position
	Timestamp  time.Time   `json:"timestamp"`
	Source     string      `json:"source,omitempty"`
	Driver     string      `json:"driver,omitempty"`
	ReceivedAt *time.Time  `json:"received_at,omitempty"`
	EventID    string      `json:"event_id,omitempty"`
	Reason     string      `json:"reason,omitempty"`
	BodyBytes  int         `json:"body_bytes"`
	DecodeErr  string      `json:"decode_error,omitempty"`
	Replayed   *dlq.Marker `json:"replayed,omitempty"`
}

func listItem(rec *dlq.Record, replays map[dlq.Position]dlq.Marker) dlqListItem {
	it := dlqListItem{Position: rec.Position, Timestamp: rec.Timestamp, DecodeErr: rec.DecodeError}
	if rec.DecodeError == "" {
		env := rec.Envelope
		it.Source, it.Driver, it.Reason, it.BodyBytes = env.Source, env.Driver, env.Reason, len(env.Body)
		at := env.ReceivedAt
		it.ReceivedAt = &at
		it.EventID = rec.EventID()
	}
	if m, ok := replays[rec.Position]; ok {
		it.Replayed = &m
	}
	return it
}

func (c *dlqListCmd) Run(ctx context.Context, e *env) error {
	since, err := parseSince(c.Since, time.Now())
	if err != nil {
		return err
	}
	tool, err := c.open(ctx, e.log)
	if err != nil {
		return err
	}
	defer tool.Close()
	return c.run(ctx, tool, dlq.Filter{Source: c.Source, Since: since, Reason: c.Reason}, os.Stdout)
}

func (c *dlqListCmd) run(ctx context.Context, tool *dlq.Tool, f dlq.Filter, stdout io.Writer) error {
	replays, err := tool.Replays(ctx)
	if err != nil {
		return dlqError(err, c.DLQTopic)
	}
	progress, done := c.progress("dlq list")
	enc := json.NewEncoder(stdout)
	w := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	if !c.JSON {
		fmt.Fprintln(w, "position\twritten\tsource\tevent id\treplayed\treason")
	}
	n := 0
	err = tool.Scan(ctx, f, progress, func(rec *dlq.Record) error {
		n++
		it := listItem(rec, replays)
		if c.JSON {
			return enc.Encode(it)
		}
		replayed := "no"
		if it.Replayed != nil {
			replayed = "yes"
		}
		reason := it.Reason
		if it.DecodeErr != "" {
			reason = "(not a DLQ envelope: " + it.DecodeErr + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", it.Position, it.Timestamp.Format(time.RFC3339), it.Source,
			it.EventID, replayed, oneLine(reason, 120))
		return nil
	})
	done()
	if err != nil {
		return dlqError(err, c.DLQTopic)
	}
	if c.JSON {
		return nil
	}
	if n == 0 {
		fmt.Fprintln(stdout, "no matching dead-lettered webhooks")
		return nil
	}
	return w.Flush()
}
