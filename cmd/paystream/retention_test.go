package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
)

// TestRetentionMetricsFile: paystream retention --metrics-file writes,
// after a successful run, the time of that success in Prometheus text
// format (for node_exporter's textfile collector); a dry run writes
// nothing.
func TestRetentionMetricsFile(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	file := filepath.Join(t.TempDir(), "retention.prom")
	env := []string{"PAYSTREAM_DATABASE_URL=" + db.URL}

	if r := paystream.Run(t, env, "retention", "--dry-run", "--metrics-file", file); r.Code != 0 {
		t.Fatalf("retention --dry-run: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("a dry run wrote %s (%v)", file, err)
	}
	before := time.Now()
	r := paystream.Run(t, env, "retention", "--metrics-file", file)
	if r.Code != 0 {
		t.Fatalf("retention: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^paystream_retention_last_success_timestamp_seconds (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s has no last success:\n%s", file, b)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	if at := time.Unix(0, int64(v*1e9)); at.Before(before.Add(-time.Second)) || at.After(time.Now()) {
		t.Errorf("last success at %s, want during the run (after %s)", at, before)
	}
}
