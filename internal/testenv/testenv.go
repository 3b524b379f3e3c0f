// Package testenv gives integration tests the real Postgres and Kafka they
// run against, isolated per test: a freshly migrated schema per [NewDB], a
// uniquely named topic per [Topic], a unique consumer group per [Group]. It
// also has the wait helpers tests use instead of sleeps ([Eventually],
// [WaitFor]).
//
// The servers come from the environment:
//
//   - PAYSTREAM_TEST_DATABASE_URL: a database the tests may create schemas
//     in, e.g. postgres://paystream@127.0.0.1:55432/paystream?sslmode=disable.
//   - PAYSTREAM_TEST_KAFKA_BROKERS: comma-separated seed brokers, e.g.
//     127.0.0.1:59092.
//   - PAYSTREAM_TEST_KAFKA_SASL_*, _MTLS_BROKERS, _TLS_* and
//     PAYSTREAM_TEST_DATABASE_TLS_URL: the stack's secured listeners and
//     Postgres over TLS, for the tests of secured connections ([Secured],
//     [DB.TLSURL]).
//
// `make stack-up` starts both locally and `eval "$(deploy/stack.sh env)"`
// sets the variables. When a variable is unset and a Docker engine answers,
// testenv starts the server in a container instead (postgres:16,
// apache/kafka:4.1.1), once per test binary; a package whose tests may do
// that calls [Main] (or [Wrap]) from TestMain so the containers go away
// with the binary. With neither, the test fails, saying how to get a stack:
// a missing database is a broken setup, not a reason to skip.
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"unicode"

	"go.uber.org/goleak"
)

// Environment variables naming the servers tests use.
const (
	EnvDatabaseURL  = "PAYSTREAM_TEST_DATABASE_URL"
	EnvKafkaBrokers = "PAYSTREAM_TEST_KAFKA_BROKERS"
)

// howToStart ends every "no server" failure.
const howToStart = `run 'make stack-up' and 'eval "$(deploy/stack.sh env)"', or set ` +
	EnvDatabaseURL + ` and ` + EnvKafkaBrokers + `, or start Docker`

// SkipIfShort skips t under `go test -short` (`make test-short`), which runs
// only the tests that need no Postgres, Kafka or subprocess stack. Every
// helper here that reaches a server calls it, so an integration test needs
// no check of its own; a test that starts servers some other way (a private
// Postgres, the paystream binary) calls it first.
func SkipIfShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs Postgres and Kafka (run without -short, see `make test`)")
	}
}

// TestingM is what [Wrap] returns: a *testing.M whose Run also stops the
// containers testenv started. goleak.VerifyTestMain accepts it.
type TestingM interface {
	Run() int
}

// Main runs the package's tests, stops the containers testenv started for
// them, if any, fails the package when a goroutine outlives the tests (a
// client, pool or server a test left running: goleak), and exits with the
// tests' status. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	os.Exit(checkLeaks(Wrap(m).Run()))
}

// checkLeaks returns code, or 1 when the tests passed but goroutines
// outlived them (goleak waits a little for those that are ending).
func checkLeaks(code int) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		os.Stderr.WriteString("goleak: goroutines outlived the tests: " + err.Error() + "\n")
		return 1
	}
	return code
}

// Wrap returns m with a Run that stops the containers testenv started once
// the tests are done, for TestMains that run m themselves, such as
// goleak's, which then checks for leaks after the containers are gone:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testenv.Wrap(m)) }
func Wrap(m *testing.M) TestingM {
	return wrappedM{m}
}

type wrappedM struct{ m *testing.M }

func (w wrappedM) Run() int {
	code := w.m.Run()
	if err := stopContainers(); err != nil {
		os.Stderr.WriteString("testenv: " + err.Error() + "\n")
		if code == 0 {
			code = 1
		}
	}
	return code
}

// randomSuffix returns n random bytes in hex.
func randomSuffix(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails
	return hex.EncodeToString(b)
}

// sanitizedName turns a test name into something safe in a Kafka topic or
// group name: letters, digits and '-', at most max bytes.
func sanitizedName(name string, max int) string {
	var b strings.Builder
	dash := false
	for _, r := range name {
		if r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	s := strings.Trim(b.String(), "-")
	if len(s) > max {
		s = strings.TrimRight(s[:max], "-")
	}
	return s
}
