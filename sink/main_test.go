package sink_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/paystream/paystream/internal/testenv"
)

func TestMain(m *testing.M) {
	code := testenv.Wrap(m).Run()
	stopClusters()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
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
