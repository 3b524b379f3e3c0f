package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/dlq"
)

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
