// Package devpg runs a private PostgreSQL cluster from the PostgreSQL
// binaries installed on the machine, so that `paystream dev` works without a
// database set up beforehand.
//
// The cluster lives in one data directory that is kept across runs: Start
// initializes it the first time (trust authentication, listening on
// 127.0.0.1 only, its unix socket inside the data directory), starts the
// server, or reuses one still running there from an earlier run, and makes
// sure the paystream role and database exist. When paystream runs as root,
// the server runs as the "postgres" OS user, since PostgreSQL refuses root.
//
// It is for development only: anyone on the machine can connect to the
// server as any role without a password.
package devpg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Role and Database name the role that owns the paystream database and the
// database itself, both created by Start when missing.
const (
	Role     = "paystream"
	Database = "paystream"
)

// superuser is the bootstrap superuser initdb creates.
const superuser = "postgres"

// logFile is the server's log, inside the data directory.
const logFile = "devpg.log"

// startTimeout bounds pg_ctl's wait for the server to start or stop.
const startTimeout = 60 * time.Second

// Config configures a private cluster.
type Config struct {
	// DataDir is the cluster's data directory (PGDATA). It is created and
	// initialized when it does not hold a cluster yet, and reused, data
	// and all, when it does. Required.
	DataDir string

	// Port is the TCP port the server listens on, on 127.0.0.1. A server
	// already running on DataDir keeps the port it has. Defaults to 0,
	// which picks a free port at each start.
	Port int

	// BinDir is the directory holding initdb, pg_ctl and postgres. Defaults
	// to "", which discovers it: `pg_config --bindir`, then the newest
	// /usr/lib/postgresql/<major>/bin, then pg_ctl on $PATH.
	BinDir string

	// Settings are extra server settings, passed as `-c name=value` when
	// Start starts the server (e.g. "wal_level": "logical"). A server
	// already running on DataDir keeps the settings it was started with.
	// Defaults to none.
	Settings map[string]string

	// Replication gives the paystream role the REPLICATION attribute, which
	// creating and streaming a logical replication slot needs (the sink's).
	// Defaults to false.
	Replication bool

	// Logger receives progress messages. Defaults to discarding them.
	Logger *slog.Logger
}

// Cluster is a running private PostgreSQL server.
type Cluster struct {
	dataDir  string
	port     int
	run      *runner
	settings map[string]string
	repl     bool
	logger   *slog.Logger
}

// Start initializes the cluster in cfg.DataDir if it is new, starts its
// server unless one from an earlier run is still running there, and makes
// sure the paystream role and database exist. The server outlives ctx: stop
// it with Stop.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("devpg: Config.DataDir is required")
	}
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("devpg: Config.Port %d is not a TCP port (0 picks a free one)", cfg.Port)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("devpg: data dir: %w", err)
	}
	binDir, err := findBinDir(cfg.BinDir)
	if err != nil {
		return nil, fmt.Errorf("devpg: %w", err)
	}
	run, err := newRunner(binDir, logger)
	if err != nil {
		return nil, fmt.Errorf("devpg: %w", err)
	}
	c := &Cluster{dataDir: dataDir, run: run, settings: cfg.Settings, repl: cfg.Replication, logger: logger}

	if err := run.prepareDataDir(dataDir); err != nil {
		return nil, fmt.Errorf("devpg: %w", err)
	}
	if err := c.initdb(ctx); err != nil {
		return nil, fmt.Errorf("devpg: %w", err)
	}
	running, err := c.running(ctx)
	if err != nil {
		return nil, fmt.Errorf("devpg: %w", err)
	}
	if running {
		if c.port, err = c.pidFilePort(); err != nil {
			return nil, fmt.Errorf("devpg: server already running on %s: %w", dataDir, err)
		}
		if cfg.Port != 0 && cfg.Port != c.port {
			logger.Warn("devpg: reusing the server already running on the data dir, on its port",
				"port", c.port, "wanted_port", cfg.Port)
		}
		logger.Info("devpg: reusing running server", "data_dir", dataDir, "port", c.port)
	} else if err := c.start(ctx, cfg.Port); err != nil {
		return nil, fmt.Errorf("devpg: %w", err)
	}
	if err := c.ensureDatabase(ctx); err != nil {
		return nil, fmt.Errorf("devpg: %w", err)
	}
	return c, nil
}

