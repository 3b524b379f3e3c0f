//go:build unix

package devpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// serverUser is the OS account the server runs as when paystream runs as
// root: PostgreSQL refuses to run as root.
const serverUser = "postgres"

// runner runs the PostgreSQL programs of one installation, as serverUser
// when we are root and as ourselves otherwise.
type runner struct {
	binDir string
	logger *slog.Logger
	// cred is nil when the programs run as ourselves.
	cred *syscall.Credential
}

func newRunner(binDir string, logger *slog.Logger) (*runner, error) {
	r := &runner{binDir: binDir, logger: logger}
	if os.Geteuid() != 0 {
		return r, nil
	}
	u, err := user.Lookup(serverUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL must run as the %q OS user, which does not exist (%v): "+
			"create it (useradd --system --home-dir /var/lib/postgresql %s, or install your distribution's postgresql package) "+
			"or run paystream as a non-root user", serverUser, err, serverUser)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", serverUser, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", serverUser, u.Gid, err)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				cred.Groups = append(cred.Groups, uint32(g))
			}
		}
	}
	r.cred = cred
	return r, nil
}

// command builds an invocation of one of the installation's programs. Its
// environment drops PG* variables so that none of the caller's settings
// (PGDATA, PGPORT, PGHOST...) steer it.
func (r *runner) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(r.binDir, name), args...)
	cmd.Dir = "/" // readable by serverUser, unlike root's working directory
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// Its own process group: a Ctrl-C meant for paystream must not reach a
	// postmaster that pg_ctl forks; Stop shuts it down in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: r.cred}
	// pg_ctl start leaves a postmaster behind; never wait on pipes it holds.
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs a program and returns its combined output; a failure's error
// carries that output.
func (r *runner) run(ctx context.Context, name string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := r.command(ctx, name, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	text := strings.TrimSpace(out.String())
	if err != nil {
		if text != "" {
			return text, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, text)
		}
		return text, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return text, nil
}

// prepareDataDir creates dir if needed and makes it usable by the server's
// OS user: owned by it, mode 0700 (initdb and postgres insist), and, when
// that user is not us, every parent directory searchable by it.
func (r *runner) prepareDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("chmod data dir: %w", err)
	}
	if r.cred == nil {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stat data dir: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != r.cred.Uid || st.Gid != r.cred.Gid {
		r.logger.Info("devpg: handing data dir to the server's OS user", "dir", dir, "user", serverUser)
		err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, int(r.cred.Uid), int(r.cred.Gid))
		})
		if err != nil {
			return fmt.Errorf("chown data dir to %s: %w", serverUser, err)
		}
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			r.logger.Warn("devpg: making a parent of the data dir searchable so the server's OS user can reach it",
				"dir", p, "user", serverUser)
			if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("make %s searchable for %s: %w", p, serverUser, err)
			}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// exitCode returns the exit status of a finished command, or -1.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
