package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/paystream/paystream/ingest"
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

type dlqShowCmd struct {
	dlqFlags
	dlqTarget
	Body bool `help:"Also print the webhook body (it may hold personal data)."`
}

func (c *dlqShowCmd) Help() string {
	return `Prints one DLQ record: where it is, its Kafka key and headers, the envelope ingest wrote (source,
driver, receipt time, the request headers it kept, the reason) and whether it was replayed. The
body is summarized by its size and SHA-256; --body prints it. Signature and token headers are never
kept by ingest, and any header named like a credential is shown as [redacted].

  paystream dlq show 1/42
  paystream dlq show --event-id msg_2Lx9 --body --json`
}

// dlqShowOutput is dlq show --json.
type dlqShowOutput struct {
	Topic string `json:"topic"`
	dlq.Position
	Timestamp    time.Time         `json:"timestamp"`
	Key          string            `json:"key"`
	KafkaHeaders map[string]string `json:"kafka_headers,omitempty"`
	DecodeError  string            `json:"decode_error,omitempty"`
	V            int               `json:"v,omitempty"`
	Source       string            `json:"source,omitempty"`
	Driver       string            `json:"driver,omitempty"`
	PaymentKey   string            `json:"payment_key,omitempty"`
	ReceivedAt   *time.Time        `json:"received_at,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	EventID      string            `json:"event_id,omitempty"`
	Reason       string            `json:"reason,omitempty"`
	BodyBytes    int               `json:"body_bytes"`
	BodySHA256   string            `json:"body_sha256"`
	Body         []byte            `json:"body,omitempty"` // base64, only with --body
	Replayed     *dlq.Marker       `json:"replayed,omitempty"`
}

func showOutput(topic string, rec *dlq.Record, replays map[dlq.Position]dlq.Marker, withBody bool) dlqShowOutput {
	out := dlqShowOutput{Topic: topic, Position: rec.Position, Timestamp: rec.Timestamp, Key: rec.Key, DecodeError: rec.DecodeError}
	for _, h := range rec.Headers {
		if out.KafkaHeaders == nil {
			out.KafkaHeaders = map[string]string{}
		}
		out.KafkaHeaders[h.Key] = dlq.RedactHeader(h.Key, h.Value)
	}
	body := rec.Value
	if rec.DecodeError == "" {
		env := rec.Envelope
		at := env.ReceivedAt
		out.V, out.Source, out.Driver, out.PaymentKey, out.ReceivedAt = env.V, env.Source, env.Driver, env.PaymentKey, &at
		out.EventID, out.Reason, body = rec.EventID(), env.Reason, env.Body
		for k, v := range env.Headers {
			if out.Headers == nil {
				out.Headers = map[string]string{}
			}
			out.Headers[k] = dlq.RedactHeader(k, v)
		}
	}
	sum := sha256.Sum256(body)
	out.BodyBytes, out.BodySHA256 = len(body), hex.EncodeToString(sum[:])
	if withBody {
		out.Body = body
	}
	if m, ok := replays[rec.Position]; ok {
		out.Replayed = &m
	}
	return out
}

func (c *dlqShowCmd) Run(ctx context.Context, e *env) error {
	tool, err := c.open(ctx, e.log)
	if err != nil {
		return err
	}
	defer tool.Close()
	return c.run(ctx, tool, os.Stdout)
}

func (c *dlqShowCmd) run(ctx context.Context, tool *dlq.Tool, stdout io.Writer) error {
	pos, err := c.find(ctx, tool, &c.dlqFlags)
	var amb *ambiguousError
	if errors.As(err, &amb) {
		fmt.Fprintf(os.Stderr, "paystream: %v; showing %s\n", err, pos)
	} else if err != nil {
		return err
	}
	rec, err := tool.Get(ctx, pos)
	if err != nil {
		return dlqError(err, c.DLQTopic)
	}
	replays, err := tool.Replays(ctx)
	if err != nil {
		return err
	}
	out := showOutput(c.DLQTopic, rec, replays, c.Body)
	if c.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	printShow(stdout, out)
	return nil
}

func printShow(stdout io.Writer, o dlqShowOutput) {
	w := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "dlq record %s of %s\n", o.Position, o.Topic)
	fmt.Fprintf(w, "  written\t%s\n", o.Timestamp.Format(time.RFC3339Nano))
	fmt.Fprintf(w, "  key\t%s\n", o.Key)
	if o.DecodeError != "" {
		fmt.Fprintf(w, "  NOT A DLQ ENVELOPE\t%s\n", o.DecodeError)
	} else {
		fmt.Fprintf(w, "  source\t%s (driver %s)\n", o.Source, o.Driver)
		fmt.Fprintf(w, "  received\t%s\n", o.ReceivedAt.Format(time.RFC3339Nano))
		fmt.Fprintf(w, "  event id\t%s\n", cmpOrDash(o.EventID))
		fmt.Fprintf(w, "  reason\t%s\n", o.Reason)
		printHeaders(w, "headers", o.Headers)
	}
	printHeaders(w, "kafka headers", o.KafkaHeaders)
	fmt.Fprintf(w, "  body\t%d bytes, sha256 %s\n", o.BodyBytes, o.BodySHA256)
	if o.Replayed != nil {
		fmt.Fprintf(w, "  replayed\t%s to %s %s (payment %s, dedup key %s)\n", o.Replayed.ReplayedAt.Format(time.RFC3339),
			o.Replayed.RawTopic, o.Replayed.Raw, o.Replayed.PaymentKey, o.Replayed.DedupKey)
	} else {
		fmt.Fprintf(w, "  replayed\tno\n")
	}
	_ = w.Flush()
	if o.Body != nil {
		fmt.Fprintln(stdout, "\nbody:")
		if utf8.Valid(o.Body) {
			fmt.Fprintln(stdout, string(o.Body))
		} else {
			fmt.Fprintln(stdout, "(not UTF-8; --json prints it in base64)")
		}
	} else {
		fmt.Fprintln(stdout, "\n(body not printed; --body prints it)")
	}
}

func printHeaders(w io.Writer, title string, h map[string]string) {
	if len(h) == 0 {
		fmt.Fprintf(w, "  %s\t-\n", title)
		return
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i == 0 {
			fmt.Fprintf(w, "  %s\t%s: %s\n", title, k, h[k])
		} else {
			fmt.Fprintf(w, "\t%s: %s\n", k, h[k])
		}
	}
}

func cmpOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type dlqReplayCmd struct {
	dlqFlags
	dlqTarget
	RawTopic string `help:"Raw webhook topic the event is produced to." default:"${raw_topic}" env:"PAYSTREAM_RAW_TOPIC"`
	Sources  string `help:"Path of the sources file: the record's source's driver re-parses it." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE"`
	DryRun   bool   `help:"Re-parse and say what would be produced, and where, without producing anything."`
}

