package testenv

import (
	"os"
	"strings"
	"testing"
)

// Environment variables naming deploy/stack.sh's secured servers: the
// broker's SASL_SSL listener (SCRAM-SHA-512/256, PLAIN, OAUTHBEARER) and its
// SSL listener that requires a client certificate, the CA that signed their
// certificates, the SASL user, and Postgres with TLS. `deploy/stack.sh env`
// prints them all.
const (
	EnvKafkaSASLBrokers  = "PAYSTREAM_TEST_KAFKA_SASL_BROKERS"
	EnvKafkaSASLUsername = "PAYSTREAM_TEST_KAFKA_SASL_USERNAME"
	EnvKafkaSASLPassword = "PAYSTREAM_TEST_KAFKA_SASL_PASSWORD_FILE"
	EnvKafkaTLSCAFile    = "PAYSTREAM_TEST_KAFKA_TLS_CA_FILE"
	EnvKafkaMTLSBrokers  = "PAYSTREAM_TEST_KAFKA_MTLS_BROKERS"
	EnvKafkaTLSCertFile  = "PAYSTREAM_TEST_KAFKA_TLS_CERT_FILE"
	EnvKafkaTLSKeyFile   = "PAYSTREAM_TEST_KAFKA_TLS_KEY_FILE"
	EnvDatabaseTLSURL    = "PAYSTREAM_TEST_DATABASE_TLS_URL"
)

// SecuredKafka is the test broker's secured listeners.
type SecuredKafka struct {
	// SASLBrokers serve SASL_SSL: TLS with a certificate CAFile signed, and
	// SCRAM-SHA-512, SCRAM-SHA-256, PLAIN and OAUTHBEARER (unsecured JWTs).
	SASLBrokers []string
	// Username and PasswordFile are the SCRAM and PLAIN user's.
	Username     string
	PasswordFile string
	// CAFile is the PEM CA of every certificate of the stack.
	CAFile string
	// MTLSBrokers serve SSL and require a client certificate signed by
	// CAFile, such as CertFile with KeyFile.
	MTLSBrokers       []string
	CertFile, KeyFile string
}

// Secured returns the test broker's secured listeners from the
// environment. With PAYSTREAM_TEST_KAFKA_BROKERS set (the local stack, or
// servers of one's own) every variable must be set and name existing
// files, or the test fails: a missing listener is a broken setup, not a
// reason to skip. Without it the brokers are testenv's containers, which
// have no secured listener: the test is skipped.
func Secured(t testing.TB) SecuredKafka {
	t.Helper()
	SkipIfShort(t)
	if strings.TrimSpace(os.Getenv(EnvKafkaBrokers)) == "" {
		t.Skipf("testenv: %s is unset: the secured listeners are deploy/stack.sh's; testenv's Kafka container has none", EnvKafkaBrokers)
	}
	env := requireEnv(t, EnvKafkaBrokers, EnvKafkaSASLBrokers, EnvKafkaSASLUsername, EnvKafkaSASLPassword, EnvKafkaTLSCAFile,
		EnvKafkaMTLSBrokers, EnvKafkaTLSCertFile, EnvKafkaTLSKeyFile)
	for _, name := range []string{EnvKafkaSASLPassword, EnvKafkaTLSCAFile, EnvKafkaTLSCertFile, EnvKafkaTLSKeyFile} {
		if _, err := os.Stat(env[name]); err != nil {
			t.Fatalf("testenv: %s: %v (run 'deploy/stack.sh up')", name, err)
		}
	}
	return SecuredKafka{
		SASLBrokers: splitList(env[EnvKafkaSASLBrokers]), Username: env[EnvKafkaSASLUsername],
		PasswordFile: env[EnvKafkaSASLPassword], CAFile: env[EnvKafkaTLSCAFile],
		MTLSBrokers: splitList(env[EnvKafkaMTLSBrokers]),
		CertFile:    env[EnvKafkaTLSCertFile], KeyFile: env[EnvKafkaTLSKeyFile],
	}
}

// TLSURL returns a URL to the same schema as d.URL over TLS with
// sslmode=verify-full (PAYSTREAM_TEST_DATABASE_TLS_URL), failing the test
// as [Secured] does when that variable is missing.
func (d *DB) TLSURL(t testing.TB) string {
	t.Helper()
	if strings.TrimSpace(os.Getenv(EnvDatabaseURL)) == "" {
		t.Skipf("testenv: %s is unset: Postgres with TLS is deploy/stack.sh's; testenv's container has none", EnvDatabaseURL)
	}
	u := requireEnv(t, EnvDatabaseURL, EnvDatabaseTLSURL)[EnvDatabaseTLSURL]
	return withSearchPath(u, d.Schema)
}

// requireEnv returns the values of the named variables, failing the test
// with all those unset: they go with the variable set, which is.
func requireEnv(t testing.TB, set string, names ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	var missing []string
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			out[n] = v
		} else {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("testenv: %s set but not %s: run 'deploy/stack.sh up' and 'eval \"$(deploy/stack.sh env)\"' again (or set them for your own servers)",
			set, strings.Join(missing, ", "))
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
