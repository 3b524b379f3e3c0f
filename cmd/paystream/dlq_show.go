package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/paystream/paystream/internal/dlq"
)

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
