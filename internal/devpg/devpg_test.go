package devpg

import (
	"context"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type testBundle struct {
	cfg Config
}

// setup returns a Config for a cluster in a fresh data dir. Clusters a test
// starts are stopped when it ends.
func setup(t *testing.T) *testBundle {
	t.Helper()
	return &testBundle{cfg: Config{
		DataDir: filepath.Join(t.TempDir(), "pg"),
		Logger:  slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}}
}

// start starts a cluster and stops it when the test ends.
func start(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	c, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
			killPostmaster(t, cfg.DataDir)
		}
	})
	return c
}

// killPostmaster is the backstop when Stop fails: no test may leave a
// server running on a data dir about to be removed.
func killPostmaster(t *testing.T, dataDir string) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil || pid <= 0 {
		return
	}
	t.Logf("killing postmaster %d (fast shutdown)", pid)
	_ = syscall.Kill(pid, syscall.SIGINT)
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// queryOne connects to url and returns the one value sql selects.
func queryOne[T any](t *testing.T, url, sql string) T {
	t.Helper()
	var v T
	if err := connect(t, url).QueryRow(t.Context(), sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func TestStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster (run without -short)")
	}
	t.Parallel()

	t.Run("ServesThePaystreamDatabaseAndKeepsDataAcrossRestarts", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		c := start(t, bundle.cfg)
		if !strings.HasPrefix(c.URL(), "postgres://paystream@127.0.0.1:") || !strings.HasSuffix(c.URL(), "/paystream?sslmode=disable") {
			t.Fatalf("URL() = %q, want postgres://paystream@127.0.0.1:<port>/paystream?sslmode=disable", c.URL())
		}
		conn := connect(t, c.URL())
		var db, role string
		if err := conn.QueryRow(t.Context(), "SELECT current_database(), current_user").Scan(&db, &role); err != nil {
			t.Fatal(err)
		}
		if db != Database || role != Role {
			t.Fatalf("connected to %s as %s, want %s as %s", db, role, Database, Role)
		}
		if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('across restarts')"); err != nil {
			t.Fatal(err)
		}
		conn.Close(t.Context())

		if err := c.Stop(t.Context()); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if _, err := pgx.Connect(t.Context(), c.URL()+"&connect_timeout=2"); err == nil {
			t.Fatal("server still accepts connections after Stop")
		}
		if err := c.Stop(t.Context()); err != nil {
			t.Fatalf("second Stop: %v", err)
		}

		c2 := start(t, bundle.cfg)
		conn2 := connect(t, c2.URL())
		var v string
		if err := conn2.QueryRow(t.Context(), "SELECT v FROM kept").Scan(&v); err != nil {
			t.Fatalf("data written before the restart: %v", err)
		}
		if v != "across restarts" {
			t.Fatalf("kept row = %q", v)
		}
	})

	t.Run("ReusesAServerStillRunningOnTheDataDir", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		first := start(t, bundle.cfg)
		bundle.cfg.Port = 1 // ignored: the running server keeps its port
		second := start(t, bundle.cfg)
		if second.URL() != first.URL() {
			t.Fatalf("second Start URL = %q, want the running server's %q", second.URL(), first.URL())
		}
		pid1 := queryOne[int](t, first.URL(), "SELECT pg_backend_pid()")
		pid2 := queryOne[int](t, second.URL(), "SELECT pg_backend_pid()")
		if pid1 == pid2 {
			t.Fatalf("two connections share backend pid %d", pid1)
		}
	})

	t.Run("ListensOnTheConfiguredPort", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		bundle.cfg.Port = port

		c := start(t, bundle.cfg)
		if want := "127.0.0.1:" + strconv.Itoa(port); !strings.Contains(c.URL(), want) {
			t.Fatalf("URL() = %q, want host %s", c.URL(), want)
		}
		if setting := queryOne[string](t, c.URL(), "SHOW listen_addresses"); setting != "127.0.0.1" {
			t.Fatalf("listen_addresses = %q, want 127.0.0.1 only", setting)
		}
	})

	t.Run("PutsTheUnixSocketInTheDataDir", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		c := start(t, bundle.cfg)
		if dir := queryOne[string](t, c.url(superuser, "postgres"), "SHOW unix_socket_directories"); dir != bundle.cfg.DataDir {
			t.Fatalf("unix_socket_directories = %q, want the data dir %q", dir, bundle.cfg.DataDir)
		}
	})

	t.Run("ListensOnTCPOnlyWhenTheDataDirIsTooLongForASocket", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		bundle.cfg.DataDir = filepath.Join(bundle.cfg.DataDir, strings.Repeat("d", 110))

		c := start(t, bundle.cfg)
		if dir := queryOne[string](t, c.url(superuser, "postgres"), "SHOW unix_socket_directories"); dir != "" {
			t.Fatalf("unix_socket_directories = %q, want none", dir)
		}
	})

	t.Run("HandsTheDataDirToTheServersOSUser", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		start(t, bundle.cfg)
		fi, err := os.Stat(filepath.Join(bundle.cfg.DataDir, "PG_VERSION"))
		if err != nil {
			t.Fatal(err)
		}
		owner := fi.Sys().(*syscall.Stat_t).Uid
		want := uint32(os.Geteuid())
		if want == 0 { // PostgreSQL refuses root: it runs as postgres.
			u, err := user.Lookup(serverUser)
			if err != nil {
				t.Fatal(err)
			}
			uid, _ := strconv.Atoi(u.Uid)
			want = uint32(uid)
		}
		if owner != want {
			t.Fatalf("PG_VERSION owned by uid %d, want %d", owner, want)
		}
		dfi, err := os.Stat(bundle.cfg.DataDir)
		if err != nil {
			t.Fatal(err)
		}
		if perm := dfi.Mode().Perm(); perm != 0o700 {
			t.Fatalf("data dir mode = %o, want 700", perm)
		}
	})

	t.Run("RejectsADataDirFromAnotherMajorVersion", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		if err := os.MkdirAll(bundle.cfg.DataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bundle.cfg.DataDir, "PG_VERSION"), []byte("9.6\n"), 0o600); err != nil {
			t.Fatal(err)
		}

		_, err := Start(t.Context(), bundle.cfg)
		if err == nil || !strings.Contains(err.Error(), "holds a PostgreSQL 9.6 cluster") {
			t.Fatalf("Start error = %v, want one naming the data dir's version 9.6", err)
		}
	})

	t.Run("ValidatesConfig", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		for _, tt := range []struct {
			name    string
			mutate  func(*Config)
			wantErr string
		}{
			{"NoDataDir", func(c *Config) { c.DataDir = "" }, "Config.DataDir is required"},
			{"NegativePort", func(c *Config) { c.Port = -1 }, "Config.Port -1"},
			{"PortTooBig", func(c *Config) { c.Port = 70000 }, "Config.Port 70000"},
			{"BinDirWithoutServer", func(c *Config) { c.BinDir = t.TempDir() }, "apt-get install postgresql"},
		} {
			cfg := bundle.cfg
			tt.mutate(&cfg)
			_, err := Start(t.Context(), cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: Start error = %v, want it to contain %q", tt.name, err, tt.wantErr)
			}
		}
	})
}

