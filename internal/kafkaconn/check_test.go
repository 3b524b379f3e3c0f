package kafkaconn

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// unsecuredJWT is a token Kafka's built-in (test-only) OAUTHBEARER
// validator accepts: alg none, subject sub, expiring at exp.
func unsecuredJWT(sub string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	now := time.Now().Add(-time.Minute).Unix()
	return enc([]byte(`{"alg":"none"}`)) + "." +
		enc(fmt.Appendf(nil, `{"sub":%q,"iat":%d,"exp":%d}`, sub, now, exp.Unix())) + "."
}

// secured returns the stack's SASL_SSL listener as a Config for mechanism,
// with the user's password file (PLAIN, SCRAM) or a fresh unsecured token
// (OAUTHBEARER).
func secured(t *testing.T, mechanism string) Config {
	t.Helper()
	s := testenv.Secured(t)
	cfg := Config{Brokers: s.SASLBrokers, TLS: true, TLSCAFile: s.CAFile, SASLMechanism: mechanism}
	if mechanism == MechanismOAuthBearer {
		cfg.SASLOAuthTokenFile = filepath.Join(t.TempDir(), "token")
		writeFile(t, cfg.SASLOAuthTokenFile, unsecuredJWT(s.Username, time.Now().Add(time.Hour))+"\n")
	} else {
		cfg.SASLUsername, cfg.SASLPasswordFile = s.Username, s.PasswordFile
	}
	return cfg
}

// produce produces one record to topic through cfg's options and waits for
// the broker's ack.
func produce(t *testing.T, cfg Config, topic string) error {
	t.Helper()
	opts, err := cfg.Opts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.RequestRetries(0))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(cfg.SASLMechanism)}).FirstErr()
}

// TestMechanismsAgainstTheBroker: every SASL mechanism the stack's broker
// enables, and mutual TLS, connect (Check) and produce with Opts.
func TestMechanismsAgainstTheBroker(t *testing.T) {
	t.Parallel()
	topic := testenv.Topic(t, "kafkaconn", 1)
	s := testenv.Secured(t)
	tests := map[string]Config{
		"SCRAM-SHA-512": secured(t, MechanismScramSHA512),
		"SCRAM-SHA-256": secured(t, MechanismScramSHA256),
		"PLAIN":         secured(t, MechanismPlain),
		"OAUTHBEARER":   secured(t, MechanismOAuthBearer),
		"mutual TLS": {Brokers: s.MTLSBrokers, TLS: true, TLSCAFile: s.CAFile,
			TLSCertFile: s.CertFile, TLSKeyFile: s.KeyFile},
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if err := cfg.Check(t.Context()); err != nil {
				t.Fatalf("Check: %v", err)
			}
			if err := produce(t, cfg, topic); err != nil {
				t.Fatalf("produce: %v", err)
			}
		})
	}
}

