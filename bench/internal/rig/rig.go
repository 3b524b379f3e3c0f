// Package rig is what the benches share around the design they measure:
// the source they sign webhooks for, the local stack's broker and the CPU
// time of processes (from /proc), the record count of a topic, and an HTTP
// server that lives as long as a context, and the signature check and
// answer of a webhook server.
package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/source"
)

// SourcesYAML is the one source every bench target accepts: Standard
// Webhooks, with the specification's example secret.
const SourcesYAML = `
sources:
  - name: bench
    driver: standardwebhooks
    secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
`

// ClockTick is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const ClockTick = time.Second / 100

// ProcTimes reads /proc/<pid>/stat: the process's own CPU time
// (utime+stime), the CPU time of its children it has reaped
// (cutime+cstime), and its parent's pid.
func ProcTimes(pid int) (own, reaped time.Duration, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name (field 2) may hold spaces: count after its ')'.
	// Then: 3 state, 4 ppid, … 14 utime, 15 stime, 16 cutime, 17 cstime.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b)[i+1:])
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	ppid = int(n(1))
	own = time.Duration(n(11)+n(12)) * ClockTick
	reaped = time.Duration(n(13)+n(14)) * ClockTick
	return own, reaped, ppid, nil
}

// ProcessCPU returns the CPU time pid has used so far, 0 when it is gone.
func ProcessCPU(pid int) time.Duration {
	own, _, _, err := ProcTimes(pid)
	if err != nil {
		return 0
	}
	return own
}

// StackBrokerPID returns the pid of the local stack's Kafka broker, from
// the pid file deploy/stack.sh keeps, or 0.
func StackBrokerPID() int {
	dir := os.Getenv("PAYSTREAM_STACK_DIR")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return 0
		}
		dir = home + "/.cache/paystream/stack"
	}
	b, err := os.ReadFile(dir + "/kafka/kafka.pid")
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); pid <= 0 || err != nil {
		return 0
	}
	return pid
}

// Records returns the number of records ever written to topic: the sum
// of its partitions' end offsets.
func Records(ctx context.Context, adm *kadm.Client, topic string) (int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var total int64
	var perr error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			perr = o.Err
		}
		total += o.Offset
	})
	return total, perr
}

// VerifiedRequest reads r's body (src.MaxBodyBytes at most) and checks its
// signature with src's driver, the first things ingest does with a
// webhook. When either fails it has answered (400 or 401) and returns nil.
func VerifiedRequest(w http.ResponseWriter, r *http.Request, src *source.Source) *provider.Request {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, src.MaxBodyBytes))
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return nil
	}
	pr := &provider.Request{Header: r.Header, Query: r.URL.Query(), Body: body, Now: time.Now()}
	if err := src.Driver.Verify(pr); err != nil {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return nil
	}
	return pr
}

// okBody is ingest's answer to a webhook it accepted.
var okBody = []byte(`{"received":true}` + "\n")

// WriteOK answers a webhook as accepted, with ingest's body.
func WriteOK(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(okBody)
}

// Serve serves h on ln until ctx ends, then shuts down (5 seconds at most
// for requests in flight). Headers must come within 5 seconds and a whole
// request within 15.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
