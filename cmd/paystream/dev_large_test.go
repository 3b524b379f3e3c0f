package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// TestDevAcceptsLargestBody: in `paystream dev`, on the embedded kfake
// (which, like Kafka, refuses batches over 1,048,588 bytes unless the
// topic allows more) and on the real broker, a signed body of exactly
// max_body_bytes (1 MiB) is answered 200 and processed into a paid
// payment: ingest produces it, the processor fetches it (a record larger
// than the fetch limits is still returned) and applies it.
func TestDevAcceptsLargestBody(t *testing.T) {
	t.Parallel()
	t.Run("kfake", func(t *testing.T) {
		t.Parallel()
		devLargestBody(t, nil)
	})
	t.Run("broker", func(t *testing.T) {
		t.Parallel()
		brokers := testenv.Kafka(t)
		u := strings.TrimPrefix(testenv.Group(t), "g-")
		raw, state, dlq := "raw-"+u, "state-"+u, "dlq-"+u
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = kadm.NewClient(cl).DeleteTopics(ctx, raw, state, dlq)
		})
		devLargestBody(t, []string{"PAYSTREAM_KAFKA_BROKERS=" + strings.Join(brokers, ","),
			"PAYSTREAM_RAW_TOPIC=" + raw, "PAYSTREAM_STATE_TOPIC=" + state, "PAYSTREAM_DLQ_TOPIC=" + dlq})
	})
}

func devLargestBody(t *testing.T, env []string) {
	db := testenv.NewDB(t)
	// dev creates the schema's replication slot; on the shared server it
	// would hold WAL after the test. Runs after dev stopped (below).
	t.Cleanup(func() {
		ctx := context.Background()
		slot, err := sink.Slot(ctx, db.Pool)
		if err != nil {
			t.Error(err)
			return
		}
		testenv.WaitFor(t, 30*time.Second, func() error {
			_, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
			return err
		})
		_, _ = db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize())
	})
	dir := t.TempDir()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	sources := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(sources, []byte("sources:\n  - name: acme\n    driver: standardwebhooks\n    secrets: [\""+secret+"\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)

	cmd := paystream.Command(context.Background(), append([]string{"PAYSTREAM_DATABASE_URL=" + db.URL}, env...),
		"dev", "--data-dir", filepath.Join(dir, "data"), "--sources", sources, "--http-addr", addr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("paystream dev stderr:\n%s", stderr.String())
		}
	})

	now := time.Now()
	base := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_big","amount":1050,"currency":"BRL"},"pad":""}`, now.UTC().Format(time.RFC3339))
	pad := make([]byte, 1<<20) // random hex: the producer's snappy cannot shrink it below kfake's default limit
	_, _ = rand.Read(pad)
	body := base[:len(base)-2] + hex.EncodeToString(pad)[:1<<20-len(base)] + `"}`
	sig, err := standardwebhooks.Sign(secret, "msg_big", now, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var status int
	testenv.WaitFor(t, 60*time.Second, func() error {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/webhooks/acme", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("webhook-id", "msg_big")
		req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
		req.Header.Set("webhook-signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err // not listening yet
		}
		resp.Body.Close()
		if status = resp.StatusCode; status != http.StatusOK {
			return fmt.Errorf("status %d", status)
		}
		return nil
	})
	testenv.WaitFor(t, 60*time.Second, func() error {
		var s string
		err := db.Pool.QueryRow(t.Context(), `SELECT status FROM payments WHERE payment_key = 'acme:pay_big'`).Scan(&s)
		if err != nil || s != "paid" {
			return fmt.Errorf("payment acme:pay_big: %q, %v", s, err)
		}
		return nil
	})
}
