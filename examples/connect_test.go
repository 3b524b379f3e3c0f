package examples

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
)

// TestConnectFileSink runs the Kafka Connect recipe of docs/consumers.md —
// a standalone worker (Kafka 4.1.1) with examples/connect's configuration,
// a FileStream sink reading the state topic with
// consumer.override.isolation.level=read_committed — on a state topic
// written by the relay with an aborted transaction and two re-sent events:
// the file gets exactly the committed records' values (the re-sent ones
// twice: Connect does not deduplicate, the reader of the file does by
// event_id), none of the aborted transaction's.
func TestConnectFileSink(t *testing.T) {
	t.Parallel()
	libs := connectLibs(t)
	st := publishState(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "state.jsonl")
	worker := withProps(t, "connect/worker.properties", map[string]string{
		"bootstrap.servers":            strings.Join(st.brokers, ","),
		"offset.storage.file.filename": filepath.Join(dir, "offsets"),
		"listeners":                    "http://" + testenv.FreeAddr(t),
	}, dir)
	connector := withProps(t, "connect/state-to-file.properties", map[string]string{
		"name":   testenv.Group(t), // the sink's consumer group is connect-<name>
		"topics": st.topic,
		"file":   out,
	}, dir)
	cmd := exec.Command("java", "-cp", filepath.Join(libs, "*"), "org.apache.kafka.connect.cli.ConnectStandalone", worker, connector)
	logs, err := os.Create(filepath.Join(dir, "worker.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	cmd.Stdout, cmd.Stderr = logs, logs
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // the worker stops its connector and exits
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	var lines []string
	testenv.WaitFor(t, time.Minute, func() error {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("the worker exited: %v\n%s", err, tail(string(b), 3000))
		default:
		}
		lines = readLines(t, out)
		if len(lines) < len(st.committed) {
			return fmt.Errorf("%d lines in %s, want %d", len(lines), out, len(st.committed))
		}
		return nil
	})
	// The sink copies each partition in offset order and the aborted
	// records are below the last committed ones: had it read them, they
	// would be in the file by now.
	t.Logf("the worker copied %d records in %s", len(lines), time.Since(start).Round(10*time.Millisecond))
	var want []string
	for _, r := range st.committed {
		want = append(want, string(r.Value))
	}
	slices.Sort(lines)
	slices.Sort(want)
	if !slices.Equal(lines, want) {
		t.Errorf("%s holds %d lines, want the %d committed values (%d events, %d re-sent), none aborted", out, len(lines), len(want), st.want.Events, st.want.Duplicates)
	}
}

// connectLibs copies Kafka Connect's jars (examples/connect/pom.xml) into
// the cache with the machine's Maven, once per pom, and returns their
// directory.
func connectLibs(t *testing.T) string {
	t.Helper()
	pom, err := os.ReadFile("connect/pom.xml")
	if err != nil {
		t.Fatal(err)
	}
	return mavenCached(t, "connect/pom.xml", string(pom), "dependency:copy-dependencies", "outputDirectory", "libs")
}

// mavenCached runs the machine's Maven on pom (a path in examples/) with
// goal, its output directory set by the property outProp to dir, once per
// key and JDK, in the cache directory named after pom's directory, and
// returns that output directory. Without a JDK or Maven the test is
// skipped.
func mavenCached(t *testing.T, pom, key, goal, outProp, dir string) string {
	t.Helper()
	jdk := toolOutput(t, "a JDK (17 or later)", "java", "-version")
	toolOutput(t, "Maven", "mvn", "--version")
	pom, err := filepath.Abs(pom)
	if err != nil {
		t.Fatal(err)
	}
	cache := cached(t, filepath.Join(cacheDir(t), filepath.Base(filepath.Dir(pom))), jdk+key, func(into string) error {
		out, err := exec.CommandContext(t.Context(), "mvn", "-q", "-B", "-Dstyle.color=never", "-f", pom, goal,
			"-D"+outProp+"="+filepath.Join(into, dir)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("mvn %s (%s): %w\n%s", goal, pom, err, tail(string(out), 3000))
		}
		return nil
	})
	return filepath.Join(cache, dir)
}

// withProps writes a copy of the properties file path into dir with the
// values of set in place of the file's, and returns the copy's path. Each
// key of set must be in the file: the test runs the recipe's configuration,
// not its own.
func withProps(t *testing.T, path string, set map[string]string, dir string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, _, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			if v, ok := set[k]; ok {
				line, seen[k] = k+"="+v, true
			}
		}
		out = append(out, line)
	}
	for k := range set {
		if !seen[k] {
			t.Fatalf("%s sets no %s", path, k)
		}
	}
	copied := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(copied, []byte(strings.Join(out, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return copied
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}