// TestCheckExplainsFailures: each misconfiguration fails Check at once
// with one line naming the setting to check.
func TestCheckExplainsFailures(t *testing.T) {
	t.Parallel()
	s := testenv.Secured(t)
	plaintext := testenv.Kafka(t)
	dir := t.TempDir()
	wrongPass := filepath.Join(dir, "wrong-password")
	writeFile(t, wrongPass, "not-the-password\n")
	expired := filepath.Join(dir, "expired-token")
	writeFile(t, expired, unsecuredJWT(s.Username, time.Now().Add(-time.Hour)))
	otherCA := newTestPKI(t).caFile
	sasl := s.SASLBrokers[0]

	tests := []struct {
		name string
		cfg  func() Config
		want string // the whole line
	}{
		{name: "wrong SCRAM password", cfg: func() Config {
			c := secured(t, MechanismScramSHA512)
			c.SASLPasswordFile = wrongPass
			return c
		}, want: `kafka: SASL authentication failed for user "paystream" (SCRAM-SHA-512) at ` + sasl + `: check --kafka-sasl-username and --kafka-sasl-password-file`},
		{name: "wrong PLAIN password", cfg: func() Config {
			c := secured(t, MechanismPlain)
			c.SASLPasswordFile, c.SASLPassword = "", "not-the-password"
			return c
		}, want: `kafka: SASL authentication failed for user "paystream" (PLAIN) at ` + sasl + `: check --kafka-sasl-username and --kafka-sasl-password`},
		{name: "unknown SCRAM user", cfg: func() Config {
			c := secured(t, MechanismScramSHA256)
			c.SASLUsername = "nobody"
			return c
		}, want: `kafka: SASL authentication failed for user "nobody" (SCRAM-SHA-256) at ` + sasl + `: check --kafka-sasl-username and --kafka-sasl-password-file`},
		{name: "expired token", cfg: func() Config {
			c := secured(t, MechanismOAuthBearer)
			c.SASLOAuthTokenFile = expired
			return c
		}, want: `kafka: SASL authentication failed (OAUTHBEARER) at ` + sasl + `: the broker rejected the token in --kafka-sasl-oauth-token-file ` + expired + ` (broker: {"status":"invalid_token"})`},
		{name: "wrong server name", cfg: func() Config {
			c := secured(t, MechanismScramSHA512)
			c.TLSServerName = "kafka.example.com"
			return c
		}, want: `kafka: TLS: the certificate of ` + sasl + ` is valid for localhost, not kafka.example.com: check --kafka-tls-server-name (or the broker address)`},
		{name: "another CA", cfg: func() Config {
			c := secured(t, MechanismScramSHA512)
			c.TLSCAFile = otherCA
			return c
		}, want: `kafka: TLS: the certificate of ` + sasl + ` is not signed by the CA in --kafka-tls-ca-file ` + otherCA + `: check it`},
		{name: "system roots", cfg: func() Config {
			c := secured(t, MechanismScramSHA512)
			c.TLSCAFile = ""
			return c
		}, want: `kafka: TLS: the certificate of ` + sasl + ` is signed by an authority the system does not trust: set --kafka-tls-ca-file to the cluster's CA`},
		{name: "no client certificate", cfg: func() Config {
			return Config{Brokers: s.MTLSBrokers, TLS: true, TLSCAFile: s.CAFile}
		}, want: `kafka: TLS: ` + s.MTLSBrokers[0] + ` refused the connection (tls: bad certificate): it may want a client certificate: set --kafka-tls-cert-file and --kafka-tls-key-file`},
		{name: "TLS to a plaintext listener", cfg: func() Config {
			return Config{Brokers: plaintext, TLS: true, TLSCAFile: s.CAFile}
		}, want: `kafka: TLS handshake with ` + plaintext[0] + ` failed: the broker closed the connection (a plaintext listener?): check --kafka-tls and the port`},
		{name: "plaintext to SASL_SSL", cfg: func() Config {
			return Config{Brokers: s.SASLBrokers}
		}, want: `kafka: ` + sasl + ` answered with TLS: the listener needs TLS: set --kafka-tls`},
		{name: "TLS without SASL to SASL_SSL", cfg: func() Config {
			return Config{Brokers: s.SASLBrokers, TLSCAFile: s.CAFile}
		}, want: `kafka: ` + sasl + ` closed the connection after the first request: the listener probably needs SASL: set --kafka-sasl-mechanism`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			err := tt.cfg().Check(t.Context())
			took := time.Since(start)
			var ex *Error
			if !errors.As(err, &ex) {
				t.Fatalf("Check() = %v, want a *kafkaconn.Error", err)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("Check() =\n  %s\nwant\n  %s", got, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("not one line: %q", err)
			}
			if errors.Is(err, ErrUnreachable) {
				t.Errorf("a setting to fix reported as unreachable: %v", err)
			}
			// At once, apart from the two retries of a closed connection.
			if took > 5*time.Second {
				t.Errorf("Check took %s, want a fast failure", took)
			}
		})
	}
}

// TestCheckUnreachable: nothing listening is not a setting to fix: the
// error wraps ErrUnreachable, and comes at once.
func TestCheckUnreachable(t *testing.T) {
	t.Parallel()
	testenv.SkipIfShort(t)
	start := time.Now()
	err := Config{Brokers: []string{"127.0.0.1:1"}}.Check(t.Context())
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "kafka: could not reach 127.0.0.1:1") {
		t.Fatalf("Check() = %v, want ErrUnreachable naming 127.0.0.1:1", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %s", took)
	}
}

// TestPasswordNeverInErrors: a failed authentication's error does not carry
// the password, whether given as a value or a file.
func TestPasswordNeverInErrors(t *testing.T) {
	t.Parallel()
	c := secured(t, MechanismScramSHA512)
	b, err := os.ReadFile(c.SASLPasswordFile)
	if err != nil {
		t.Fatal(err)
	}
	c.SASLPasswordFile, c.SASLPassword = "", strings.TrimSpace(string(b))+"x"
	err = c.Check(t.Context())
	if err == nil {
		t.Fatal("Check with a wrong password succeeded")
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if strings.Contains(e.Error(), c.SASLPassword) || strings.Contains(fmt.Sprintf("%+v", e), c.SASLPassword) {
			t.Fatalf("error carries the password: %v", e)
		}
	}
}
