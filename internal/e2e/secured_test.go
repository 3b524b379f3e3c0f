package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/kafkaconn"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/testenv"
)

// saslFlags are the flags that connect a command to the stack's SASL_SSL
// listener as its SCRAM-SHA-512 user, the password read from passwordFile.
func saslFlags(sec testenv.SecuredKafka, passwordFile string) []string {
	return []string{"--kafka-brokers", strings.Join(sec.SASLBrokers, ","), "--kafka-tls-ca-file", sec.CAFile,
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", sec.Username,
		"--kafka-sasl-password-file", passwordFile}
}

// withAppName sets application_name in a URL-form connection string, so
// a test can find its commands' sessions on the shared server.
func withAppName(t *testing.T, dsn, name string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestPipelineOverSASLSSL runs the binary's migrate, ingest, processor and
// sink against the stack's real broker through its SASL_SSL listener only
// (TLS checked against the stack's CA, SCRAM-SHA-512, password from a
// file), with migrate, processor and sink on Postgres with
// sslmode=verify-full: a signed webhook is answered 200 and its state
// event reaches the state topic, read as a read_committed consumer over
// SASL_SSL; every Postgres session of processor and sink is encrypted; all
// of them stop cleanly.
func TestPipelineOverSASLSSL(t *testing.T) {
	t.Parallel()
	sec := testenv.Secured(t)
	db := testenv.NewDB(t)
	dbTLS := db.TLSURL(t)
	raw, state, dlq := testenv.Topic(t, "raw", 3), testenv.Topic(t, "state", 3), testenv.Topic(t, "dlq", 1)
	ckpt := testenv.Topic(t, "ckpt", 1)
	common := append(saslFlags(sec, sec.PasswordFile), "--raw-topic", raw, "--state-topic", state, "--dlq-topic", dlq, "--log-format", "json")

	// migrate: the sink's slot, and the raw topic's partition count the
	// processor checks, recorded over the same secured connections.
	mig := exec.Command(binary, append([]string{"migrate", "--database-url", dbTLS, "--checkpoint-topic", ckpt,
		"--partitions", "3", "--dlq-partitions", "1"}, common...)...)
	mig.Env = testenv.Environ()
	if out, err := mig.CombinedOutput(); err != nil {
		t.Fatalf("paystream migrate: %v\n%s", err, out)
	}

	procApp, sinkApp := "sasl-processor-"+db.Schema, "sasl-sink-"+db.Schema
	proc := startBin(t, "paystream processor", append([]string{"processor", "--database-url", withAppName(t, dbTLS, procApp),
		"--group", testenv.Group(t), "--session-timeout", "6s"}, common...)...)
	snk := startBin(t, "paystream sink", append([]string{"sink", "--database-url", withAppName(t, dbTLS, sinkApp),
		"--checkpoint-topic", ckpt, "--heartbeat-interval", "1s"}, common...)...)
	addr := testenv.FreeAddr(t)
	ing := startBin(t, "paystream ingest", append([]string{"ingest", "--sources", acmeSources(t, t.TempDir()), "--http-addr", addr, "--metrics-addr", "127.0.0.1:0"}, common...)...)
	testenv.WaitFor(t, time.Minute, func() error {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})

	now := time.Now()
	body := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_sasl_1","amount":4200,"currency":"BRL"}}`,
		now.UTC().Format(time.RFC3339))
	if code := postSigned(t, "http://"+addr, "acme", "msg_sasl_1", now, body); code != http.StatusOK {
		t.Fatalf("signed webhook: status %d, want 200", code)
	}

	// The state topic, read over SASL_SSL as a data team would.
	opts, err := kafkaconn.Config{Brokers: sec.SASLBrokers, TLSCAFile: sec.CAFile, SASLMechanism: kafkaconn.MechanismScramSHA512,
		SASLUsername: sec.Username, SASLPasswordFile: sec.PasswordFile}.Opts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(state), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var got *stateRecord
	for got == nil {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no state event for acme:pay_sasl_1 within a minute")
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("consume %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if sr := decodeState(t, r); string(r.Key) == "acme:pay_sasl_1" {
				got = &sr
			}
		})
	}
	if got.ev.Status != payment.StatusPaid || got.eventID != "acme:pay_sasl_1:1" {
		t.Errorf("state event %s: status %s, want %s as version 1", got.eventID, got.ev.Status, payment.StatusPaid)
	}

	// Every Postgres session of the processor and the sink is encrypted.
	for _, app := range []string{procApp, sinkApp} {
		var sessions, encrypted int
		if err := db.Pool.QueryRow(ctx, `
			SELECT count(*), count(*) FILTER (WHERE s.ssl)
			  FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1`, app).Scan(&sessions, &encrypted); err != nil {
			t.Fatal(err)
		}
		if sessions == 0 || encrypted != sessions {
			t.Errorf("%s: %d of %d Postgres sessions over TLS, want all and at least one", app, encrypted, sessions)
		}
	}

	for _, p := range []*binProc{ing, proc, snk} {
		p.terminate(t, 30*time.Second)
	}
}

