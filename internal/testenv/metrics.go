package testenv

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics are metric families by name, as [Gather] and [Scrape] return
// them.
type Metrics map[string]*dto.MetricFamily

// Gather returns the metric families g (a *prometheus.Registry) holds.
func Gather(t testing.TB, g prometheus.Gatherer) Metrics {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("testenv: gather metrics: %v", err)
	}
	out := Metrics{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// Scrape fetches url (a /metrics endpoint) and parses its text exposition.
// It fails the test unless the endpoint answers 200 within 5s.
func Scrape(t testing.TB, url string) Metrics {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("testenv: scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("testenv: scrape %s: %s %v", url, resp.Status, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("testenv: parse the metrics of %s: %v", url, err)
	}
	return fams
}

// Sum sums the series of family name whose labels include labels (nil:
// every series): counters, gauges and untyped values, and the sample
// counts of histograms and summaries. It is 0 when no series matches.
func (m Metrics) Sum(name string, labels map[string]string) float64 {
	var sum float64
	for _, s := range m.Series(name, labels) {
		sum += s.GetCounter().GetValue() + s.GetGauge().GetValue() + s.GetUntyped().GetValue() +
			float64(s.GetHistogram().GetSampleCount()) + float64(s.GetSummary().GetSampleCount())
	}
	return sum
}

// Series returns the series of family name whose labels include labels
// (nil: every series).
func (m Metrics) Series(name string, labels map[string]string) []*dto.Metric {
	var out []*dto.Metric
series:
	for _, s := range m[name].GetMetric() {
		have := map[string]string{}
		for _, l := range s.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue series
			}
		}
		out = append(out, s)
	}
	return out
}
