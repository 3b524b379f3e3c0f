package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// proc is one paystream command running as a child process. Its output
// goes to a log file of its own in the run's directory, one file per
// incarnation, so a crash's last lines stay next to its successor's.
type proc struct {
	name   string // "processor-2"
	bin    string
	args   []string
	logDir string
	starts int

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
	err    error         // cmd.Wait's result, set before exited is closed
}

func newProc(name, bin, logDir string, args ...string) *proc {
	return &proc{name: name, bin: bin, args: args, logDir: logDir}
}

// start starts a new incarnation. The child gets the harness's environment
// without PAYSTREAM_* and OTEL_* variables: everything it needs is a flag,
// so a developer's exported settings (the stack's PAYSTREAM_DATABASE_URL,
// a metrics address) cannot redirect it.
func (p *proc) start() error {
	p.starts++
	logf, err := os.Create(filepath.Join(p.logDir, fmt.Sprintf("%s.%d.log", p.name, p.starts)))
	if err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.exited, p.err = cmd, make(chan struct{}), nil
	go func(exited chan struct{}) {
		p.err = cmd.Wait()
		logf.Close()
		close(exited)
	}(p.exited)
	return nil
}

func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PAYSTREAM_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// alive reports whether the current incarnation is running.
func (p *proc) alive() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig to the current incarnation and waits until it exited,
// at most grace; after that it is SIGKILLed. It reports whether the
// process had to be killed.
func (p *proc) signal(sig syscall.Signal, grace time.Duration) (killed bool, err error) {
	if !p.alive() {
		return false, fmt.Errorf("%s is not running (%v)", p.name, p.err)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return false, fmt.Errorf("signal %s: %w", p.name, err)
	}
	select {
	case <-p.exited:
		return false, nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	return true, nil
}

// stop ends the current incarnation, if any: SIGTERM, SIGKILL after 30 s.
func (p *proc) stop() {
	if p.alive() {
		_, _ = p.signal(syscall.SIGTERM, 30*time.Second)
	}
}

// exitedEarly is the error a wait returns when the process it waits for
// exited.
func (p *proc) exitedEarly() error {
	return fmt.Errorf("%s exited (%v); see %s", p.name, p.err, p.logPath())
}

func (p *proc) logPath() string {
	return filepath.Join(p.logDir, fmt.Sprintf("%s.%d.log", p.name, p.starts))
}

// poll calls check every interval until it returns nil, ctx ends, or one
// of the watched processes exits. The last error of check is in the one
// returned on timeout.
func poll(ctx context.Context, interval time.Duration, check func(context.Context) error, watched ...*proc) error {
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		for _, p := range watched {
			if !p.alive() {
				return p.exitedEarly()
			}
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-time.After(interval):
		}
	}
}
