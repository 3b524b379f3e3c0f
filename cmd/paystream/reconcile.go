package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/paystream/paystream/internal/cmdline"
	"github.com/paystream/paystream/internal/reconcile"
	"github.com/paystream/paystream/internal/source"
)

// exitDrift is reconcile's exit status when it found drift: distinct from
// 1 (it could not run) and 2 (usage).
const exitDrift = 3

type reconcileCmd struct {
	kafkaFlags
	dbFlags
	StateTopic   string        `help:"Normalized payment-state topic." default:"${state_topic}" env:"PAYSTREAM_STATE_TOPIC"`
	DLQTopic     string        `help:"Dead-letter topic." default:"${dlq_topic}" env:"PAYSTREAM_DLQ_TOPIC"`
	ReplaysTopic string        `help:"Compacted topic where paystream dlq replay records which DLQ records it replayed." default:"paystream.webhooks.dlq-replays.v1" env:"PAYSTREAM_DLQ_REPLAYS_TOPIC"`
	OlderThan    time.Duration `help:"A payment held or with deferred events for longer than this is drift." default:"1h" env:"PAYSTREAM_RECONCILE_OLDER_THAN"`
	Since        time.Duration `help:"Window of the state-event, DLQ and gateway checks: what happened in the last SINCE." default:"24h" env:"PAYSTREAM_RECONCILE_SINCE"`
	Settle       time.Duration `help:"Transitions younger than this are not judged by the state-event check (the sink relays them a moment after they commit)." default:"1m" env:"PAYSTREAM_RECONCILE_SETTLE"`
	Gateway      bool          `help:"Also read every open payment (not failed, canceled, refunded or dispute_lost) of the sources that refetch back from its gateway's API (one request each, at the source's refetch_rate) and report facts paystream never received. Needs --sources." env:"PAYSTREAM_RECONCILE_GATEWAY"`
	GatewayLimit int           `help:"Most payments the gateway sweep reads back." default:"1000" env:"PAYSTREAM_RECONCILE_GATEWAY_LIMIT"`
	Sources      string        `help:"Sources file, for --gateway (the API base URL, token and rate of each source that refetches)." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE"`
	JSON         bool          `help:"Print the report as one JSON object."`
}

func (c *reconcileCmd) Help() string {
	return `Checks that what paystream stored agrees with itself and with the topics, and exits 3 when it
finds drift (0: none; 1: a check could not run). It changes nothing.

  ledger        every payment's ledger movements add up to the balances its state implies (a paid
                payment's capture in gateway_receivable and merchant_payable, a refunded one net
                zero, ...), and its transitions run 1..version
  waiting       payments held (quarantined, waiting for paystream replay) or with deferred events
                for longer than --older-than
  state events  every transition of the last --since has its event "{payment key}:{version}" on
                the state topic, read as a read_committed consumer, and none is there twice
  dlq           dead-lettered records of the last --since that paystream dlq replay never replayed
  gateway       with --gateway: open payments read back from the gateway's API, one request each

Progress goes to stderr, the report to stdout.

Example:
  paystream reconcile --since 6h --older-than 30m --json > reconcile.json; echo "exit $?"`
}

func (c *reconcileCmd) Run(ctx context.Context, e *env) error {
	brokers, kafkaOpts, err := c.kafka(e.log)
	if err != nil {
		return err
	}
	var gateway map[string]*source.RefetchConfig
	if c.Gateway {
		sources, err := loadSources(c.Sources)
		if err != nil {
			return fmt.Errorf("--gateway: %w", err)
		}
		if gateway = refetchConfigs(sources); len(gateway) == 0 {
			return errors.New("--gateway: no source in the sources file can refetch (api_token, or refetch: true)")
		}
	}
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := c.checkKafka(ctx, e.log, brokers); err != nil {
		return err
	}
	report, err := reconcile.Run(ctx, reconcile.Config{
		DB: pool, Brokers: brokers, KafkaOpts: kafkaOpts, StateTopic: c.StateTopic, DLQTopic: c.DLQTopic, ReplaysTopic: c.ReplaysTopic,
		OlderThan: c.OlderThan, Since: c.Since, Settle: c.Settle,
		Gateway: gateway, GatewayLimit: c.GatewayLimit,
		Progress: os.Stderr,
	})
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	if c.JSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(report)
	} else {
		err = printReconcile(os.Stdout, report)
	}
	if err != nil {
		return fmt.Errorf("print report: %w", err)
	}
	if report.Drift() {
		return cmdline.ExitError{Code: exitDrift, Err: errors.New("reconcile found drift")}
	}
	return nil
}

