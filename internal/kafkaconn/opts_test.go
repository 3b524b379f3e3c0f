package kafkaconn

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
)

func TestOpts(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	pass := filepath.Join(pki.dir, "password")
	writeFile(t, pass, "s3cret\n")
	token := filepath.Join(pki.dir, "token")
	writeFile(t, token, "tok\n")

	tests := []struct {
		name       string
		cfg        Config
		wantErr    string
		tls        bool
		ownCA      bool // RootCAs from the CA file (else the system's: nil)
		clientCert bool
		serverName string
		mechanism  string // SASL mechanism's name, "" none
	}{
		{name: "plaintext", cfg: Config{Brokers: []string{" a:9092", "b:9092 "}}},
		{name: "tls with system roots", cfg: Config{Brokers: []string{"a:9093"}, TLS: true}, tls: true},
		{name: "tls implied by the CA file", cfg: Config{Brokers: []string{"a:9093"}, TLSCAFile: pki.caFile}, tls: true, ownCA: true},
		{name: "mutual tls", cfg: Config{Brokers: []string{"a:9093"}, TLS: true, TLSCAFile: pki.caFile, TLSCertFile: pki.certFile, TLSKeyFile: pki.keyFile, TLSServerName: "kafka.internal"},
			tls: true, ownCA: true, clientCert: true, serverName: "kafka.internal"},
		{name: "plain", cfg: Config{Brokers: []string{"a:9096"}, TLS: true, SASLMechanism: "PLAIN", SASLUsername: "u", SASLPassword: "p"}, tls: true, mechanism: "PLAIN"},
		{name: "scram-sha-256", cfg: Config{Brokers: []string{"a:9096"}, SASLMechanism: "scram-sha-256", SASLUsername: "u", SASLPasswordFile: pass}, mechanism: "SCRAM-SHA-256"},
		{name: "scram-sha-512", cfg: Config{Brokers: []string{"a:9096"}, TLS: true, SASLMechanism: "SCRAM-SHA-512", SASLUsername: "u", SASLPasswordFile: pass}, tls: true, mechanism: "SCRAM-SHA-512"},
		{name: "oauthbearer", cfg: Config{Brokers: []string{"a:9096"}, TLS: true, SASLMechanism: "OAUTHBEARER", SASLOAuthTokenFile: token}, tls: true, mechanism: "OAUTHBEARER"},
		{name: "invalid", cfg: Config{Brokers: []string{"a:9096"}, SASLMechanism: "SCRAM-SHA-512"}, wantErr: "kafka: --kafka-sasl-mechanism SCRAM-SHA-512 needs --kafka-sasl-username"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts, err := tt.cfg.Opts()
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Opts() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cl, err := kgo.NewClient(opts...) // dials nothing until used
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if got, want := fmt.Sprint(cl.OptValue(kgo.SeedBrokers)), fmt.Sprint(trimmed(tt.cfg.Brokers)); got != want {
				t.Errorf("seed brokers %s, want %s", got, want)
			}
			tc, _ := cl.OptValue(kgo.DialTLSConfig).(*tls.Config)
			if (tc != nil) != tt.tls {
				t.Fatalf("TLS config %v, want TLS %t", tc, tt.tls)
			}
			if tc != nil {
				if tc.MinVersion != tls.VersionTLS12 {
					t.Errorf("MinVersion %x, want TLS 1.2", tc.MinVersion)
				}
				if (tc.RootCAs != nil) != tt.ownCA {
					t.Errorf("RootCAs set: %t, want %t", tc.RootCAs != nil, tt.ownCA)
				}
				if tc.ServerName != tt.serverName {
					t.Errorf("ServerName %q, want %q", tc.ServerName, tt.serverName)
				}
				if (tc.GetClientCertificate != nil) != tt.clientCert {
					t.Errorf("client certificate: %t, want %t", tc.GetClientCertificate != nil, tt.clientCert)
				}
				if tc.GetClientCertificate != nil {
					if c, err := tc.GetClientCertificate(nil); err != nil || len(c.Certificate) == 0 {
						t.Errorf("GetClientCertificate() = %v, %v", c, err)
					}
				}
			}
			mechs, _ := cl.OptValue(kgo.SASL).([]sasl.Mechanism)
			var got string
			if len(mechs) > 0 {
				got = mechs[0].Name()
			}
			if got != tt.mechanism || len(mechs) > 1 {
				t.Errorf("SASL mechanisms %v, want %q", mechs, tt.mechanism)
			}
		})
	}
}

