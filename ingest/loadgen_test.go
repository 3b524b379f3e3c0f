package ingest_test

import (
	"testing"
	"time"

	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/testenv"
)

// TestLoadGeneratorIsAccepted: the load generator's webhooks, for every
// driver and every step of a payment's life, duplicates included, are all
// accepted by ingest and on the raw topic — none dead-lettered or dropped
// as irrelevant — so a load test measures the real path.
func TestLoadGeneratorIsAccepted(t *testing.T) {
	eachServer(t, func(t *testing.T, server string) {
		b := setup(t, server, nil)
		srcs, err := loadgen.ParseSources([]byte(sourcesYAML))
		if err != nil {
			t.Fatal(err)
		}
		var builders []*loadgen.Builder
		for _, s := range srcs {
			if s.Name == "tiny" {
				continue // its body limit is below every generated body
			}
			bl, err := loadgen.NewBuilder(s, "ig"+uniq(), 7)
			if err != nil {
				t.Fatal(err)
			}
			builders = append(builders, bl)
		}
		gen, err := loadgen.NewGenerator(loadgen.GeneratorConfig{Builders: builders, Payments: 21, Duplicates: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		const n = 300 // every payment gets past step 3
		res, err := loadgen.Run(t.Context(), loadgen.Config{URL: b.url, Generator: gen, Concurrency: 8, Requests: n, Client: loadgen.NewClient(8, 10*time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		if res.Sent != n || res.Status[200] != n {
			t.Fatalf("sent %d, status %v, errors %v; want %d × 200", res.Sent, res.Status, res.Errors, n)
		}
		if got := testenv.EndOffsetSum(t, b.brokers, b.raw); got != n {
			t.Errorf("raw topic holds %d records, want %d", got, n)
		}
		if got := testenv.EndOffsetSum(t, b.brokers, b.dlq); got != 0 {
			t.Errorf("DLQ holds %d records, want 0", got)
		}
		mfs := scrape(t, b.url)
		for _, bl := range builders {
			if v, _ := metricValue(mfs, "paystream_ingest_requests_total", map[string]string{"source": bl.Source().Name, "outcome": "irrelevant"}); v != 0 {
				t.Errorf("%s: %v requests irrelevant", bl.Source().Name, v)
			}
		}
	})
}