// printReconcile writes r for people: a line per check, then what drifted.
func printReconcile(out io.Writer, r *reconcile.Report) error {
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "ledger\t%d payments checked, %d drifted\n", r.Ledger.Payments, r.Ledger.Drifted)
	fmt.Fprintf(w, "waiting\t%d payments held or deferred for longer than %s\n", len(r.Waiting.Payments), r.OlderThan)
	se := r.StateEvents
	fmt.Fprintf(w, "state events\t%d transitions since %s checked (%d too recent), %d missing on the topic, %d duplicated\n",
		se.Transitions, r.Since.Format(time.RFC3339), se.TooRecent, se.Missing, len(se.Duplicated))
	fmt.Fprintf(w, "dlq\t%d records since %s, %d replayed, %d never replayed\n", r.DLQ.Records, r.Since.Format(time.RFC3339), r.DLQ.Replayed, r.DLQ.NotReplayed)
	if g := r.Gateway; g != nil {
		fmt.Fprintf(w, "gateway\t%d open payments read back, %d drifted, %d unanswered\n", g.Payments, len(g.Drift), len(g.Failed))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, d := range r.Ledger.Drift {
		fmt.Fprintf(out, "\nledger drift: %s (%s): %s\n  expected %s\n  ledger   %s\n",
			d.PaymentKey, d.Status, strings.Join(d.Problems, "; "), formatBalances(d.Expected), formatBalances(d.Actual))
	}
	for _, p := range r.Waiting.Payments {
		what := "deferred"
		if p.Held {
			what = "held (" + p.HeldReason + ")"
		}
		fmt.Fprintf(out, "waiting: %s %s since %s: %d deliveries waiting (%s)\n",
			p.PaymentKey, what, p.Since.UTC().Format(time.RFC3339), p.Deliveries, strings.Join(p.Reasons, ", "))
	}
	for _, id := range se.MissingEvents {
		fmt.Fprintf(out, "missing state event: %s\n", id)
	}
	for _, pos := range r.DLQ.Unreplayed {
		fmt.Fprintf(out, "dlq record never replayed: %s (paystream dlq show %s)\n", pos, pos)
	}
	for _, id := range se.Duplicated {
		fmt.Fprintf(out, "duplicated state event: %s\n", id)
	}
	if g := r.Gateway; g != nil {
		for _, d := range g.Drift {
			fmt.Fprintf(out, "gateway drift: %s is %s here, %s at the gateway (never received: %s)\n",
				d.PaymentKey, d.Status, d.GatewayStatus, strings.Join(d.Missing, ", "))
		}
		for _, f := range g.Failed {
			fmt.Fprintf(out, "gateway unanswered: %s: %s\n", f.PaymentKey, f.Error)
		}
	}
	if r.Drift() {
		fmt.Fprintln(out, "\ndrift found")
	} else {
		fmt.Fprintln(out, "\nno drift")
	}
	return nil
}

// formatBalances writes balances as "account/CUR=amount" in account order.
func formatBalances(b map[string]int64) string {
	if len(b) == 0 {
		return "(none)"
	}
	keys := make([]string, 0, len(b))
	for k := range b {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, b[k])
	}
	return strings.Join(parts, " ")
}
