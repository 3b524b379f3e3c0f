// Package deploy_test checks the operations artifacts under deploy/ against
// the paystream binary: the Prometheus alert rules and the Grafana dashboard
// name only metrics the binary exports, and the Kubernetes manifests set only
// environment variables, ports and probe paths the binary reads and serves.
// The manifests are also run: each workload's container is started as the
// rendered example overlay describes it, on the real Kafka and Postgres.
package deploy_test

import (
	"os/exec"
	"regexp"
	"slices"
	"sync"
	"testing"

	"github.com/paystream/paystream/internal/testenv"
)

// binary is the paystream binary built for these tests.
var binary string

func TestMain(m *testing.M) { testenv.MainWithBinary(m, &binary) }

// repoRoot is the repository's root: the tests run in deploy/.
const repoRoot = ".."

var (
	envMu     sync.Mutex
	envByCmd  = map[string][]string{}
	envVarsRE = regexp.MustCompile(`\$(PAYSTREAM_[A-Z0-9_]+)`)
)

// commandEnv returns the PAYSTREAM_* variables the binary's subcommand
// reads, as its --help names them (kong's env tags).
func commandEnv(t *testing.T, cmd string) []string {
	t.Helper()
	envMu.Lock()
	defer envMu.Unlock()
	if vars, ok := envByCmd[cmd]; ok {
		return vars
	}
	out, err := exec.Command(binary, cmd, "--help").Output()
	if err != nil {
		t.Fatalf("paystream %s --help: %v", cmd, err)
	}
	var vars []string
	for _, m := range envVarsRE.FindAllStringSubmatch(string(out), -1) {
		if !slices.Contains(vars, m[1]) {
			vars = append(vars, m[1])
		}
	}
	if len(vars) == 0 {
		t.Fatalf("paystream %s --help names no PAYSTREAM_* variable:\n%s", cmd, out)
	}
	envByCmd[cmd] = vars
	return vars
}
