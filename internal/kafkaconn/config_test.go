package kafkaconn

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidate is not parallel: its AWS cases set the environment.
func TestValidate(t *testing.T) {
	pki := newTestPKI(t)
	pass := filepath.Join(pki.dir, "password")
	writeFile(t, pass, "s3cret\n")
	empty := filepath.Join(pki.dir, "empty")
	writeFile(t, empty, "\n")
	token := filepath.Join(pki.dir, "token")
	writeFile(t, token, "eyJhbGciOiJub25lIn0.eyJzdWIiOiJwYXlzdHJlYW0ifQ.\n")
	missing := filepath.Join(pki.dir, "missing")
	brokers := []string{"127.0.0.1:59094"}

	tests := []struct {
		name string
		cfg  Config
		aws  map[string]string // environment for AWS_MSK_IAM
		want string            // "" = valid; else the whole message
	}{
		{name: "plaintext", cfg: Config{Brokers: brokers}},
		{name: "no brokers", cfg: Config{},
			want: "kafka: --kafka-brokers: no brokers (set it or PAYSTREAM_KAFKA_BROKERS)"},
		{name: "blank broker", cfg: Config{Brokers: []string{" "}},
			want: `kafka: --kafka-brokers " ": want HOST:PORT`},
		{name: "url as broker", cfg: Config{Brokers: []string{"kafka://b:9092"}},
			want: `kafka: --kafka-brokers "kafka://b:9092": want HOST:PORT`},
		{name: "tls, system roots", cfg: Config{Brokers: brokers, TLS: true}},
		{name: "tls with a CA", cfg: Config{Brokers: brokers, TLS: true, TLSCAFile: pki.caFile}},
		{name: "CA file missing", cfg: Config{Brokers: brokers, TLS: true, TLSCAFile: missing},
			want: "kafka: --kafka-tls-ca-file " + missing + ": no such file"},
		{name: "CA file without a certificate", cfg: Config{Brokers: brokers, TLSCAFile: pki.junkFile},
			want: "kafka: --kafka-tls-ca-file " + pki.junkFile + ": no PEM certificate in it"},
		{name: "CA file is a directory", cfg: Config{Brokers: brokers, TLSCAFile: pki.dir},
			want: "kafka: --kafka-tls-ca-file " + pki.dir + ": is a directory"},
		{name: "client certificate", cfg: Config{Brokers: brokers, TLS: true, TLSCAFile: pki.caFile, TLSCertFile: pki.certFile, TLSKeyFile: pki.keyFile}},
		{name: "certificate without key", cfg: Config{Brokers: brokers, TLSCertFile: pki.certFile},
			want: "kafka: --kafka-tls-cert-file is set but --kafka-tls-key-file is not: a client certificate needs its key"},
		{name: "key without certificate", cfg: Config{Brokers: brokers, TLSKeyFile: pki.keyFile},
			want: "kafka: --kafka-tls-key-file is set but --kafka-tls-cert-file is not: a client key needs its certificate"},
		{name: "key file missing", cfg: Config{Brokers: brokers, TLSCertFile: pki.certFile, TLSKeyFile: missing},
			want: "kafka: --kafka-tls-key-file " + missing + ": no such file"},
		{name: "certificate file holds a key", cfg: Config{Brokers: brokers, TLSCertFile: pki.keyFile, TLSKeyFile: pki.keyFile},
			want: "kafka: --kafka-tls-cert-file " + pki.keyFile + ": no PEM certificate in it"},
		{name: "key does not match", cfg: Config{Brokers: brokers, TLSCertFile: pki.certFile, TLSKeyFile: pki.caFile},
			want: "kafka: --kafka-tls-cert-file " + pki.certFile + " and --kafka-tls-key-file " + pki.caFile + ": tls: found a certificate rather than a key in the PEM for the private key"},
		{name: "server name with a port", cfg: Config{Brokers: brokers, TLSServerName: "kafka:9093"},
			want: `kafka: --kafka-tls-server-name "kafka:9093": want a host name`},
		{name: "scram with password file", cfg: Config{Brokers: brokers, SASLMechanism: "SCRAM-SHA-512", SASLUsername: "u", SASLPasswordFile: pass}},
		{name: "mechanism case ignored", cfg: Config{Brokers: brokers, SASLMechanism: "scram-sha-256", SASLUsername: "u", SASLPassword: "p"}},
		{name: "plain with password", cfg: Config{Brokers: brokers, SASLMechanism: "PLAIN", SASLUsername: "u", SASLPassword: "p"}},
		{name: "unknown mechanism", cfg: Config{Brokers: brokers, SASLMechanism: "GSSAPI"},
			want: `kafka: --kafka-sasl-mechanism "GSSAPI": want one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, AWS_MSK_IAM`},
		{name: "scram without user", cfg: Config{Brokers: brokers, SASLMechanism: "SCRAM-SHA-512", SASLPassword: "p"},
			want: "kafka: --kafka-sasl-mechanism SCRAM-SHA-512 needs --kafka-sasl-username"},
		{name: "scram without password", cfg: Config{Brokers: brokers, SASLMechanism: "SCRAM-SHA-512", SASLUsername: "u"},
			want: "kafka: --kafka-sasl-mechanism SCRAM-SHA-512 needs --kafka-sasl-password-file (or --kafka-sasl-password)"},
		{name: "both passwords", cfg: Config{Brokers: brokers, SASLMechanism: "PLAIN", SASLUsername: "u", SASLPassword: "p", SASLPasswordFile: pass},
			want: "kafka: both --kafka-sasl-password and --kafka-sasl-password-file are set: keep one (the file)"},
		{name: "password file missing", cfg: Config{Brokers: brokers, SASLMechanism: "PLAIN", SASLUsername: "u", SASLPasswordFile: missing},
			want: "kafka: --kafka-sasl-password-file " + missing + ": no such file"},
		{name: "password file empty", cfg: Config{Brokers: brokers, SASLMechanism: "PLAIN", SASLUsername: "u", SASLPasswordFile: empty},
			want: "kafka: --kafka-sasl-password-file " + empty + ": empty file"},
		{name: "user without mechanism", cfg: Config{Brokers: brokers, SASLUsername: "u"},
			want: "kafka: --kafka-sasl-username is set but --kafka-sasl-mechanism is not: set the mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, AWS_MSK_IAM)"},
		{name: "password file without mechanism", cfg: Config{Brokers: brokers, SASLPasswordFile: pass},
			want: "kafka: --kafka-sasl-password-file is set but --kafka-sasl-mechanism is not: set the mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, AWS_MSK_IAM)"},
		{name: "token file with scram", cfg: Config{Brokers: brokers, SASLMechanism: "SCRAM-SHA-256", SASLUsername: "u", SASLPassword: "p", SASLOAuthTokenFile: token},
			want: "kafka: --kafka-sasl-oauth-token-file is set but --kafka-sasl-mechanism is SCRAM-SHA-256, not OAUTHBEARER"},
		{name: "oauth", cfg: Config{Brokers: brokers, TLS: true, SASLMechanism: "OAUTHBEARER", SASLOAuthTokenFile: token}},
		{name: "oauth without token file", cfg: Config{Brokers: brokers, SASLMechanism: "OAUTHBEARER"},
			want: "kafka: --kafka-sasl-mechanism OAUTHBEARER needs --kafka-sasl-oauth-token-file"},
		{name: "oauth token file missing", cfg: Config{Brokers: brokers, SASLMechanism: "OAUTHBEARER", SASLOAuthTokenFile: missing},
			want: "kafka: --kafka-sasl-oauth-token-file " + missing + ": no such file"},
		{name: "oauth with a user", cfg: Config{Brokers: brokers, SASLMechanism: "OAUTHBEARER", SASLOAuthTokenFile: token, SASLUsername: "u"},
			want: "kafka: --kafka-sasl-username is set but --kafka-sasl-mechanism OAUTHBEARER takes no user name or password"},
		{name: "msk iam", cfg: Config{Brokers: brokers, TLS: true, SASLMechanism: "AWS_MSK_IAM"},
			aws: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}},
		{name: "msk iam without tls", cfg: Config{Brokers: brokers, SASLMechanism: "AWS_MSK_IAM"},
			aws:  map[string]string{"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"},
			want: "kafka: --kafka-sasl-mechanism AWS_MSK_IAM needs --kafka-tls (MSK's IAM listener, port 9098, is TLS only)"},
		{name: "msk iam without credentials", cfg: Config{Brokers: brokers, TLS: true, SASLMechanism: "AWS_MSK_IAM"},
			aws:  map[string]string{"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
			want: "kafka: --kafka-sasl-mechanism AWS_MSK_IAM needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment"},
		{name: "msk iam without secret", cfg: Config{Brokers: brokers, TLS: true, SASLMechanism: "AWS_MSK_IAM"},
			aws:  map[string]string{"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": ""},
			want: "kafka: --kafka-sasl-mechanism AWS_MSK_IAM: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"},
		{name: "msk iam with a password", cfg: Config{Brokers: brokers, TLS: true, SASLMechanism: "AWS_MSK_IAM", SASLPassword: "p"},
			aws:  map[string]string{"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"},
			want: "kafka: --kafka-sasl-password is set but --kafka-sasl-mechanism AWS_MSK_IAM takes no user name or password"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.aws != nil {
				for k, v := range tt.aws {
					t.Setenv(k, v) // no t.Parallel: the environment is the process's
				}
			} else {
				t.Parallel()
			}
			err := tt.cfg.Validate()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("Validate() = %q\n                 want %q", got, tt.want)
			}
			if strings.Contains(got, "\n") {
				t.Errorf("Validate's error spans lines: %q", got)
			}
		})
	}
}