func trimmed(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.TrimSpace(s)
	}
	return out
}

// TestSecretsReadAtEachAuthentication: the mechanisms read the password
// and token files when a connection authenticates, so a rotated secret is
// used without a restart, and a file gone since the start fails that
// authentication naming the setting.
func TestSecretsReadAtEachAuthentication(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pass := filepath.Join(dir, "password")
	token := filepath.Join(dir, "token")
	tests := []struct {
		cfg  Config
		file string
		flag string
	}{
		{cfg: Config{SASLMechanism: "PLAIN", SASLUsername: "u", SASLPasswordFile: pass}, file: pass, flag: "--kafka-sasl-password-file"},
		{cfg: Config{SASLMechanism: "OAUTHBEARER", SASLOAuthTokenFile: token}, file: token, flag: "--kafka-sasl-oauth-token-file"},
	}
	for _, tt := range tests {
		m := tt.cfg.saslMechanism()
		writeFile(t, tt.file, "first\n")
		if got := clientFirst(t, m); !strings.Contains(got, "first") {
			t.Errorf("%s: first authentication sent %q, want the file's secret", tt.cfg.SASLMechanism, got)
		}
		writeFile(t, tt.file, "second\n")
		if got := clientFirst(t, m); !strings.Contains(got, "second") || strings.Contains(got, "\n") {
			t.Errorf("%s: after rotation sent %q, want the new secret without the newline", tt.cfg.SASLMechanism, got)
		}
		if err := os.Remove(tt.file); err != nil {
			t.Fatal(err)
		}
		_, _, err := m.Authenticate(context.Background(), "a:9096")
		if want := "kafka: " + tt.flag + " " + tt.file + ": no such file"; err == nil || err.Error() != want {
			t.Errorf("%s with the file gone: %v, want %q", tt.cfg.SASLMechanism, err, want)
		}
	}
}

func clientFirst(t *testing.T, m sasl.Mechanism) string {
	t.Helper()
	_, msg, err := m.Authenticate(context.Background(), "a:9096")
	if err != nil {
		t.Fatal(err)
	}
	return string(msg)
}

// TestAWSMSKIAM: the AWS_MSK_IAM mechanism signs with the credentials in
// the environment when a connection authenticates (read then, not at
// start), and its first message names the access key, never the secret.
// Not parallel: it sets the environment.
func TestAWSMSKIAM(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFIRST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret-first")
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_REGION", "us-east-1")
	cfg := Config{Brokers: []string{"b-1.example.kafka.us-east-1.amazonaws.com:9098"}, TLS: true, SASLMechanism: "aws_msk_iam"}
	opts, err := cfg.Opts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	mechs, _ := cl.OptValue(kgo.SASL).([]sasl.Mechanism)
	if len(mechs) != 1 || mechs[0].Name() != "AWS_MSK_IAM" {
		t.Fatalf("mechanisms %v, want AWS_MSK_IAM", mechs)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDROTATED")
	_, msg, err := mechs[0].Authenticate(context.Background(), "b-1.example.kafka.us-east-1.amazonaws.com:9098")
	if err != nil {
		t.Fatal(err)
	}
	if s := string(msg); !strings.Contains(s, "AKIDROTATED") || strings.Contains(s, "secret-first") || !strings.Contains(s, "us-east-1/kafka-cluster") {
		t.Errorf("first message %s: want the current access key and region, not the secret", s)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	if _, _, err := mechs[0].Authenticate(context.Background(), "b-1:9098"); err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Errorf("without credentials: %v, want an error naming AWS_ACCESS_KEY_ID", err)
	}
}
