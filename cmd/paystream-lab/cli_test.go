package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/cmdline/cmdlinetest"
	"github.com/paystream/paystream/internal/testenv"
)

// lab is the binary under test, run in child processes so that exit
// statuses and what goes to stdout and stderr are observed as a user sees
// them; Run leaves no PAYSTREAM_ setting in the child's environment but
// those it is given.
var lab = cmdlinetest.Binary{EnvVar: "PAYSTREAM_LAB_TEST_RUN_MAIN", Main: run, Timeout: 2 * time.Minute}

func TestMain(m *testing.M) { lab.TestMain(testenv.Wrap(m)) }

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
		r := lab.Run(t, env, "simulate", "--sources", sources, "--verify", db)
		if r.Code != 1 || r.Stderr != s.want {
			t.Errorf("simulate with %q: exit %d, stderr %q; want exit 1 and %q", s.env, r.Code, r.Stderr, s.want)
		}
		if strings.Contains(r.Stdout+r.Stderr, password) {
			t.Error("simulate printed the password")
		}
	}
}