func TestWarnings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg  Config
		want []string
	}{
		{cfg: Config{SASLMechanism: "PLAIN"}, want: []string{"kafka: --kafka-sasl-mechanism PLAIN without --kafka-tls sends the password in cleartext"}},
		{cfg: Config{SASLMechanism: "oauthbearer"}, want: []string{"kafka: --kafka-sasl-mechanism OAUTHBEARER without --kafka-tls sends the token in cleartext"}},
		{cfg: Config{SASLMechanism: "PLAIN", TLS: true}},
		{cfg: Config{SASLMechanism: "PLAIN", TLSCAFile: "/ca.pem"}},
		{cfg: Config{SASLMechanism: "SCRAM-SHA-512"}}, // SCRAM never sends the password
		{cfg: Config{}},
	}
	for _, tt := range tests {
		if got := tt.cfg.Warnings(); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%v: Warnings() = %q, want %q", tt.cfg, got, tt.want)
		}
	}
}

// TestSecretsNeverPrinted: String, %v, %+v, %#v and slog show that a
// password is set, never the password.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	const secret = "hunter2-very-secret"
	cfg := Config{Brokers: []string{"b:9096"}, TLS: true, SASLMechanism: "SCRAM-SHA-512", SASLUsername: "paystream", SASLPassword: secret}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("kafka", "config", cfg)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("kafka", "config", cfg)
	for _, s := range []string{cfg.String(), fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%v", &cfg), logged.String()} {
		if strings.Contains(s, secret) {
			t.Errorf("printed the password: %s", s)
		}
		if !strings.Contains(s, "[redacted]") || !strings.Contains(s, "paystream") {
			t.Errorf("want the user and a redacted password in %s", s)
		}
	}
	if want := "brokers=b:9096 tls=true sasl=SCRAM-SHA-512 user=paystream password=[redacted]"; cfg.String() != want {
		t.Errorf("String() = %q, want %q", cfg.String(), want)
	}
}
