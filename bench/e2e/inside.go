package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// What the processes say about themselves: batch sizes from their metrics,
// and CPU profiles (-profile) for finding where the CPU goes.

// scrape reads the sums of the named counters and histogram series
// (name_sum, name_count, or a counter's name) from a Prometheus text
// exposition at url, summed over their labels.
func scrape(ctx context.Context, url string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			// Labels may hold spaces: the value is after the closing brace.
			name = line[:i]
			j := strings.LastIndexByte(line, '}')
			if j < 0 {
				continue
			}
			rest, ok = strings.TrimSpace(line[j+1:]), true
		}
		if !ok || !want[name] {
			continue
		}
		if f := strings.Fields(rest); len(f) > 0 {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				out[name] += v
			}
		}
	}
	return out, sc.Err()
}

// batchSizes reads the processor's and the sink's metrics after a run:
// deliveries per processor transaction and state events per Kafka
// transaction of the relay.
func (r *pipelineRun) batchSizes(ctx context.Context, res *result) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m, err := scrape(ctx, "http://"+r.processorMetrics+"/metrics",
		"paystream_processor_batch_records_sum", "paystream_processor_batch_records_count"); err == nil {
		if n := m["paystream_processor_batch_records_count"]; n > 0 {
			res.ProcessorTransactions = int64(n)
			res.DeliveriesPerTransaction = m["paystream_processor_batch_records_sum"] / n
		}
	} else {
		fmt.Fprintln(os.Stderr, "bench-e2e: processor metrics:", err)
	}
	if m, err := scrape(ctx, "http://"+r.sinkMetrics+"/metrics",
		"paystream_sink_events_published_total", "paystream_sink_kafka_transaction_seconds_count"); err == nil {
		if n := m["paystream_sink_kafka_transaction_seconds_count"]; n > 0 {
			res.SinkTransactions = int64(n)
			res.EventsPerSinkTransaction = m["paystream_sink_events_published_total"] / n
		}
	} else {
		fmt.Fprintln(os.Stderr, "bench-e2e: sink metrics:", err)
	}
}

// profile takes a CPU profile of each of the pipeline's processes at the
// same time, for seconds, starting after delay, into dir/<process>.pprof.
// It returns at once; wait on the result for the files.
func (r *pipelineRun) profile(ctx context.Context, dir string, delay, seconds time.Duration) *sync.WaitGroup {
	var wg sync.WaitGroup
	targets := map[string]string{
		"ingest":    "http://" + r.ingestMetrics,
		"processor": "http://" + r.processorMetrics,
		"sink":      "http://" + r.sinkMetrics,
	}
	for name, base := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, int(seconds.Seconds()))
			if err := download(ctx, url, filepath.Join(dir, name+".pprof")); err != nil {
				fmt.Fprintf(os.Stderr, "bench-e2e: profile of %s: %v\n", name, err)
			}
		}()
	}
	return &wg
}

func download(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
