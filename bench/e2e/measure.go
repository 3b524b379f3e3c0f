package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/paystream/paystream/bench/internal/rig"
)

// treeCPU returns the CPU time used so far by root and its direct
// children: Postgres's postmaster and its backends and auxiliary
// processes. Children that exited are in the postmaster's reaped time, so
// a backend that ends between two samples is still counted.
func treeCPU(root int) time.Duration {
	own, reaped, _, err := rig.ProcTimes(root)
	if err != nil {
		return 0
	}
	total := own + reaped
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return total
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		if own, _, ppid, err := rig.ProcTimes(pid); err == nil && ppid == root {
			total += own
		}
	}
	return total
}

// walsendersCPU names the CPU of Postgres's walsenders in a run's CPU map:
// the relay's logical decoding, which reads every WAL record of the
// database. It is part of "postgres" (treeCPU), reported apart.
const walsendersCPU = "postgres walsenders"

// childrenCPU returns the CPU time used so far by those of root's direct
// children whose command line (their process title, for Postgres) starts
// with prefix. Children that exited between two samples are not counted.
func childrenCPU(root int, prefix string) time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var total time.Duration
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		own, _, ppid, err := rig.ProcTimes(pid)
		if err != nil || ppid != root {
			continue
		}
		if cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.HasPrefix(string(cmd), prefix) {
			total += own
		}
	}
	return total
}

// jitCPU names the CPU of the Kafka broker's JIT compiler threads in a
// run's CPU map: the JVM compiling the broker's hot code, most of the
// broker's CPU in the first minutes after it starts and next to none once
// it is warm. It is part of "broker", reported apart.
const jitCPU = "broker JIT compiler"

// threadsCPU returns the CPU time used so far by those of pid's threads
// whose name (/proc/<pid>/task/<tid>/comm, as the JVM sets it: "C2
// CompilerThre", "C1 CompilerThre") contains sub.
func threadsCPU(pid int, sub string) time.Duration {
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var total time.Duration
	for _, e := range entries {
		b, err := os.ReadFile(dir + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || !strings.Contains(s[open+1:end], sub) {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+st) * rig.ClockTick
	}
	return total
}

// benchCPU names, in a run's CPU map, the CPU of this program: mostly the
// load generator (an HTTP client building and signing every request), plus
// the state watcher and the polls of Postgres. It shares the machine with
// the design it measures, but is no part of it: reported apart, not in the
// totals.
const benchCPU = "bench-e2e itself"

// meter samples the CPU time of named processes.
type meter struct {
	names []string
	read  map[string]func() time.Duration
}

func (m *meter) add(name string, read func() time.Duration) {
	if m.read == nil {
		m.read = map[string]func() time.Duration{}
	}
	m.names = append(m.names, name)
	m.read[name] = read
}

// sample returns each process's CPU time so far.
func (m *meter) sample() map[string]time.Duration {
	out := make(map[string]time.Duration, len(m.names))
	for _, n := range m.names {
		out[n] = m.read[n]()
	}
	return out
}

// cpuPerDelivery returns, per process, the CPU microseconds used between
// two samples divided by the number of deliveries.
func cpuPerDelivery(before, after map[string]time.Duration, deliveries int) map[string]float64 {
	out := make(map[string]float64, len(after))
	for n, a := range after {
		out[n] = float64((a - before[n]).Microseconds()) / float64(max(deliveries, 1))
	}
	return out
}

// postmasterPID returns the pid of the Postgres cluster serving conn: the
// parent of conn's backend. It works when the cluster runs on this
// machine, as the local stack's does.
func postmasterPID(ctx context.Context, conn *pgx.Conn) (int, error) {
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, fmt.Errorf("backend pid: %w", err)
	}
	_, _, ppid, err := rig.ProcTimes(backend)
	if err != nil {
		return 0, fmt.Errorf("postgres backend %d is not on this machine: %w", backend, err)
	}
	return ppid, nil
}

// walLSN returns the cluster's current WAL insert position.
func walLSN(ctx context.Context, conn *pgx.Conn) (string, error) {
	var lsn string
	err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walBytes returns the WAL written between two positions.
func walBytes(ctx context.Context, conn *pgx.Conn, from, to string) (int64, error) {
	var n int64
	err := conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, to, from).Scan(&n)
	return n, err
}

// machineInfo describes where the bench ran, for the report.
type machineInfo struct {
	Date    string `json:"date"`
	Commit  string `json:"commit"`
	CPUs    int    `json:"cpus"`
	CPU     string `json:"cpu_model"`
	Kernel  string `json:"kernel"`
	LoadAvg string `json:"load_average_before"`
	Go      string `json:"go"`
}

func describeMachine() machineInfo {
	m := machineInfo{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
			m.Commit += " (with uncommitted changes)"
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return m
}
