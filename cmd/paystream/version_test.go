package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// repoRoot is the repository's root: the tests run in cmd/paystream.
const repoRoot = "../.."

// git runs git in the repository and returns its trimmed output.
func git(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// versionOf runs binary's `version` and returns its three lines' values.
func versionOf(t *testing.T, binary string) (version, revision, goVersion string) {
	t.Helper()
	out, err := exec.Command(binary, "version").Output()
	if err != nil {
		t.Fatalf("%s version: %v", binary, err)
	}
	m := regexp.MustCompile(`^paystream (\S+)\nrevision (\S+)\ngo (\S+)\n$`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("%s version printed %q, want \"paystream VERSION\\nrevision COMMIT\\ngo GOVERSION\\n\"", binary, out)
	}
	return m[1], m[2], m[3]
}

// withoutEnv returns the environment without the named variables.
func withoutEnv(names ...string) []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, name)
	})
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := paystream.Run(t, nil, "version")
	want := regexp.MustCompile(`^paystream \S+\nrevision \S+\ngo ` + regexp.QuoteMeta(runtime.Version()) + `\n$`)
	if r.Code != 0 || !want.MatchString(r.Stdout) {
		t.Errorf("version: exit %d, stdout %q, stderr %q; want 0 and \"paystream VERSION\\nrevision COMMIT\\ngo %s\\n\"",
			r.Code, r.Stdout, r.Stderr, runtime.Version())
	}
}

// TestBuildInfoMetric: the registry every command serves on /metrics has
// paystream_build_info 1 with the version, revision and Go release that
// `paystream version` prints.
func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	families, err := newRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	b := buildInfo()
	want := map[string]string{"version": b.Version, "revision": b.Revision, "goversion": runtime.Version()}
	i := slices.IndexFunc(families, func(f *dto.MetricFamily) bool { return f.GetName() == "paystream_build_info" })
	if i < 0 {
		t.Fatal("no paystream_build_info on the registry")
	}
	ms := families[i].GetMetric()
	if len(ms) != 1 || ms[0].GetGauge().GetValue() != 1 {
		t.Fatalf("paystream_build_info: %v, want one series of value 1", ms)
	}
	got := map[string]string{}
	for _, l := range ms[0].GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if len(got) != len(want) || got["version"] != want["version"] || got["revision"] != want["revision"] || got["goversion"] != want["goversion"] {
		t.Errorf("paystream_build_info labels %v, want %v", got, want)
	}
}

// TestVersionMakefile: `make build` stamps the binary with `git describe
// --tags --always --dirty` and the commit, and VERSION overrides the
// former.
func TestVersionMakefile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The tree is shared: HEAD and dirtiness may change while make runs.
	before := git(t, "describe", "--tags", "--always", "--dirty")
	headBefore := git(t, "rev-parse", "HEAD")
	for _, c := range []struct{ name, override string }{{"git", ""}, {"override", "v1.2.3"}} {
		bin := filepath.Join(dir, c.name, "paystream")
		args := []string{"-s", "-C", repoRoot, "build", "BIN=" + bin}
		if c.override != "" {
			args = append(args, "VERSION="+c.override)
		}
		cmd := exec.Command("make", args...)
		cmd.Env = withoutEnv("VERSION", "REVISION", "BIN", "MAKEFLAGS")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		version, revision, goVersion := versionOf(t, bin)
		after := git(t, "describe", "--tags", "--always", "--dirty")
		headAfter := git(t, "rev-parse", "HEAD")
		t.Logf("make build (%s): paystream %s, revision %s, %s (git describe: %s)", c.name, version, revision, goVersion, before)
		wantVersion := []string{before, after}
		if c.override != "" {
			wantVersion = []string{c.override}
		}
		if !slices.Contains(wantVersion, version) {
			t.Errorf("make build (%s): paystream version says %q, want %q", c.name, version, wantVersion[0])
		}
		if revision != headBefore && revision != headAfter {
			t.Errorf("make build (%s): revision %q, want HEAD %s", c.name, revision, headBefore)
		}
		if goVersion != runtime.Version() {
			t.Errorf("make build (%s): go %q, want %q", c.name, goVersion, runtime.Version())
		}
	}
}

// TestVersionDockerfile runs deploy/Dockerfile's `go build` step as the
// image build does (its build arguments as the environment, the
// repository as the context, no .git), and checks that the image's binary
// says the VERSION and REVISION given; and that `make image` passes them.
func TestVersionDockerfile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var step string
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			step = strings.TrimPrefix(strings.TrimSpace(line), "RUN ")
		}
	}
	if step == "" {
		t.Fatal("deploy/Dockerfile: no RUN step runs go build")
	}
	step = regexp.MustCompile(`--mount=\S+`).ReplaceAllString(step, "")
	bin := filepath.Join(t.TempDir(), "paystream")
	step = strings.ReplaceAll(step, "/out/paystream", bin)
	t.Logf("the Dockerfile's build step, run here: %s", strings.Join(strings.Fields(step), " "))

	cmd := exec.Command("sh", "-c", step)
	cmd.Dir = repoRoot
	cmd.Env = append(withoutEnv("VERSION", "REVISION", "GOFLAGS", "CGO_ENABLED"),
		"CGO_ENABLED=0", "GOFLAGS=-trimpath", "VERSION=v1.2.3-rc.1", "REVISION=0123456789abcdef0123456789abcdef01234567")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Dockerfile's build step: %v\n%s", err, out)
	}
	if version, revision, _ := versionOf(t, bin); version != "v1.2.3-rc.1" || revision != "0123456789abcdef0123456789abcdef01234567" {
		t.Errorf("the image's binary says paystream %s, revision %s; want the build arguments VERSION and REVISION", version, revision)
	}
	if !strings.Contains(string(out), "paystream v1.2.3-rc.1") {
		t.Errorf("the build step does not print the version it stamped:\n%s", out)
	}

	cmd = exec.Command("make", "-n", "-C", repoRoot, "image", "VERSION=v9.8.7", "REVISION=abc123")
	cmd.Env = withoutEnv("MAKEFLAGS")
	dry, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, dry)
	}
	for _, want := range []string{"-f deploy/Dockerfile", "--build-arg VERSION=v9.8.7", "--build-arg REVISION=abc123"} {
		if !strings.Contains(string(dry), want) {
			t.Errorf("make image does not pass %s:\n%s", want, dry)
		}
	}
}
