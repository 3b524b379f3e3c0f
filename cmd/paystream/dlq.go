package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/paystream/paystream/internal/dlq"
)

type dlqCmd struct {
	List   dlqListCmd   `cmd:"" help:"List dead-lettered webhooks, filtered by source, time and reason."`
	Show   dlqShowCmd   `cmd:"" help:"Show one dead-lettered webhook: position, headers, reason, envelope (the body only with --body)."`
	Replay dlqReplayCmd `cmd:"" help:"Re-parse a dead-lettered webhook with its source's driver and produce it to the raw topic, once."`
}

// dlqFlags are shared by the dlq subcommands.
type dlqFlags struct {
	kafkaFlags
	DLQTopic     string `help:"Dead-letter topic." default:"${dlq_topic}" env:"PAYSTREAM_DLQ_TOPIC"`
	ReplaysTopic string `help:"Compacted topic recording which DLQ records were replayed (created by the first replay)." default:"paystream.webhooks.dlq-replays.v1" env:"PAYSTREAM_DLQ_REPLAYS_TOPIC"`
	JSON         bool   `help:"Print JSON instead of text." name:"json"`
	Quiet        bool   `help:"No progress on stderr." short:"q"`
}

func (f *dlqFlags) open(ctx context.Context, log *slog.Logger, opts ...func(*dlq.Config)) (*dlq.Tool, error) {
	brokers, kafkaOpts, err := f.kafka(log)
	if err != nil {
		return nil, err
	}
	if err := f.checkKafka(ctx, log, brokers); err != nil {
		return nil, err
	}
	cfg := dlq.Config{Brokers: brokers, KafkaOpts: kafkaOpts, DLQTopic: f.DLQTopic, ReplaysTopic: f.ReplaysTopic}
	for _, o := range opts {
		o(&cfg)
	}
	return dlq.Open(cfg)
}

// progress returns a dlq scan progress callback writing to stderr (nil when
// quiet), and a func that clears its line when the scan is over.
func (f *dlqFlags) progress(what string) (func(dlq.Progress), func()) {
	if f.Quiet {
		return nil, func() {}
	}
	return scanProgress(os.Stderr, isTerminal(os.Stderr), what, time.Now)
}

// scanProgress prints how far a scan got: one line rewritten in place at
// most twice a second on a terminal, a plain line at most every 5 seconds
// otherwise, nothing for a scan that ends before the first interval.
func scanProgress(w io.Writer, tty bool, what string, now func() time.Time) (func(dlq.Progress), func()) {
	interval := 5 * time.Second
	if tty {
		interval = 500 * time.Millisecond
	}
	start := now()
	last := start
	printed := false
	report := func(p dlq.Progress) {
		if t := now(); t.Sub(last) >= interval {
			last, printed = t, true
			pct := 100.0
			if p.Total > 0 {
				pct = 100 * float64(p.Scanned) / float64(p.Total)
			}
			line := fmt.Sprintf("%s: scanned %d of %d offsets (%.0f%%), %d matched, %.0fs", what, p.Scanned, p.Total, pct, p.Matched, t.Sub(start).Seconds())
			if tty {
				fmt.Fprint(w, "\r\x1b[K"+line)
			} else {
				fmt.Fprintln(w, line)
			}
		}
	}
	done := func() {
		if tty && printed {
			fmt.Fprint(w, "\r\x1b[K")
		}
	}
	return report, done
}

// parseSince parses --since: empty, an RFC 3339 time or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2026-11-29T18:00:00Z) or a positive duration (24h)", s)
}

// oneLine makes s fit on one line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// dlqError adds what to do to the errors an operator can fix.
func dlqError(err error, topic string) error {
	if errors.Is(err, dlq.ErrNoTopic) {
		return fmt.Errorf("%w (is --dlq-topic %s right? paystream migrate creates it)", err, topic)
	}
	return err
}

// dlqTarget names one DLQ record: by position or by event id.
type dlqTarget struct {
	Position string `arg:"" optional:"" help:"The record's PARTITION/OFFSET, as dlq list prints it."`
	EventID  string `help:"Find the record by the event id in its kept headers or body instead (scans the topic)." placeholder:"ID"`
}

// find returns the position of the record named by t.
func (t *dlqTarget) find(ctx context.Context, tool *dlq.Tool, f *dlqFlags) (dlq.Position, error) {
	switch {
	case t.Position != "" && t.EventID != "":
		return dlq.Position{}, errors.New("name the record by PARTITION/OFFSET or by --event-id, not both")
	case t.Position != "":
		return dlq.ParsePosition(t.Position)
	case t.EventID == "":
		return dlq.Position{}, errors.New("name the record: PARTITION/OFFSET (see paystream dlq list) or --event-id ID")
	}
	progress, done := f.progress("dlq: looking for event " + t.EventID)
	var found []dlq.Position
	err := tool.Scan(ctx, dlq.Filter{EventID: t.EventID}, progress, func(rec *dlq.Record) error {
		found = append(found, rec.Position)
		return nil
	})
	done()
	switch {
	case err != nil:
		return dlq.Position{}, dlqError(err, f.DLQTopic)
	case len(found) == 0:
		return dlq.Position{}, fmt.Errorf("no record of %s carries event id %q", f.DLQTopic, t.EventID)
	case len(found) > 1:
		// The gateway dead-lettered the same event more than once (its
		// retries): any one will do for show, but replay must be told.
		return found[0], &ambiguousError{id: t.EventID, at: found}
	}
	return found[0], nil
}

type ambiguousError struct {
	id string
	at []dlq.Position
}

func (e *ambiguousError) Error() string {
	s := make([]string, len(e.at))
	for i, p := range e.at {
		s[i] = p.String()
	}
	return fmt.Sprintf("event id %q is on %d records (%s): name one by PARTITION/OFFSET", e.id, len(e.at), strings.Join(s, ", "))
}