func (c *dlqReplayCmd) Help() string {
	return `After a driver fix (a new event type, a payload shape the driver now understands), replay
re-runs the record's source's driver on the body and headers the DLQ kept. If it now parses,
replay produces the raw envelope ingest would have produced — keyed by payment, with ingest's
partitioner, acks=all, idempotent producer — and records the replay on the replays topic (compacted,
keyed by the DLQ topic, its id and the record's position). A record replayed before is refused.

Replay trusts the DLQ: ingest verified the signature when the webhook arrived and does not keep the
signature headers, so they are not checked again. Only ingest should be able to write the DLQ topic.

The raw record is written before the replay is recorded: a crash in between, or two replays of the
same record at once, can produce a second copy, never none. The processor deduplicates on the
event's (source, dedup key): a second copy is stored as ignored: duplicate_event and changes nothing.

  paystream dlq replay 1/42 --sources sources.yaml --dry-run
  paystream dlq replay --event-id msg_2Lx9 --sources sources.yaml`
}

func (c *dlqReplayCmd) Run(ctx context.Context, e *env) error {
	sources, err := loadSources(c.Sources)
	if err != nil {
		return err
	}
	maxRecord, err := ingest.MaxRecordBytes(sources)
	if err != nil {
		return err
	}
	tool, err := c.open(ctx, e.log, func(cfg *dlq.Config) {
		cfg.RawTopic, cfg.MaxRecordBytes = c.RawTopic, maxRecord
	})
	if err != nil {
		return err
	}
	defer tool.Close()
	pos, err := c.find(ctx, tool, &c.dlqFlags)
	if err != nil {
		return err
	}
	res, err := tool.Replay(ctx, pos, sources, c.DryRun)
	if err != nil {
		return dlqError(err, c.DLQTopic)
	}
	return printReplay(os.Stdout, res, c.JSON)
}

// dlqReplayOutput is dlq replay --json.
type dlqReplayOutput struct {
	*dlq.ReplayResult
	PaymentKey string `json:"payment_key"`
	DedupKey   string `json:"dedup_key"`
	EventID    string `json:"event_id,omitempty"`
	Type       string `json:"type"`
	Status     string `json:"status"`
	Amount     int64  `json:"amount_minor"`
	Currency   string `json:"currency"`
}

func printReplay(stdout io.Writer, r *dlq.ReplayResult, asJSON bool) error {
	ev := r.Envelope.Event
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(dlqReplayOutput{ReplayResult: r, PaymentKey: r.Envelope.PaymentKey, DedupKey: ev.DedupKey,
			EventID: ev.EventID, Type: ev.Type, Status: string(ev.Fact.Status), Amount: ev.Fact.AmountMinor, Currency: ev.Fact.Currency})
	}
	what := fmt.Sprintf("payment %s, event %s (%s: %s %d %s)", r.Envelope.PaymentKey, ev.DedupKey, ev.Type, ev.Fact.Status, ev.Fact.AmountMinor, ev.Fact.Currency)
	if r.DryRun {
		_, err := fmt.Fprintf(stdout, "dry run: dlq record %s parses now; it would be produced to %s partition %d: %s\n", r.DLQ, r.RawTopic, r.Raw.Partition, what)
		return err
	}
	_, err := fmt.Fprintf(stdout, "replayed dlq record %s to %s %s: %s\n", r.DLQ, r.RawTopic, r.Raw, what)
	return err
}
