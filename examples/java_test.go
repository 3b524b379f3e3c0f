package examples

import (
	"os/exec"
	"path/filepath"
	"testing"
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
	runTwice(t, st, func(group string) *exec.Cmd {
		return exec.CommandContext(t.Context(), "java", "-cp",
			filepath.Join(target, "paystream-example-consumer.jar")+string(filepath.ListSeparator)+filepath.Join(target, "lib", "*"),
			"dev.paystream.example.StateConsumer",
			"--brokers", st.brokers[0], "--topic", st.topic, "--group", group, "--exit-at-end", "--quiet")
	})
}

// javaBuild builds examples/java with the machine's Maven into the cache
// (once per pom, sources and JDK) and returns its target directory: the
// jar and lib/, the runtime classpath.
func javaBuild(t *testing.T) string {
	t.Helper()
	return mavenCached(t, "java/pom.xml", hashFiles(t, "java"), "package", "paystream.build.dir", "target")
}
