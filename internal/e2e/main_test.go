package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/paystream/paystream/internal/testenv"
)

// binary is the paystream binary built for the tests that run it as a
// subprocess (so they can SIGKILL it).
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "paystream-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "paystream")
	build := exec.Command("go", "build", "-race", "-o", binary, "github.com/paystream/paystream/cmd/paystream")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build paystream:", err)
		os.Exit(1)
	}
	code := testenv.Wrap(m).Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
