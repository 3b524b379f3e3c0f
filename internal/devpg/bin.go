package devpg

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// serverBinaries are the programs a private cluster needs from one
// PostgreSQL installation.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// errNoBinaries says what is missing and how to get it.
var errNoBinaries = errors.New("no PostgreSQL server binaries (initdb, pg_ctl, postgres) found " +
	"in `pg_config --bindir`, /usr/lib/postgresql/*/bin or $PATH: install them " +
	"(Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; " +
	"macOS: brew install postgresql), point BinDir at them, " +
	"or set PAYSTREAM_DATABASE_URL to use a server you already run")

// findBinDir returns the directory holding initdb, pg_ctl and postgres.
// An explicit dir must hold all three. Otherwise it tries, in order,
// `pg_config --bindir`, the newest /usr/lib/postgresql/<major>/bin (Debian,
// Ubuntu) or /usr/pgsql-<major>/bin (RHEL), and finally the directory that
// pg_ctl on $PATH resolves to once symlinks are followed (wrappers in
// /usr/local/bin are often links into one of the above).
func findBinDir(dir string) (string, error) {
	if dir != "" {
		if missing := missingBinaries(dir); len(missing) > 0 {
			return "", fmt.Errorf("BinDir %s lacks %s: %w", dir, strings.Join(missing, ", "), errNoBinaries)
		}
		return dir, nil
	}
	for _, cand := range candidateBinDirs() {
		if len(missingBinaries(cand)) == 0 {
			return cand, nil
		}
	}
	return "", errNoBinaries
}

func candidateBinDirs() []string {
	var out []string
	if out2, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out2)); d != "" {
			out = append(out, d)
		}
	}
	out = append(out, newestVersioned("/usr/lib/postgresql/*/bin", "/usr/lib/postgresql/", "/bin")...)
	out = append(out, newestVersioned("/usr/pgsql-*/bin", "/usr/pgsql-", "/bin")...)
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			out = append(out, filepath.Dir(real))
		}
		out = append(out, filepath.Dir(p))
	}
	return out
}

// newestVersioned globs pattern and orders the matches by the version found
// between prefix and suffix, newest first ("16" before "9.6").
func newestVersioned(pattern, prefix, suffix string) []string {
	matches, _ := filepath.Glob(pattern)
	version := func(p string) float64 {
		v, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(p, prefix), suffix), 64)
		return v
	}
	sort.SliceStable(matches, func(i, j int) bool { return version(matches[i]) > version(matches[j]) })
	return matches
}

func missingBinaries(dir string) []string {
	var missing []string
	for _, name := range serverBinaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	return missing
}
