package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/store"
)

type inspectCmd struct {
	Payment inspectPaymentCmd `cmd:"" help:"Show a payment's state, ledger, transitions and every delivery of its events."`
}

type inspectPaymentCmd struct {
	DatabaseURL string `help:"Postgres connection URL." env:"PAYSTREAM_DATABASE_URL" placeholder:"postgres://..."`
	DataDir     string `help:"Data dir of a 'paystream dev' instance (used when no database URL is set)." default:".data" env:"PAYSTREAM_DATA_DIR"`
	Source      string `help:"Source name, as in the sources file." required:""`
	Account     string `help:"Account, for sources configured with one."`
	ID          string `help:"The gateway's payment id." required:""`
	JSON        bool   `help:"Print one JSON object instead of a timeline." name:"json"`
}

func (c *inspectPaymentCmd) Run(ctx context.Context) error {
	url, fromDev := c.DatabaseURL, false
	if url == "" {
		fromDev = true
		raw, err := os.ReadFile(devStatePath(c.DataDir))
		if err != nil {
			return fmt.Errorf("no database: set --database-url or PAYSTREAM_DATABASE_URL, or point --data-dir at a running 'paystream dev' (%w)", err)
		}
		var st devState
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("read %s: %w", devStatePath(c.DataDir), err)
		}
		url = st.DatabaseURL
	}
	pool, err := openPool(ctx, url)
	if err != nil && fromDev {
		return fmt.Errorf("the database of the 'paystream dev' in %s does not answer: is it running? "+
			"(start it with 'paystream dev --data-dir %s', or set --database-url): %w", c.DataDir, c.DataDir, err)
	}
	if err != nil {
		return err
	}
	defer pool.Close()
	p, err := store.InspectPayment(ctx, pool, provider.PaymentKey(c.Source, c.Account, c.ID))
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no payment %q from source %q has been processed", c.ID, c.Source)
	}
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	}
	printTimeline(p)
	return nil
}

func printTimeline(p *store.Payment) {
	fmt.Printf("payment %s  (source %s, id %s)\n", p.PaymentKey, p.Source, p.PaymentID)
	fmt.Printf("  status %s, version %d, amount %d %s\n", p.Status, p.Version, p.AmountMinor, p.Currency)
	if p.Held {
		fmt.Printf("  HELD: %s — later events wait for 'paystream replay'\n", p.HeldReason)
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nevents (arrival order)")
	fmt.Fprintln(w, "  received\tevent id\ttype\toutcome\treason")
	for _, e := range p.Events {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", e.ReceivedAt.Format(time.RFC3339), e.EventID, e.Type, e.Outcome, e.Reason)
	}
	fmt.Fprintln(w, "\ntransitions")
	for _, t := range p.Transitions {
		fmt.Fprintf(w, "  v%d\t%s → %s\t%s\t%d %s\n", t.Version, t.From, t.To, t.Kind, t.AmountMinor, t.Currency)
	}
	fmt.Fprintln(w, "\nledger")
	for _, ps := range p.Ledger {
		fmt.Fprintf(w, "  v%d\t%s\t%d\t%s\n", ps.Version, ps.Account, ps.AmountMinor, ps.Currency)
	}
	_ = w.Flush()
}
