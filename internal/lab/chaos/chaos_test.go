package chaos

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
)

// binary is paystream built for the test, run as ingest, processor and
// sink.
var binary string

func TestMain(m *testing.M) { testenv.MainWithBinary(m, &binary) }

// TestChaosSubset is `make chaos` in small, on the shared stack: the
// processor SIGKILLed three times, and every processor↔Postgres
// connection reset for 5 s, each while about 3,000 simulated webhooks flow.
// It checks that each fault was injected and recovered from, and that the
// simulation's invariants I1–I10 all hold (nothing acknowledged lost, no
// duplicate effect, every state event once and in order); it logs the
// table rows, recovery times included, without asserting on them.
func TestChaosSubset(t *testing.T) {
	testenv.SkipIfShort(t)
	brokers := testenv.Kafka(t)
	cfg := Config{
		Binary: binary, Brokers: brokers,
		NewSchema: func() (string, string, error) {
			db := testenv.NewDB(t)
			return db.URL, db.Schema, nil
		},
		Deliveries: 3000, Rate: 400, Partitions: 3, WorkDir: t.TempDir(),
		RecoveryTimeout: 2 * time.Minute,
		Logger:          slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	scenarios, err := Select([]string{"processor-sigkill", "pg-reset"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var table strings.Builder
	table.WriteString(TableHeader)
	for _, sc := range scenarios {
		r := Run(ctx, cfg, sc)
		table.WriteString(r.Row())
		if len(r.Faults) != len(sc.Faults) {
			t.Errorf("%s: %d of %d faults injected", sc.Name, len(r.Faults), len(sc.Faults))
		}
		for _, f := range r.Faults {
			if f.Error != "" {
				t.Errorf("%s: %s: %s", sc.Name, f.Name, f.Error)
			}
		}
		if r.Error != "" {
			t.Errorf("%s: %s (logs: %s)", sc.Name, r.Error, r.Logs)
		}
		if len(r.Invariants) != 10 {
			t.Errorf("%s: %d invariants checked, want I1–I10", sc.Name, len(r.Invariants))
		}
		for _, inv := range r.Invariants {
			if !inv.OK {
				t.Errorf("%s: %s %s: %s", sc.Name, inv.ID, inv.Name, inv.Detail)
			}
		}
		if r.Deliveries < cfg.Deliveries || r.Acked != r.Deliveries {
			t.Errorf("%s: %d deliveries, %d acknowledged; want at least %d, all acknowledged", sc.Name, r.Deliveries, r.Acked, cfg.Deliveries)
		}
		if t.Failed() {
			_ = WriteDetails(t.Output(), []Result{r})
		}
	}
	t.Logf("\n%s", table.String())
}
