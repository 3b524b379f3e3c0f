//go:build !unix

package devpg

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
)

var errUnsupported = errors.New("a private PostgreSQL cluster needs a Unix-like OS: set PAYSTREAM_DATABASE_URL to use a server you already run")

// runner is unavailable off Unix; newRunner says so.
type runner struct{ binDir string }

func newRunner(string, *slog.Logger) (*runner, error) { return nil, errUnsupported }

func (r *runner) run(context.Context, string, ...string) (string, error) { return "", errUnsupported }

func (r *runner) prepareDataDir(string) error { return errUnsupported }

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
