package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(Wrap(m))
}

// fakeTB records what a helper reports and stops the helper's goroutine at
// the first Fatal, as the testing package does. Everything else goes to the
// real test.
type fakeTB struct {
	*testing.T

	mu     sync.Mutex
	fatals []string
	errors []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

// runFake runs fn against a fakeTB in its own goroutine, so a Fatal ends
// only fn, and returns what fn reported.
func runFake(t *testing.T, fn func(tb testing.TB)) (fatals, errors []string) {
	t.Helper()
	f := &fakeTB{T: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fatals, f.errors
}

func TestNoServers(t *testing.T) {
	SkipIfShort(t)
	// Not parallel: it unsets the environment for its duration.
	t.Setenv(EnvDatabaseURL, "")
	t.Setenv(EnvKafkaBrokers, "")

	if err := dockerAvailable(); err == nil {
		t.Log("a Docker engine answers: the servers come from containers")
		if u := databaseURL(t); !strings.HasPrefix(u, "postgres://") {
			t.Fatalf("container database URL = %q", u)
		}
		if b := Kafka(t); len(b) != 1 {
			t.Fatalf("container brokers = %v, want one", b)
		}
		return
	}

	for name, fn := range map[string]func(testing.TB){
		"NewDB": func(tb testing.TB) { NewDB(tb) },
		"Kafka": func(tb testing.TB) { Kafka(tb) },
		"Topic": func(tb testing.TB) { Topic(tb, "x", 1) },
	} {
		fatals, _ := runFake(t, fn)
		if len(fatals) != 1 {
			t.Fatalf("%s reported %d fatal errors, want 1: %q", name, len(fatals), fatals)
		}
		if !strings.Contains(fatals[0], howToStart) || !strings.Contains(fatals[0], "no Docker engine answered") {
			t.Errorf("%s failure = %q, want it to say no Docker engine answered and %q", name, fatals[0], howToStart)
		}
	}
	const want = `run 'make stack-up' and 'eval "$(deploy/stack.sh env)"', or set PAYSTREAM_TEST_DATABASE_URL and PAYSTREAM_TEST_KAFKA_BROKERS, or start Docker`
	if howToStart != want {
		t.Errorf("howToStart = %q, want %q", howToStart, want)
	}
}

func TestKafkaUnreachable(t *testing.T) {
	SkipIfShort(t)
	// Not parallel: it changes the environment and the startup grace.
	t.Setenv(EnvKafkaBrokers, "127.0.0.1:1")
	grace := kafkaStartupGrace
	kafkaStartupGrace = 500 * time.Millisecond
	t.Cleanup(func() { kafkaStartupGrace = grace })
	start := time.Now()

	fatals, _ := runFake(t, func(tb testing.TB) { Kafka(tb) })
	if len(fatals) != 1 || !strings.Contains(fatals[0], "Kafka at 127.0.0.1:1 does not answer") || !strings.Contains(fatals[0], howToStart) {
		t.Fatalf("fatals = %q, want one saying Kafka at 127.0.0.1:1 does not answer and how to start it", fatals)
	}
	if elapsed := time.Since(start); elapsed < 400*time.Millisecond {
		t.Errorf("gave up after %s, before the startup grace", elapsed)
	}
}

func TestSanitizedName(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		in   string
		max  int
		want string
	}{
		{"TestTopic", 100, "TestTopic"},
		{"TestTopic/Sub_case#01", 100, "TestTopic-Sub-case-01"},
		{"Test/./é//x", 100, "Test-x"},
		{"TestLong/abcdef", 10, "TestLong-a"},
		{"TestLong/abcdef", 9, "TestLong"},
		{"//", 100, ""},
	} {
		if got := sanitizedName(tt.in, tt.max); got != tt.want {
			t.Errorf("sanitizedName(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
	}
}

// TestFreePortsBelowEphemeralRange: FreePorts draws below the kernel's
// ephemeral range, where no outgoing connection or ":0" listener can take
// the ports before the child binds them, and they are free.
func TestFreePortsBelowEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	for range 20 {
		p := FreePorts(t, 2)
		if p < low-portSpan || p+1 >= low {
			t.Fatalf("FreePorts = %d-%d, want within %d-%d", p, p+1, low-portSpan, low-1)
		}
		if !portsFree(p, 2) {
			t.Fatalf("ports %d-%d are not free", p, p+1)
		}
	}
}
