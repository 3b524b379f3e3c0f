// Package cmdlinetest runs a binary's run function in a child process, for
// the tests of cmd/paystream and cmd/paystream-lab: exit statuses, kong's
// os.Exit after --help and what goes to stdout and stderr are observed as a
// user sees them.
//
// The test binary plays the binary under test in the children it starts.
// A package's tests declare the binary once and hand it their TestMain:
//
//	var paystream = cmdlinetest.Binary{EnvVar: "PAYSTREAM_CLI_TEST_RUN_MAIN", Main: run, Timeout: 30 * time.Second}
//
//	func TestMain(m *testing.M) { paystream.TestMain(testenv.Wrap(m)) }
package cmdlinetest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Binary is the binary under test, as the test binary plays it.
type Binary struct {
	// EnvVar, "1" in a child's environment, makes the test binary play
	// the binary there.
	EnvVar string
	// Main is the binary's run function: args without the program name,
	// the exit status back.
	Main func(args []string) int
	// Timeout bounds one Run.
	Timeout time.Duration
}

// TestMain is the TestMain of the binary's tests. In a child (EnvVar "1")
// the test binary plays the binary: it exits with Main(os.Args[1:]).
// Otherwise it runs the tests (m, testenv.Wrap's to stop the containers
// they started) and fails when a goroutine outlives them (goleak), but for
// those opts ignore.
func (b Binary) TestMain(m goleak.TestingM, opts ...goleak.Option) {
	if os.Getenv(b.EnvVar) == "1" {
		os.Exit(b.Main(os.Args[1:]))
	}
	goleak.VerifyTestMain(m, opts...)
}

// Result is what the child did.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs the binary with args in a child (Command) whose environment
// has no PAYSTREAM_ setting but those in env ("NAME=value"), and waits at
// most Timeout for it; it fails the test when the child cannot run or
// times out.
func (b Binary) Run(t *testing.T, env []string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), b.Timeout)
	defer cancel()
	cmd := b.Command(ctx, env, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ctx.Err() == nil:
		r.Code = ee.ExitCode()
	default:
		t.Fatalf("%s: %v\nstderr: %s", strings.Join(args, " "), err, r.Stderr)
	}
	return r
}

// Command is the binary with args, not started: the test binary as a
// child playing it (EnvVar=1), in an environment without any PAYSTREAM_
// setting but those in env, killed when ctx ends. For tests that drive
// the child themselves (pipes, signals, servers).
func (b Binary) Command(ctx context.Context, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYSTREAM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, b.EnvVar+"=1"), env...)
	return cmd
}