// postSigned posts a Standard Webhooks request signed with testSecret to
// base's /webhooks/{source} and returns the status (0 when it got no
// answer at all).
func postSigned(t *testing.T, base, source, id string, ts time.Time, body string) int {
	t.Helper()
	req, err := signedRequest(base, source, id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestWrongKafkaCredentialsFailFast: ingest, processor and sink given a
// wrong SASL password, and tail given a wrong TLS server name, exit 1 within
// seconds with exactly one line on stderr saying what failed and which flag
// to check; ingest never answers a webhook meanwhile (it has not even
// listened), so nothing is acknowledged that was not produced.
func TestWrongKafkaCredentialsFailFast(t *testing.T) {
	t.Parallel()
	sec := testenv.Secured(t)
	db := testenv.NewDB(t)
	wrong := filepath.Join(t.TempDir(), "wrong-password")
	if err := os.WriteFile(wrong, []byte("not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sasl := sec.SASLBrokers[0]
	authFailed := `paystream: kafka: SASL authentication failed for user "paystream" (SCRAM-SHA-512) at ` + sasl +
		": check --kafka-sasl-username and --kafka-sasl-password-file\n"
	addr := testenv.FreeAddr(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"ingest", append([]string{"ingest", "--sources", acmeSources(t, t.TempDir()), "--http-addr", addr}, saslFlags(sec, wrong)...), authFailed},
		{"processor", append([]string{"processor", "--database-url", db.URL}, saslFlags(sec, wrong)...), authFailed},
		{"sink", append([]string{"sink", "--database-url", db.URL}, saslFlags(sec, wrong)...), authFailed},
		{"tail", append([]string{"tail", "--kafka-tls-server-name", "kafka.example.com"}, saslFlags(sec, sec.PasswordFile)...),
			"paystream: kafka: TLS: the certificate of " + sasl + " is valid for localhost, not kafka.example.com: check --kafka-tls-server-name (or the broker address)\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(binary, tc.args...)
			cmd.Env = testenv.Environ("GORACE=atexit_sleep_ms=0")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			start := time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()

			// ingest's would-be clients, until it exits: none may get an
			// answer (a 2xx least of all).
			var answered []int
			var posts sync.WaitGroup
			stop := make(chan struct{})
			if tc.name == "ingest" {
				posts.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						case <-time.After(20 * time.Millisecond):
						}
						now := time.Now()
						body := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_x","amount":1,"currency":"BRL"}}`, now.UTC().Format(time.RFC3339))
						if code := postSigned(t, "http://"+addr, "acme", fmt.Sprintf("msg_%d", i), now, body); code != 0 {
							answered = append(answered, code)
						}
					}
				})
			}
			var err error
			select {
			case err = <-exited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
				t.Fatalf("%s still running 30s after start with a wrong setting; stderr:\n%s", tc.name, stderr.String())
			}
			took := time.Since(start)
			close(stop)
			posts.Wait()

			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("exit: %v, want status 1", err)
			}
			if stderr.String() != tc.want {
				t.Errorf("stderr:\n%q\nwant exactly\n%q", stderr.String(), tc.want)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout: %q, want nothing", stdout.String())
			}
			if len(answered) > 0 {
				t.Errorf("ingest answered %v before exiting, want no answer at all", answered)
			}
			t.Logf("%s exited after %s", tc.name, took.Round(time.Millisecond))
		})
	}
}