// URL returns the connection URL of the paystream database, as the
// paystream role, over TCP.
func (c *Cluster) URL() string {
	return c.url(Role, Database)
}

func (c *Cluster) url(role, database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(role),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Stop shuts the server down (pg_ctl stop -m fast: clients are
// disconnected, the data is kept) and waits for it to exit. It stops the
// server even when Start reused it rather than starting it, and returns nil
// when the server is not running. The data directory is left in place.
func (c *Cluster) Stop(ctx context.Context) error {
	running, err := c.running(ctx)
	if err != nil {
		return fmt.Errorf("devpg: %w", err)
	}
	if !running {
		return nil
	}
	c.logger.Info("devpg: stopping server", "data_dir", c.dataDir)
	if _, err := c.run.run(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", "fast", "-w",
		"-t", strconv.Itoa(int(startTimeout/time.Second)), "-s"); err != nil {
		return fmt.Errorf("devpg: stop server: %w", err)
	}
	return nil
}

// initdb initializes the data directory unless it already holds a cluster,
// in which case it checks that the binaries can run it.
func (c *Cluster) initdb(ctx context.Context) error {
	ver, err := os.ReadFile(filepath.Join(c.dataDir, "PG_VERSION"))
	switch {
	case err == nil:
		return c.checkVersion(ctx, strings.TrimSpace(string(ver)))
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("read PG_VERSION: %w", err)
	}
	c.logger.Info("devpg: initializing cluster", "data_dir", c.dataDir, "bin_dir", c.run.binDir)
	_, err = c.run.run(ctx, "initdb",
		"-D", c.dataDir,
		"-U", superuser,
		"--auth=trust",
		"--encoding=UTF8",
		"--no-locale",
		"--no-sync", // a fresh cluster; a crash before the OS writes it back loses nothing of value
	)
	if err != nil {
		return fmt.Errorf("initialize cluster: %w", err)
	}
	return nil
}

// checkVersion fails clearly when the data directory was made by another
// major version than the binaries'.
func (c *Cluster) checkVersion(ctx context.Context, dataMajor string) error {
	out, err := c.run.run(ctx, "pg_ctl", "--version")
	if err != nil {
		return err
	}
	// "pg_ctl (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)"
	fields := strings.Fields(out)
	if len(fields) < 3 {
		return nil
	}
	binMajor := majorVersion(fields[2])
	if binMajor != dataMajor {
		return fmt.Errorf("data dir %s holds a PostgreSQL %s cluster but the binaries in %s are PostgreSQL %s: "+
			"use another data dir, remove this one, or point BinDir at PostgreSQL %s",
			c.dataDir, dataMajor, c.run.binDir, binMajor, dataMajor)
	}
	return nil
}

// majorVersion maps "15.14" to "15" and "9.6.24" to "9.6", as PG_VERSION
// spells them.
func majorVersion(v string) string {
	parts := strings.Split(v, ".")
	// "17beta1", "18devel": the major version is the leading digits.
	first := strings.TrimRightFunc(parts[0], func(r rune) bool { return r < '0' || r > '9' })
	if i := strings.IndexFunc(parts[0], func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		first = parts[0][:i]
	}
	if n, err := strconv.Atoi(first); err == nil && n < 10 && len(parts) > 1 {
		return first + "." + parts[1]
	}
	return first
}

// running reports whether a live server owns the data directory
// (pg_ctl status checks postmaster.pid's process, so a stale file left by a
// crash counts as not running).
func (c *Cluster) running(ctx context.Context) (bool, error) {
	_, err := c.run.run(ctx, "pg_ctl", "status", "-D", c.dataDir)
	switch {
	case err == nil:
		return true, nil
	case exitCode(err) == 3: // no server running
		return false, nil
	default:
		return false, fmt.Errorf("server status: %w", err)
	}
}

// pidFilePort reads the port of the running server from postmaster.pid,
// whose fourth line it is.
func (c *Cluster) pidFilePort() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read postmaster.pid: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return 0, errors.New("postmaster.pid has no port line yet")
	}
	port, err := strconv.Atoi(strings.TrimSpace(lines[3]))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid port %q: %w", lines[3], err)
	}
	return port, nil
}

