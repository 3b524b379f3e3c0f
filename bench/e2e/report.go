package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// report is the bench's output, as Markdown and as JSON.
type report struct {
	Kind      string       `json:"kind"`
	Machine   machineInfo  `json:"machine"`
	Workload  workloadInfo `json:"workload"`
	Paystream *result      `json:"paystream"`
	Baseline  *result      `json:"baseline"`
	// Rounds are each round's figures when there were several (the
	// results above are over all of them).
	Rounds []roundResult `json:"rounds,omitempty"`
}

// roundResult is one round's end-to-end rates and all-CPU per delivery.
type roundResult struct {
	Paystream    float64 `json:"paystream_deliveries_per_sec"`
	Baseline     float64 `json:"baseline_deliveries_per_sec"`
	Ratio        float64 `json:"ratio"`
	PaystreamCPU float64 `json:"paystream_all_cpu_us_per_delivery"`
	BaselineCPU  float64 `json:"baseline_all_cpu_us_per_delivery"`
}

type workloadInfo struct {
	Deliveries int `json:"deliveries"`
	Repeats    int `json:"repeats"`
	Payments   int `json:"payments"`
	// Rounds is how many times each design ran the workload (deliveries,
	// repeats and payments are per round).
	Rounds      int `json:"rounds"`
	BodyBytes   int `json:"body_bytes"`
	Connections int `json:"connections"`
	// Client is the load generator's HTTP client: fasthttp or net/http.
	Client string `json:"client"`
	// IngestHTTPServer is paystream ingest's HTTP server.
	IngestHTTPServer string `json:"ingest_http_server"`
	// IngestGOMAXPROCS is ingest's GOMAXPROCS; 0 for Go's default.
	IngestGOMAXPROCS int `json:"ingest_gomaxprocs,omitempty"`
	Partitions       int `json:"partitions"`
	BaselineConns    int `json:"baseline_pg_conns"`
	// Rate is the fixed arrival rate, requests per second; 0 for as fast
	// as each target answers.
	Rate float64 `json:"rate,omitempty"`
}

// appProcesses are the processes each design adds; the broker and
// Postgres are shared.
var appProcesses = map[string][]string{
	"paystream": {"ingest", "processor", "sink"},
	"baseline":  {"baseline"},
}

