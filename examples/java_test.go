package examples

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/paystream/paystream/internal/testenv"
)

// TestJavaConsumer runs the Java example (examples/java: kafka-clients 4.1.1,
// read_committed) on a state topic written by the relay with an aborted
// transaction and two re-sent events: it reports every committed event once
// and in order, the re-sent ones as duplicates, nothing of the aborted
// transaction. A second run of the same group reads nothing: the first
// committed its offsets.
func TestJavaConsumer(t *testing.T) {
	t.Parallel()
	target := javaBuild(t)
	st := publishState(t)
	group := testenv.Group(t)
	run := func() summary {
		cmd := exec.CommandContext(t.Context(), "java", "-cp",
			filepath.Join(target, "paystream-example-consumer.jar")+string(filepath.ListSeparator)+filepath.Join(target, "lib", "*"),
			"dev.paystream.example.StateConsumer",
			"--brokers", st.brokers[0], "--topic", st.topic, "--group", group, "--exit-at-end", "--quiet")
		return runExample(t, cmd)
	}
	if got := run(); got != st.want {
		t.Errorf("first run: %+v, want %+v", got, st.want)
	}
	if got := run(); got != (summary{}) {
		t.Errorf("second run of the group: %+v, want nothing read", got)
	}
}

// javaBuild builds examples/java with the machine's Maven into the cache
// (once per pom, sources and JDK) and returns its target directory: the
// jar and lib/, the runtime classpath.
func javaBuild(t *testing.T) string {
	t.Helper()
	jdk := toolOutput(t, "a JDK (17 or later)", "java", "-version")
	toolOutput(t, "Maven", "mvn", "--version")
	pom, err := filepath.Abs("java/pom.xml")
	if err != nil {
		t.Fatal(err)
	}
	dir := cached(t, filepath.Join(cacheDir(t), "java"), jdk+hashFiles(t, "java"), func(into string) error {
		out, err := exec.CommandContext(t.Context(), "mvn", "-q", "-B", "-Dstyle.color=never", "-f", pom, "package",
			"-Dpaystream.build.dir="+filepath.Join(into, "target")).CombinedOutput()
		if err != nil {
			return fmt.Errorf("mvn package (%s): %w\n%s", pom, err, tail(string(out), 3000))
		}
		return nil
	})
	return filepath.Join(dir, "target")
}
