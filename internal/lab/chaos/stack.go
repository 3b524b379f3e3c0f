package chaos

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// PrivateStack is a Postgres and Kafka of the harness's own, run by
// deploy/stack.sh with its own directory and ports, for the scenarios
// that stop or kill a server. The shared stack (the default ports) is
// never touched: other people's tests run on it.
type PrivateStack struct {
	// Script is deploy/stack.sh.
	Script string
	// Dir holds the servers' data and logs (PAYSTREAM_STACK_DIR).
	Dir string
	// PGPort, KafkaPort and ControllerPort are loopback ports nobody else
	// uses.
	PGPort, KafkaPort, ControllerPort int
	// Logger, when set, gets diagnostics (a server slow to stop).
	Logger *slog.Logger
}

// DefaultPrivateStack is the private stack `make chaos` uses: ports next
// to the shared stack's (55432, 59092), data under ~/.cache.
func DefaultPrivateStack(script string) PrivateStack {
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return PrivateStack{Script: script, Dir: home + "/.cache/paystream/chaos",
		PGPort: 56432, KafkaPort: 60092, ControllerPort: 60093}
}

// DatabaseURL is the private stack's database.
func (s PrivateStack) DatabaseURL() string {
	return fmt.Sprintf("postgres://paystream@127.0.0.1:%d/paystream?sslmode=disable", s.PGPort)
}

// Brokers is the private stack's broker.
func (s PrivateStack) Brokers() []string {
	return []string{"127.0.0.1:" + strconv.Itoa(s.KafkaPort)}
}

// run runs one stack.sh command against the private stack.
func (s PrivateStack) run(ctx context.Context, args ...string) error {
	if s.PGPort == 55432 || s.KafkaPort == 59092 {
		return fmt.Errorf("private stack on the shared stack's ports (%d, %d): refusing", s.PGPort, s.KafkaPort)
	}
	cmd := exec.CommandContext(ctx, s.Script, args...)
	cmd.Env = append(childEnv(),
		"PAYSTREAM_STACK_DIR="+s.Dir,
		"PAYSTREAM_STACK_PG_PORT="+strconv.Itoa(s.PGPort),
		"PAYSTREAM_STACK_KAFKA_PORT="+strconv.Itoa(s.KafkaPort),
		"PAYSTREAM_STACK_KAFKA_CONTROLLER_PORT="+strconv.Itoa(s.ControllerPort),
		// The jars are shared with the main stack's cache: no second download.
		"PAYSTREAM_CACHE_DIR="+cacheDir(),
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A server that takes long to stop is a finding: say which of
	// Postgres's processes are still there after 10 s.
	if strings.Contains(args[0], "postgres") {
		slow := time.AfterFunc(10*time.Second, func() { s.logPostgresChildren(args[0]) })
		defer slow.Stop()
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("stack.sh %s: %w\n%s", strings.Join(args, " "), err, tail(out.String(), 20))
	}
	return nil
}

// logPostgresChildren logs the private Postgres's child processes (ps).
func (s PrivateStack) logPostgresChildren(during string) {
	pid, err := os.ReadFile(filepath.Join(s.Dir, "postgres", "data", "postmaster.pid"))
	if err != nil {
		return
	}
	first, _, _ := strings.Cut(string(pid), "\n")
	out, _ := exec.Command("ps", "-o", "pid,etime,stat,wchan:20,cmd", "--ppid", strings.TrimSpace(first)).CombinedOutput()
	if s.Logger != nil {
		s.Logger.Warn("private stack: still running after 10 s; Postgres's processes", "command", during, "ps", string(out))
	}
}

func cacheDir() string {
	if d := os.Getenv("PAYSTREAM_CACHE_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return home + "/.cache/paystream"
}

// Up starts both servers (idempotent).
func (s PrivateStack) Up(ctx context.Context) error { return s.run(ctx, "up") }

// Down stops both servers, keeping their data.
func (s PrivateStack) Down(ctx context.Context) error { return s.run(ctx, "down") }

func (s PrivateStack) killKafka(ctx context.Context) error     { return s.run(ctx, "kill-kafka") }
func (s PrivateStack) startKafka(ctx context.Context) error    { return s.run(ctx, "start-kafka") }
func (s PrivateStack) restartPG(ctx context.Context) error     { return s.run(ctx, "restart-postgres") }
func (s PrivateStack) stopPostgres(ctx context.Context) error  { return s.run(ctx, "stop-postgres") }
func (s PrivateStack) startPostgres(ctx context.Context) error { return s.run(ctx, "start-postgres") }

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
