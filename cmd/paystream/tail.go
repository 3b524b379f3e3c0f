package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
)

type tailCmd struct {
	kafkaFlags
	StateTopic    string `help:"Normalized payment-state topic." default:"${state_topic}" env:"PAYSTREAM_STATE_TOPIC"`
	FromBeginning bool   `help:"Start at the oldest event kept instead of waiting for new ones."`
	Payment       string `help:"Only this payment's events (its payment key, source:id); reads only its partition." placeholder:"KEY"`
	JSON          bool   `help:"Print each event's value as stored, one JSON object per line (schemas/payment-state.v1.json)." name:"json"`
	Max           int    `help:"Stop after printing N events (0: run until Ctrl-C)." placeholder:"N"`
}

func (c *tailCmd) Help() string {
	return `Reads the payment-state topic as a data team's consumer should — isolation.level=read_committed,
so nothing of an aborted sink transaction ever shows — and prints one line per transition: when it
happened, the payment, its version, the status change, what moved and the payment after it. It
joins no consumer group and commits nothing. Ctrl-C stops it.

  paystream tail                                   # new events as they come
  paystream tail --from-beginning --payment acme:pay_123
  paystream tail --from-beginning --json --max 100 | jq .status`
}

func (c *tailCmd) Run(ctx context.Context, e *env) error {
	brokers, kafkaOpts, err := c.kafka(e.log)
	if err != nil {
		return err
	}
	if c.Max < 0 {
		return errors.New("--max must not be negative")
	}
	if err := c.checkKafka(ctx, e.log, brokers); err != nil {
		return err
	}
	if !c.FromBeginning && isTerminal(os.Stderr) {
		fmt.Fprintf(os.Stderr, "waiting for new events on %s (Ctrl-C stops; --from-beginning for the history)\n", c.StateTopic)
	}
	return tail(ctx, tailConfig{
		kafkaOpts: kafkaOpts, topic: c.StateTopic, fromBeginning: c.FromBeginning,
		payment: c.Payment, json: c.JSON, max: c.Max,
	}, os.Stdout)
}

type tailConfig struct {
	kafkaOpts     []kgo.Opt // seed brokers, TLS, SASL
	topic         string
	fromBeginning bool
	payment       string
	json          bool
	max           int
}

// tail prints the state topic's events to out until ctx ends (a clean
// stop) or cfg.max events were printed.
func tail(ctx context.Context, cfg tailConfig, out io.Writer) error {
	n, err := topicPartitions(ctx, cfg.kafkaOpts, cfg.topic)
	if err != nil {
		return err
	}
	start := kgo.NewOffset().AtEnd()
	if cfg.fromBeginning {
		start = kgo.NewOffset().AtStart()
	}
	parts := map[int32]kgo.Offset{}
	if cfg.payment != "" {
		// The sink produces with franz-go's sticky key partitioner (Kafka's
		// murmur2 of the key), so a payment's events are all on this one.
		p := kgo.StickyKeyPartitioner(nil).ForTopic(cfg.topic).Partition(&kgo.Record{Key: []byte(cfg.payment)}, n)
		parts[int32(p)] = start
	} else {
		for p := range n {
			parts[int32(p)] = start
		}
	}
	cl, err := kgo.NewClient(append(slices.Clip(cfg.kafkaOpts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{cfg.topic: parts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()

	printed := 0
	for cfg.max == 0 || printed < cfg.max {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil // Ctrl-C: a normal stop
		}
		if err := fetches.Err0(); err != nil {
			return fmt.Errorf("fetch %s: %w", cfg.topic, err)
		}
		var werr error
		fetches.EachRecord(func(r *kgo.Record) {
			if werr != nil || (cfg.max > 0 && printed >= cfg.max) || (cfg.payment != "" && string(r.Key) != cfg.payment) {
				return
			}
			printed++
			werr = printState(out, r, cfg.json)
		})
		if werr != nil {
			return werr
		}
	}
	return nil
}

// printState prints one state record: its value as one JSON line, or a
// readable line.
func printState(out io.Writer, r *kgo.Record, asJSON bool) error {
	if asJSON {
		var line bytes.Buffer
		if err := json.Compact(&line, r.Value); err != nil {
			line.Reset()
			fmt.Fprintf(&line, `{"undecodable":true,"partition":%d,"offset":%d}`, r.Partition, r.Offset)
		}
		line.WriteByte('\n')
		_, err := out.Write(line.Bytes())
		return err
	}
	var ev envelope.State
	if err := json.Unmarshal(r.Value, &ev); err != nil {
		_, err := fmt.Fprintf(out, "%d/%d  undecodable state event (%v)\n", r.Partition, r.Offset, err)
		return err
	}
	prev := string(ev.PreviousStatus)
	if prev == "" {
		prev = "∅"
	}
	moved := ev.Kind
	if ev.AmountMinor != 0 {
		moved = fmt.Sprintf("%s %d %s", ev.Kind, ev.AmountMinor, ev.Currency)
	}
	if ev.RefundID != "" {
		moved += " refund " + ev.RefundID
	}
	_, err := fmt.Fprintf(out, "%s  %s  v%d  %s → %s  %s  (now %s, %d %s; event %s)\n",
		ev.OccurredAt.UTC().Format(time.RFC3339), ev.PaymentKey, ev.Version, prev, ev.Status, moved,
		ev.Payment.Status, ev.Payment.AmountMinor, ev.Payment.Currency, ev.EventID)
	return err
}