// start starts the server on port, or on a free port when port is 0 (trying
// a few, since another process may take the one picked before the server
// binds it).
func (c *Cluster) start(ctx context.Context, port int) error {
	attempts := 1
	if port == 0 {
		attempts = 3
	}
	var err error
	for range attempts {
		p := port
		if p == 0 {
			if p, err = freePort(); err != nil {
				return err
			}
		}
		if err = c.startOn(ctx, p); err == nil {
			c.port = p
			return nil
		}
	}
	return err
}

func (c *Cluster) startOn(ctx context.Context, port int) error {
	// The unix socket sits inside the data dir, away from the system
	// server's /var/run/postgresql. Socket paths are limited to 107 bytes;
	// past that the server listens on TCP only, which is all we use.
	sockDir := c.dataDir
	if len(sockDir)+len("/.s.PGSQL.")+len(strconv.Itoa(port)) > 107 {
		c.logger.Info("devpg: data dir path too long for a unix socket, listening on TCP only", "data_dir", c.dataDir)
		sockDir = ""
	}
	// pg_ctl hands -o to the shell that execs postgres: quote it.
	opts := fmt.Sprintf("-p %d -h 127.0.0.1 -k %s", port, shellQuote(sockDir))
	for _, name := range slices.Sorted(maps.Keys(c.settings)) {
		opts += " -c " + shellQuote(name+"="+c.settings[name])
	}
	c.logger.Info("devpg: starting server", "data_dir", c.dataDir, "port", port)
	_, err := c.run.run(ctx, "pg_ctl", "start",
		"-D", c.dataDir,
		"-l", filepath.Join(c.dataDir, logFile),
		"-o", opts,
		"-w", "-t", strconv.Itoa(int(startTimeout/time.Second)),
		"-s",
	)
	if err != nil {
		return fmt.Errorf("start server: %w%s", err, c.logTail())
	}
	return nil
}

// logTail returns the end of the server log, to explain a failed start.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(filepath.Join(c.dataDir, logFile))
	if err != nil || len(b) == 0 {
		return ""
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return "\nserver log (" + filepath.Join(c.dataDir, logFile) + "), last lines:\n" + strings.TrimSpace(string(b))
}

// ensureDatabase creates the paystream role and database when missing. A
// server that is still starting up (one reused from an earlier run) gets a
// few seconds to accept connections.
func (c *Cluster) ensureDatabase(ctx context.Context) error {
	var conn *pgx.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		conn, err = pgx.Connect(ctx, c.url(superuser, "postgres")+"&connect_timeout=5")
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("connect to server on port %d: %w", c.port, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var exists, replication bool
	err := conn.QueryRow(ctx, "SELECT count(*) > 0, coalesce(bool_or(rolreplication), false) FROM pg_roles WHERE rolname = $1", Role).
		Scan(&exists, &replication)
	if err != nil {
		return fmt.Errorf("look up role %s: %w", Role, err)
	}
	if !exists {
		c.logger.Info("devpg: creating role", "role", Role)
		_, err := conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{Role}.Sanitize()+" LOGIN CREATEDB")
		if err != nil && !isSQLState(err, "42710") { // duplicate_object: created concurrently
			return fmt.Errorf("create role %s: %w", Role, err)
		}
	}
	if c.repl && !replication {
		if _, err := conn.Exec(ctx, "ALTER ROLE "+pgx.Identifier{Role}.Sanitize()+" REPLICATION"); err != nil {
			return fmt.Errorf("grant role %s replication: %w", Role, err)
		}
	}
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", Database).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", Database, err)
	}
	if !exists {
		c.logger.Info("devpg: creating database", "database", Database)
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{Database}.Sanitize()+" OWNER "+pgx.Identifier{Role}.Sanitize())
		if err != nil && !isSQLState(err, "42P04") { // duplicate_database: created concurrently
			return fmt.Errorf("create database %s: %w", Database, err)
		}
	}
	return nil
}

func isSQLState(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// shellQuote quotes s as one word for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
