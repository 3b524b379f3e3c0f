package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/processor"
)

type replayCmd struct {
	dbFlags
	List       bool    `help:"List held payments instead of replaying one."`
	Source     string  `help:"Source of the payment to replay."`
	Account    string  `help:"Account, for sources configured with one."`
	ID         string  `help:"The gateway's payment id."`
	PaymentKey string  `help:"The payment key (source:id), instead of --source and --id."`
	Skip       []int64 `help:"Quarantined delivery ids to give up on (marked ignored) instead of re-driving." placeholder:"DELIVERY_ID"`
}

func (c *replayCmd) Help() string {
	return `A record that fails deterministically is quarantined and its payment held: later events of that
payment wait (deferred: payment_held) so nothing applies out of order. Once the cause is fixed (a
driver or processor upgrade), replay releases the hold and applies the quarantined and waiting
events, in arrival order, in one transaction — each exactly once. If an event still fails, nothing
changes and the error says which; --skip gives up on events that can never apply.

replay runs beside the processors: it locks the payment and writes an event's outcome only if the
event is still as it read it. If a processor decided one meanwhile, replay rolls back, says so, and
can simply be run again.`
}

func (c *replayCmd) Run(ctx context.Context) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if c.List {
		held, err := processor.ListHeld(ctx, pool)
		if err != nil {
			return err
		}
		if len(held) == 0 {
			fmt.Println("no held payments")
			return nil
		}
		w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(w, "payment\tquarantined\twaiting\treason")
		for _, h := range held {
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", h.PaymentKey, h.Quarantined, h.Waiting, h.Reason)
		}
		return w.Flush()
	}
	key := c.PaymentKey
	if key == "" {
		if c.Source == "" || c.ID == "" {
			return errors.New("name the payment: --source and --id, or --payment-key (or --list to see held payments)")
		}
		key = provider.PaymentKey(c.Source, c.Account, c.ID)
	}
	report, err := processor.Replay(ctx, pool, key, processor.ReplayOptions{Skip: c.Skip})
	if errors.Is(err, processor.ErrOutcomeChanged) {
		return fmt.Errorf("replay %s: nothing replayed, the processor decided one of its events meanwhile; look again (--list) and rerun: %w", key, err)
	}
	if err != nil {
		return fmt.Errorf("replay %s: %w", key, err)
	}
	fmt.Printf("replayed %s: %v", key, report.Replayed)
	if len(report.Skipped) > 0 {
		fmt.Printf(", skipped %v", report.Skipped)
	}
	fmt.Println()
	return nil
}