func TestFindBinDir(t *testing.T) {
	t.Parallel()

	dir, err := findBinDir("")
	if err != nil {
		t.Fatalf("findBinDir: %v (the tests need PostgreSQL server binaries: apt-get install postgresql)", err)
	}
	if missing := missingBinaries(dir); len(missing) > 0 {
		t.Fatalf("findBinDir = %s, which lacks %v", dir, missing)
	}
}

func TestNewestVersioned(t *testing.T) {
	t.Parallel()

	root := t.TempDir()
	for _, v := range []string{"9.6", "16", "13", "10"} {
		if err := os.MkdirAll(filepath.Join(root, v, "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got := newestVersioned(filepath.Join(root, "*", "bin"), root+"/", "/bin")
	want := []string{"16", "13", "10", "9.6"}
	if len(got) != len(want) {
		t.Fatalf("newestVersioned = %v, want versions %v", got, want)
	}
	for i := range want {
		if got[i] != filepath.Join(root, want[i], "bin") {
			t.Fatalf("newestVersioned = %v, want versions %v", got, want)
		}
	}
}

func TestMajorVersion(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]string{"15.14": "15", "16": "16", "9.6.24": "9.6", "17beta1": "17", "18devel": "18", "10.1": "10"} {
		if got := majorVersion(in); got != want {
			t.Errorf("majorVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

// testWriter sends the cluster's log lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
