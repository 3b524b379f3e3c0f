package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteText writes the result as a few human-readable lines: throughput,
// latency percentiles, status codes and errors.
func (r *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	target := "as fast as possible"
	if r.Rate > 0 {
		target = fmt.Sprintf("target %s/s", formatCount(r.Rate))
	}
	fmt.Fprintf(&b, "requests    %d in %s (%d workers, %s)\n", r.Sent, r.Elapsed.Round(time.Millisecond), r.Concurrency, target)
	fmt.Fprintf(&b, "throughput  %.1f req/s (2xx: %.1f/s)\n", r.Throughput(), float64(r.OK())/max(r.Elapsed.Seconds(), 1e-9))
	if r.Rate > 0 && r.Throughput() < 0.95*r.Rate {
		fmt.Fprintf(&b, "            below the target rate: the target or the load generator could not keep up\n")
	}
	l := r.Latency
	fmt.Fprintf(&b, "latency     p50 %s  p90 %s  p99 %s  max %s  (mean %s, %d answers)\n",
		FormatDuration(l.Quantile(0.50)), FormatDuration(l.Quantile(0.90)), FormatDuration(l.Quantile(0.99)),
		FormatDuration(l.Max()), FormatDuration(l.Mean()), l.Count())
	var codes []string
	for _, c := range r.StatusCodes() {
		codes = append(codes, fmt.Sprintf("%d: %d", c, r.Status[c]))
	}
	if len(codes) == 0 {
		codes = []string{"none"}
	}
	fmt.Fprintf(&b, "status      %s\n", strings.Join(codes, ", "))
	if r.Duplicates > 0 {
		fmt.Fprintf(&b, "duplicates  %d re-sent events\n", r.Duplicates)
	}
	if len(r.Errors) > 0 {
		var errs []string
		for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
			errs = append(errs, fmt.Sprintf("%s: %d", k, r.Errors[k]))
		}
		fmt.Fprintf(&b, "errors      %s\n", strings.Join(errs, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// jsonResult is the JSON form of a Result.
type jsonResult struct {
	Requests    int64            `json:"requests"`
	ElapsedSec  float64          `json:"elapsed_seconds"`
	Throughput  float64          `json:"throughput_rps"`
	TargetRate  float64          `json:"target_rps,omitempty"`
	Concurrency int              `json:"concurrency"`
	Duplicates  int64            `json:"duplicates"`
	Status      map[string]int64 `json:"status"`
	Errors      map[string]int64 `json:"errors"`
}

// MarshalJSON encodes the result with latencies in milliseconds.
func (r *Result) MarshalJSON() ([]byte, error) {
	status := map[string]int64{}
	for c, n := range r.Status {
		status[strconv.Itoa(c)] = n
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return json.Marshal(struct {
		jsonResult
		LatencyMillis map[string]float64 `json:"latency_ms"`
	}{
		jsonResult: jsonResult{
			Requests: r.Sent, ElapsedSec: r.Elapsed.Seconds(), Throughput: r.Throughput(), TargetRate: r.Rate,
			Concurrency: r.Concurrency, Duplicates: r.Duplicates, Status: status, Errors: r.Errors,
		},
		LatencyMillis: map[string]float64{
			"p50": ms(r.Latency.Quantile(0.50)), "p90": ms(r.Latency.Quantile(0.90)), "p99": ms(r.Latency.Quantile(0.99)),
			"max": ms(r.Latency.Max()), "mean": ms(r.Latency.Mean()),
		},
	})
}

// FormatDuration prints a latency with three significant digits: 850µs,
// 1.25ms, 12.3ms, 1.50s.
func FormatDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// formatCount prints a rate without needless decimals.
func formatCount(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}
