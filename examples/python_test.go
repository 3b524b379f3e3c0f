package examples

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPythonConsumer runs examples/python/consumer.py (confluent-kafka,
// read_committed, each record parsed by the CloudEvents SDK) on a state
// topic written by the relay with an aborted transaction and two re-sent
// events: it reports every committed event once and in order, the re-sent
// ones as duplicates, nothing of the aborted transaction. A second run of
// the same group reads nothing: the first committed its offsets.
func TestPythonConsumer(t *testing.T) {
	t.Parallel()
	site := pythonDeps(t)
	st := publishState(t)
	runTwice(t, st, func(group string) *exec.Cmd {
		cmd := exec.CommandContext(t.Context(), "python3", "examples/python/consumer.py",
			"--brokers", st.brokers[0], "--topic", st.topic, "--group", group, "--exit-at-end", "--quiet")
		cmd.Env = append(os.Environ(), "PYTHONPATH="+site, "PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1")
		return cmd
	})
}

// pythonDeps installs examples/python/requirements.txt with pip into the
// cache (once per requirements and Python version) and returns the
// directory to put on PYTHONPATH.
func pythonDeps(t *testing.T) string {
	t.Helper()
	version := toolOutput(t, "Python 3", "python3", "--version")
	toolOutput(t, "pip (python3 -m pip)", "python3", "-m", "pip", "--version")
	reqs, err := filepath.Abs("python/requirements.txt")
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(reqs)
	if err != nil {
		t.Fatal(err)
	}
	return cached(t, filepath.Join(cacheDir(t), "python"), version+string(key), func(into string) error {
		out, err := exec.CommandContext(t.Context(), "python3", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
			"--no-input", "--target", into, "-r", reqs).CombinedOutput()
		if err != nil {
			return fmt.Errorf("pip install -r %s: %w\n%s", reqs, err, tail(string(out), 3000))
		}
		return nil
	})
}
