package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// MainWithBinary is Main for packages whose tests run the paystream binary
// as a subprocess (to signal or SIGKILL it): it builds cmd/paystream with
// the extra `go build` flags (for example "-race") into a temporary
// directory, sets *binary to its path, runs the tests, removes the
// directory, checks for leaked goroutines as Main does and exits with the
// tests' status (1 when the build fails).
//
//	var binary string
//	func TestMain(m *testing.M) { testenv.MainWithBinary(m, &binary, "-race") }
func MainWithBinary(m *testing.M, binary *string, buildFlags ...string) {
	dir, err := os.MkdirTemp("", "paystream-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*binary = filepath.Join(dir, "paystream")
	args := append(append([]string{"build"}, buildFlags...), "-o", *binary, "github.com/paystream/paystream/cmd/paystream")
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build paystream:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := Wrap(m).Run()
	os.RemoveAll(dir)
	os.Exit(checkLeaks(code))
}
