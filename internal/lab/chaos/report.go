package chaos

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// TableHeader is the first two lines of the results table (Markdown).
const TableHeader = "| scenario | deliveries | 2xx | 503 | lost | duplicate effects | duplicate or missing state events | recovery | drain | ok |\n" +
	"|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"

// Row is r as one line of the results table.
func (r Result) Row() string {
	if r.Skipped != "" {
		return fmt.Sprintf("| %s | — | — | — | — | — | — | — | — | skipped: %s |\n", r.Scenario, r.Skipped)
	}
	ok := "yes"
	if !r.OK {
		ok = "**NO**"
		if r.Error != "" {
			ok += ": " + oneLine(r.Error, 120)
		}
	}
	return fmt.Sprintf("| %s | %d | %d | %d | %s | %s | %s | %s | %s | %s |\n",
		r.Scenario, r.Deliveries, r.Acked, r.Unavailable, count(r.Lost), count(r.DuplicateEffects),
		count(r.StateEvents), seconds(r.Recovery), seconds(r.Drain), ok)
}

// WriteTable writes the header and one row per result.
func WriteTable(w io.Writer, results []Result) error {
	var b strings.Builder
	b.WriteString(TableHeader)
	for _, r := range results {
		b.WriteString(r.Row())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteDetails writes each scenario's faults and failed invariants, for
// reading a run after the table.
func WriteDetails(w io.Writer, results []Result) error {
	var b strings.Builder
	for _, r := range results {
		if r.Skipped != "" {
			continue
		}
		fmt.Fprintf(&b, "%s (%s, logs %s", r.Scenario, seconds(r.Elapsed), r.Logs)
		if r.Schema != "" {
			fmt.Fprintf(&b, ", schema %s kept", r.Schema)
		}
		b.WriteString("):")
		for _, f := range r.Faults {
			fmt.Fprintf(&b, " %s at %.0f%% (took %s) → recovered in %s", f.Name, 100*f.Progress, seconds(f.Took), seconds(f.Recovery))
			if f.Error != "" {
				fmt.Fprintf(&b, " (%s)", oneLine(f.Error, 200))
			}
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %d failed attempts besides 503s\n", r.Failed)
		for _, inv := range r.Invariants {
			if !inv.OK {
				fmt.Fprintf(&b, "  FAILED %s %s: %s\n", inv.ID, inv.Name, oneLine(inv.Detail, 400))
			}
		}
		if r.Error != "" {
			fmt.Fprintf(&b, "  error: %s\n", r.Error)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func count(n int) string {
	if n < 0 {
		return "?"
	}
	return strconv.Itoa(n)
}

func seconds(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
