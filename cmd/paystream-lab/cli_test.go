package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/paystream/paystream/internal/cmdline/cmdlinetest"
	"github.com/paystream/paystream/internal/testenv"
)

// envRunMain makes the test binary act as paystream-lab: run(args) in a
// child process, so that exit statuses and what goes to stdout and stderr
// are observed as a user sees them.
const envRunMain = "PAYSTREAM_LAB_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		os.Exit(run(os.Args[1:]))
	}
	goleak.VerifyTestMain(testenv.Wrap(m))
}

type result struct {
	code           int
	stdout, stderr string
}

// lab runs run(args) in a child process whose environment has no
// PAYSTREAM_ setting except those in env ("NAME=value").
func lab(t *testing.T, env []string, args ...string) result {
	t.Helper()
	r := cmdlinetest.Run(t, envRunMain, 2*time.Minute, env, args...)
	return result{code: r.Code, stdout: r.Stdout, stderr: r.Stderr}
}

// TestKafkaSettingsValidated: simulate checks the Kafka TLS and SASL
// settings before it connects or sends anything, in paystream's words,
// and never prints the password.
func TestKafkaSettingsValidated(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sources := writeSources(t, loadgenSources)
	const password = "hunter2-do-not-print"
	missing := filepath.Join(dir, "no-ca.pem")
	db := "--database-url=postgres://paystream@127.0.0.1:1/paystream?sslmode=disable"
	for _, s := range []struct {
		env  []string
		want string
	}{
		{[]string{"PAYSTREAM_KAFKA_TLS_CA_FILE=" + missing}, "paystream-lab: kafka: --kafka-tls-ca-file " + missing + ": no such file\n"},
		{[]string{"PAYSTREAM_KAFKA_SASL_MECHANISM=SCRAM-SHA-512", "PAYSTREAM_KAFKA_SASL_PASSWORD=" + password},
			"paystream-lab: kafka: --kafka-sasl-mechanism SCRAM-SHA-512 needs --kafka-sasl-username\n"},
	} {
		env := append([]string{"PAYSTREAM_KAFKA_BROKERS=127.0.0.1:1"}, s.env...)
		r := lab(t, env, "simulate", "--sources", sources, "--verify", db)
		if r.code != 1 || r.stderr != s.want {
			t.Errorf("simulate with %q: exit %d, stderr %q; want exit 1 and %q", s.env, r.code, r.stderr, s.want)
		}
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Error("simulate printed the password")
		}
	}
}
