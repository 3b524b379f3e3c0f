package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// What the processes say about themselves: batch sizes from their metrics,
// and CPU profiles (-profile) for finding where the CPU goes.

// scrape reads the metric families of a Prometheus text exposition at url.
func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
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
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// sum adds up a counter family's values, or a histogram family's counts
// and sums, over their labels.
func sum(fams map[string]*dto.MetricFamily, name string) (value, count float64) {
	for _, m := range fams[name].GetMetric() {
		value += m.GetCounter().GetValue() + m.GetHistogram().GetSampleSum()
		count += float64(m.GetHistogram().GetSampleCount())
	}
	return value, count
}

// batchSizes reads the processor's and the sink's metrics after a run:
// deliveries per processor transaction and state events per Kafka
// transaction of the relay.
func (r *pipelineRun) batchSizes(ctx context.Context, res *result) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if fams, err := scrape(ctx, "http://"+r.processorMetrics+"/metrics"); err == nil {
		records, batches := sum(fams, "paystream_processor_batch_records")
		// Batches of several partitions share a transaction: count the
		// transactions (a binary from before that counted a transaction
		// per batch).
		txns := batches
		if shared, n := sum(fams, "paystream_processor_transaction_batches"); n > 0 {
			txns, res.BatchesPerTransaction = n, shared/n
		}
		if txns > 0 {
			res.ProcessorTransactions, res.DeliveriesPerTransaction = int64(txns), records/txns
		}
	} else {
		fmt.Fprintln(os.Stderr, "bench-e2e: processor metrics:", err)
	}
	if fams, err := scrape(ctx, "http://"+r.sinkMetrics+"/metrics"); err == nil {
		events, _ := sum(fams, "paystream_sink_events_published_total")
		if _, n := sum(fams, "paystream_sink_kafka_transaction_seconds"); n > 0 {
			res.SinkTransactions, res.EventsPerSinkTransaction = int64(n), events/n
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
