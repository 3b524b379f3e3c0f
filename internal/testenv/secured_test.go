package testenv

import (
	"strings"
	"testing"
)

// TestSecuredFailsWithoutItsVariables: brokers from the environment without
// the secured listeners' variables is a broken setup (an old `stack.sh
// env`): the test fails, naming what is missing and how to fix it.
func TestSecuredFailsWithoutItsVariables(t *testing.T) {
	SkipIfShort(t)
	// Not parallel: it changes the environment.
	t.Setenv(EnvKafkaBrokers, "127.0.0.1:59092")
	for _, name := range []string{EnvKafkaSASLBrokers, EnvKafkaTLSCAFile, EnvKafkaMTLSBrokers} {
		t.Setenv(name, "")
	}
	fatals, _ := runFake(t, func(tb testing.TB) { Secured(tb) })
	if len(fatals) != 1 {
		t.Fatalf("fatals = %q, want one", fatals)
	}
	for _, want := range []string{EnvKafkaSASLBrokers, EnvKafkaTLSCAFile, EnvKafkaMTLSBrokers, `eval "$(deploy/stack.sh env)"`} {
		if !strings.Contains(fatals[0], want) {
			t.Errorf("failure %q does not mention %s", fatals[0], want)
		}
	}

	t.Setenv(EnvDatabaseURL, "postgres://x")
	t.Setenv(EnvDatabaseTLSURL, "")
	fatals, _ = runFake(t, func(tb testing.TB) { (&DB{Schema: "s"}).TLSURL(tb) })
	if len(fatals) != 1 || !strings.Contains(fatals[0], EnvDatabaseTLSURL) {
		t.Fatalf("TLSURL fatals = %q, want one naming %s", fatals, EnvDatabaseTLSURL)
	}
}

func TestSecured(t *testing.T) {
	t.Parallel()
	s := Secured(t)
	if len(s.SASLBrokers) == 0 || len(s.MTLSBrokers) == 0 || s.Username == "" {
		t.Fatalf("Secured() = %+v", s)
	}
	u := (&DB{Schema: "t_x"}).TLSURL(t)
	if !strings.Contains(u, "sslmode=verify-full") || !strings.Contains(u, "search_path=t_x") {
		t.Errorf("TLSURL() = %q, want verify-full on schema t_x", u)
	}
}