func (r *result) cpuSum(names ...string) (float64, bool) {
	var sum float64
	found := false
	for _, n := range names {
		if v, ok := r.CPU[n]; ok {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

func (r *result) cpuTotal() float64 {
	var sum float64
	for n, v := range r.CPU {
		if n != walsendersCPU && n != jitCPU && n != benchCPU { // parts of "postgres" and "broker", and no part of either design
			sum += v
		}
	}
	return sum
}

// markdown renders the results table and its notes.
func (rep *report) markdown() string {
	p, b := rep.Paystream, rep.Baseline
	var sb strings.Builder
	fmt.Fprintf(&sb, "bench-e2e, %s — %s, commit %s, %d CPUs (%s), load average before %s\n\n",
		rep.Kind, rep.Machine.Date, rep.Machine.Commit, rep.Machine.CPUs, rep.Machine.CPU, rep.Machine.LoadAvg)
	ingestOn := rep.Workload.IngestHTTPServer
	if n := rep.Workload.IngestGOMAXPROCS; n > 0 {
		ingestOn += fmt.Sprintf(" with GOMAXPROCS=%d", n)
	}
	fmt.Fprintf(&sb, "%d deliveries (%d repeats), %d payments, ~%d B bodies, %d connections (%s client), ingest on %s, %d partitions, %s",
		rep.Workload.Deliveries, rep.Workload.Repeats, rep.Workload.Payments, rep.Workload.BodyBytes, rep.Workload.Connections, rep.Workload.Client,
		ingestOn, rep.Workload.Partitions, rateText(rep.Workload.Rate))
	if n := rep.Workload.Rounds; n > 1 {
		fmt.Fprintf(&sb, "; %d rounds per design, alternated, and the table is over all of them", n)
	}
	sb.WriteString("\n\n")
	sb.WriteString("| | paystream | sync baseline | paystream ÷ baseline |\n|---|--:|--:|--:|\n")
	row := func(name string, pv, bv float64, format string) {
		fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", name, fmt.Sprintf(format, pv), fmt.Sprintf(format, bv), ratio(pv, bv))
	}
	only := func(name, pv, bv string) { fmt.Fprintf(&sb, "| %s | %s | %s | — |\n", name, pv, bv) }
	row("accepted/s", p.AcceptedPerSec, b.AcceptedPerSec, "%.0f")
	row("accept p50 (ms)", p.AcceptP50, b.AcceptP50, "%.2f")
	row("accept p99 (ms)", p.AcceptP99, b.AcceptP99, "%.2f")
	row("end-to-end deliveries/s", p.EndToEndPerSec, b.EndToEndPerSec, "%.0f")
	only("accepted→published p50 (ms)", fmt.Sprintf("%.1f", p.PublishP50), "0 (committed)")
	only("accepted→published p99 (ms)", fmt.Sprintf("%.1f", p.PublishP99), "0 (committed)")
	for _, n := range appProcesses["paystream"] {
		if v, ok := p.CPU[n]; ok {
			only("CPU µs/delivery: "+n, fmt.Sprintf("%.0f", v), "—")
		}
	}
	if v, ok := b.CPU["baseline"]; ok {
		only("CPU µs/delivery: baseline server", "—", fmt.Sprintf("%.0f", v))
	}
	pa, _ := p.cpuSum(appProcesses["paystream"]...)
	ba, _ := b.cpuSum(appProcesses["baseline"]...)
	row("CPU µs/delivery: application processes", pa, ba, "%.0f")
	for _, n := range []string{"broker", "postgres"} {
		pv, ok1 := p.CPU[n]
		bv, ok2 := b.CPU[n]
		if ok1 && ok2 {
			row("CPU µs/delivery: "+map[string]string{"broker": "Kafka broker", "postgres": "Postgres"}[n], pv, bv, "%.0f")
		}
	}
	if v, ok := p.CPU[jitCPU]; ok {
		only("CPU µs/delivery: of which the broker's JIT compiler (warming up)", fmt.Sprintf("%.0f", v), fmt.Sprintf("%.0f", b.CPU[jitCPU]))
	}
	if v, ok := p.CPU[walsendersCPU]; ok {
		only("CPU µs/delivery: of which Postgres walsenders (the relay's logical decoding)", fmt.Sprintf("%.0f", v), "—")
	}
	row("CPU µs/delivery: all of the above", p.cpuTotal(), b.cpuTotal(), "%.0f")
	if pv, ok := p.CPU[benchCPU]; ok {
		row("CPU µs/delivery, not in the total: bench-e2e itself (load generator, state watcher)", pv, b.CPU[benchCPU], "%.0f")
	}
	row("WAL bytes/delivery", p.WALBytesPerDelivery, b.WALBytesPerDelivery, "%.0f")
	if p.ProcessorTransactions > 0 {
		cell := fmt.Sprintf("%.1f (%d transactions)", p.DeliveriesPerTransaction, p.ProcessorTransactions)
		if p.BatchesPerTransaction > 0 {
			cell = fmt.Sprintf("%.1f (%d transactions of %.1f partitions' batches)", p.DeliveriesPerTransaction, p.ProcessorTransactions, p.BatchesPerTransaction)
		}
		only("deliveries per Postgres transaction", cell, "1")
	}
	if p.SinkTransactions > 0 {
		only("state events per Kafka transaction (relay)", fmt.Sprintf("%.1f (%d transactions)", p.EventsPerSinkTransaction, p.SinkTransactions), "—")
	}

	sb.WriteString("\n")
	for _, r := range []*result{p, b} {
		var codes []string
		for _, c := range r.Load.StatusCodes() {
			codes = append(codes, fmt.Sprintf("%d × %d", r.Load.Status[c], c))
		}
		fmt.Fprintf(&sb, "- %s: answers %s", r.Name, strings.Join(codes, ", "))
		if len(r.Load.Errors) > 0 {
			fmt.Fprintf(&sb, ", errors %v", r.Load.Errors)
		}
		fmt.Fprintf(&sb, "; load %.1fs, first request → last delivery recorded %.1fs; %s\n", r.Load.Elapsed.Seconds(), r.EndToEnd, r.Check)
	}
	for _, r := range []*result{p, b} {
		if pc := r.Pacing; pc != nil {
			fmt.Fprintf(&sb, "- %s at %.0f requests/s offered: %d requests started over 10 ms after their time (latest %.0f ms late)\n",
				r.Name, pc.Rate, pc.Late, pc.MaxLateMS)
		}
	}
	fmt.Fprintf(&sb, "- accepted→published: %d state events matched to their webhook's first 2xx", p.Published)
	if p.PublishNote != "" {
		fmt.Fprintf(&sb, " (%s)", p.PublishNote)
	}
	sb.WriteString("; for the baseline, published = committed, which happens before its answer.\n")
	for i, r := range rep.Rounds {
		fmt.Fprintf(&sb, "- round %d: paystream %.0f, baseline %.0f deliveries/s end to end (%.2f×); all CPU %.0f and %.0f µs/delivery\n",
			i+1, r.Paystream, r.Baseline, r.Ratio, r.PaystreamCPU, r.BaselineCPU)
	}
	sb.WriteString("- The Kafka broker and Postgres are shared: their CPU and the WAL include anything else running on them during each run" +
		" (the baseline does not use Kafka: its broker figure is that background).\n")
	return sb.String()
}

// ratio formats a ÷ b.
func ratio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func (rep *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
