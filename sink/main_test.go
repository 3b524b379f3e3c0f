package sink_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/paystream/paystream/internal/testenv"
)

// TestMain runs the tests, stops the private clusters and removes the
// built binary, then fails the package when a goroutine outlives its tests
// (a relay, session or Kafka client a test left running).
func TestMain(m *testing.M) {
	code := testenv.Wrap(m).Run()
	stopClusters()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// built is the paystream binary, built once per test binary by the first
// test that runs it.
var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// paystreamBinary returns the path of the paystream binary, built with the
// race detector, so that a test can run `paystream sink` as an operator
// does and SIGKILL it.
func paystreamBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "paystream-sink-bin-"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "paystream")
		out, err := exec.Command("go", "build", "-race", "-o", built.path, "github.com/paystream/paystream/cmd/paystream").CombinedOutput()
		if err != nil {
			built.err = &buildError{err: err, out: out}
		}
	})
	if built.err != nil {
		t.Fatalf("build paystream: %v", built.err)
	}
	return built.path
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }
