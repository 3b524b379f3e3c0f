package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeFile is the subset of docker-compose.yml the settings check reads.
type composeFile struct {
	Services map[string]struct {
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
	} `yaml:"services"`
}

// paystreamCommands are the subcommands a compose service may run.
var paystreamCommands = []string{"migrate", "ingest", "processor", "sink"}

// composeSettingErrors returns, for every paystream service of the compose
// file in text, each PAYSTREAM_* variable it is given that its command does
// not read: a misspelt setting is otherwise silently ignored and the
// service falls back to a default (or refuses to start far from the cause).
func composeSettingErrors(t *testing.T, text []byte) []string {
	t.Helper()
	var f composeFile
	if err := yaml.Unmarshal(text, &f); err != nil {
		t.Fatalf("parse docker-compose.yml: %v", err)
	}
	var errs []string
	checked := 0
	for name, svc := range f.Services {
		if len(svc.Command) == 0 || !slices.Contains(paystreamCommands, svc.Command[0]) {
			continue
		}
		checked++
		reads := commandEnv(t, svc.Command[0])
		for v := range svc.Environment {
			if strings.HasPrefix(v, "PAYSTREAM_") && !slices.Contains(reads, v) {
				errs = append(errs, fmt.Sprintf("service %s: %s is not a setting of `paystream %s`", name, v, svc.Command[0]))
			}
		}
	}
	if checked < len(paystreamCommands) {
		t.Fatalf("docker-compose.yml runs %d paystream services, want one per command %v", checked, paystreamCommands)
	}
	sort.Strings(errs)
	return errs
}

// TestComposeSettings: every PAYSTREAM_* variable docker-compose.yml gives
// a paystream service is one its command reads (per its --help), and a
// deliberately misspelt one is reported by name.
func TestComposeSettings(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if errs := composeSettingErrors(t, text); len(errs) > 0 {
		t.Errorf("docker-compose.yml:\n  %s", strings.Join(errs, "\n  "))
	}

	broken := strings.Replace(string(text), "PAYSTREAM_KAFKA_BROKERS:", "PAYSTREAM_KAFKA_BROKER:", 1)
	if broken == string(text) {
		t.Fatal("docker-compose.yml sets no PAYSTREAM_KAFKA_BROKERS to misspell")
	}
	errs := composeSettingErrors(t, []byte(broken))
	if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), "PAYSTREAM_KAFKA_BROKER is not a setting of `paystream") {
		t.Errorf("a misspelt PAYSTREAM_KAFKA_BROKER was not reported by name; got %q", errs)
	}
}
