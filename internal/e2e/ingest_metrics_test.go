package e2e

import (
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
)

// TestIngestMetricsOffTheWebhookPort: `paystream ingest` serves /metrics
// on --metrics-addr (127.0.0.1:9090 unless set) and not on --http-addr,
// which gateways and anyone else reach; --metrics-on-http-addr puts it there
// too, for those who ask. Before, /metrics was next to the webhooks unless
// --metrics-addr was set.
func TestIngestMetricsOffTheWebhookPort(t *testing.T) {
	testenv.SkipIfShort(t)
	t.Parallel()
	help, err := exec.Command(binary, "ingest", "--help").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(help), `--metrics-addr="127.0.0.1:9090"`) {
		t.Errorf("paystream ingest --help does not give --metrics-addr the default 127.0.0.1:9090:\n%s", help)
	}
	brokers := strings.Join(testenv.Kafka(t), ",")
	for _, c := range []struct {
		name     string
		flags    []string
		wantHTTP int
	}{
		{"default", nil, http.StatusNotFound},
		{"metrics on the http address", []string{"--metrics-on-http-addr"}, http.StatusOK},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			addr, metrics := testenv.FreeAddr(t), testenv.FreeAddr(t)
			startBin(t, "paystream ingest", append([]string{"ingest", "--kafka-brokers", brokers,
				"--sources", acmeSources(t, t.TempDir()), "--http-addr", addr, "--metrics-addr", metrics}, c.flags...)...)
			testenv.WaitFor(t, time.Minute, func() error {
				_, err := getStatus(http.DefaultClient, "http://"+addr+"/readyz")
				return err
			})
			if code, _ := getBody(t, "http://"+addr+"/metrics"); code != c.wantHTTP {
				t.Errorf("/metrics on --http-addr: %d, want %d", code, c.wantHTTP)
			}
			code, body := getBody(t, "http://"+metrics+"/metrics")
			if code != http.StatusOK || !strings.Contains(body, "paystream_ingest_connections_open") {
				t.Errorf("/metrics on --metrics-addr: %d, want 200 with ingest's metrics", code)
			}
		})
	}
}

// getBody GETs u and returns the status and the body.
func getBody(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
