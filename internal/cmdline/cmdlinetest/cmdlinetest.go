// Package cmdlinetest runs a binary's run function in a child process, for
// the tests of cmd/paystream and cmd/paystream-lab: exit statuses, kong's
// os.Exit after --help and what goes to stdout and stderr are observed as a
// user sees them.
//
// The test binary plays the binary under test when envVar is "1": its
// TestMain starts with
//
//	if os.Getenv(envVar) == "1" {
//		os.Exit(run(os.Args[1:]))
//	}
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
)

// Result is what the child did.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs the test binary with args as a child playing the binary
// (envVar=1), in an environment without any PAYSTREAM_ setting but those
// in env ("NAME=value"), and waits at most timeout for it; it fails the
// test when the child cannot run or times out.
func Run(t *testing.T, envVar string, timeout time.Duration, env []string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYSTREAM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, envVar+"=1"), env...)
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
