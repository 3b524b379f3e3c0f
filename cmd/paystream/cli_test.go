package main

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/cmdline/cmdlinetest"
	"github.com/paystream/paystream/internal/testenv"
)

// paystream is the binary under test, run in child processes so that exit
// statuses, kong's os.Exit after --help and what goes to stdout and stderr
// are observed as a user sees them; Run leaves no PAYSTREAM_ setting in
// the child's environment but those it is given.
var paystream = cmdlinetest.Binary{EnvVar: "PAYSTREAM_CLI_TEST_RUN_MAIN", Main: run, Timeout: 30 * time.Second}

func TestMain(m *testing.M) { paystream.TestMain(testenv.Wrap(m)) }

// commands returns the subcommands `paystream --help` lists, e.g. "ingest",
// "inspect payment".
func commands(t *testing.T, help string) []string {
	t.Helper()
	_, list, ok := strings.Cut(help, "\nCommands:\n")
	if !ok {
		t.Fatalf("--help lists no commands:\n%s", help)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^  (\S+(?: [a-z]\S*)?)\s{2,}`).FindAllStringSubmatch(list, -1) {
		out = append(out, m[1])
	}
	return out
}

// readmeEnv reads the configuration table of docs/running.md: for each PAYSTREAM_
// variable, the commands it is documented as used by ("all" meaning every
// service command).
func readmeEnv(t *testing.T) map[string][]string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "running.md"))
	if err != nil {
		t.Fatal(err)
	}
	services := []string{"ingest", "processor", "sink", "migrate", "dev"}
	out := map[string][]string{}
	row := regexp.MustCompile("(?m)^\\| (`PAYSTREAM_[^|]*) \\|[^|]*\\|[^|]*\\| ([^|]*) \\|$")
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		var users []string
		for u := range strings.SplitSeq(m[2], ",") {
			switch u = strings.TrimSpace(u); u {
			case "all":
				users = append(users, services...)
			case "inspect":
				users = append(users, "inspect payment")
			default:
				users = append(users, u)
			}
		}
		// "`PAYSTREAM_RAW_TOPIC` / `_STATE_TOPIC` / `_DLQ_TOPIC`"
		for _, v := range regexp.MustCompile("`(PAYSTREAM)?(_[A-Z_]+)`").FindAllStringSubmatch(m[1], -1) {
			out["PAYSTREAM"+v[2]] = users
		}
	}
	if len(out) < 10 {
		t.Fatalf("found %d variables in README's configuration table, want the whole table: %v", len(out), out)
	}
	return out
}

// TestHelp: `paystream --help` and every subcommand's --help exit 0; each
// command's help names every environment variable the README documents it
// as using; and each service command's flags all have one ("Every flag has
// an environment variable").
func TestHelp(t *testing.T) {
	t.Parallel()
	top := paystream.Run(t, nil, "--help")
	if top.Code != 0 || !strings.Contains(top.Stdout, "Usage: paystream") {
		t.Fatalf("--help: exit %d, stdout:\n%s\nstderr:\n%s", top.Code, top.Stdout, top.Stderr)
	}
	cmds := commands(t, top.Stdout)
	for _, want := range []string{"ingest", "processor", "sink", "migrate", "dev", "inspect payment", "version"} {
		if !slices.Contains(cmds, want) {
			t.Errorf("--help does not list %q (lists %q)", want, cmds)
		}
	}
	docs := readmeEnv(t)
	t.Logf("commands %q; README's variables and their users %v", cmds, docs)
	flagLine := regexp.MustCompile(`(?m)^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)`)
	envRef := regexp.MustCompile(`\(\$(PAYSTREAM_[A-Z_]+)\)`)
	for _, cmd := range cmds {
		t.Run(strings.ReplaceAll(cmd, " ", "_"), func(t *testing.T) {
			t.Parallel()
			r := paystream.Run(t, nil, append(strings.Fields(cmd), "--help")...)
			if r.Code != 0 || !strings.Contains(r.Stdout, "Usage: paystream "+cmd) {
				t.Fatalf("%s --help: exit %d, stdout:\n%s\nstderr:\n%s", cmd, r.Code, r.Stdout, r.Stderr)
			}
			help := r.Stdout
			// Kong wraps help lines; join them so "($PAYSTREAM_X)" is whole.
			joined := regexp.MustCompile(`\n\s+`).ReplaceAllString(help, " ")
			for env, users := range docs {
				if slices.Contains(users, cmd) && !strings.Contains(joined, "$"+env) {
					t.Errorf("%s --help does not mention %s, which README's configuration table says it uses", cmd, env)
				}
			}
			if !slices.Contains([]string{"ingest", "processor", "sink", "migrate", "dev"}, cmd) {
				return
			}
			// Each flag's help runs until the next flag; it must name its variable.
			_, flags, _ := strings.Cut(help, "\nFlags:\n")
			locs := flagLine.FindAllStringSubmatchIndex(flags, -1)
			for i, loc := range locs {
				name := flags[loc[2]:loc[3]]
				end := len(flags)
				if i+1 < len(locs) {
					end = locs[i+1][0]
				}
				if name != "--help" && !envRef.MatchString(strings.ReplaceAll(flags[loc[0]:end], "\n", " ")) {
					t.Errorf("%s %s has no environment variable in --help", cmd, name)
				}
			}
		})
	}
}

// TestMissingConfig: a command started without what it needs fails at
// once, with a non-zero status and a message naming the flag and the
// environment variable to set — before it connects to anything.
func TestMissingConfig(t *testing.T) {
	t.Parallel()
	sources := filepath.Join(t.TempDir(), "sources.yaml")
	if err := os.WriteFile(sources, []byte("sources:\n  - name: acme\n    driver: standardwebhooks\n    secrets: [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Unroutable addresses: reaching them would hang, not fail.
	broker := "--kafka-brokers=127.0.0.1:1"
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"processor"}, []string{"--kafka-brokers", "PAYSTREAM_KAFKA_BROKERS"}},
		{[]string{"processor", broker}, []string{"--database-url", "PAYSTREAM_DATABASE_URL"}},
		{[]string{"sink"}, []string{"--kafka-brokers", "PAYSTREAM_KAFKA_BROKERS"}},
		{[]string{"sink", broker}, []string{"--database-url", "PAYSTREAM_DATABASE_URL"}},
		{[]string{"ingest"}, []string{"--kafka-brokers", "PAYSTREAM_KAFKA_BROKERS"}},
		{[]string{"ingest", broker}, []string{"--sources", "PAYSTREAM_SOURCES"}},
		{[]string{"migrate"}, []string{"--database-url", "PAYSTREAM_DATABASE_URL"}},
		{[]string{"dev"}, []string{"--sources", "PAYSTREAM_SOURCES"}},
		{[]string{"inspect", "payment", "--source", "acme", "--id", "pay_1", "--data-dir", t.TempDir()},
			[]string{"--database-url", "PAYSTREAM_DATABASE_URL", "paystream dev"}},
		{[]string{"inspect", "payment", "--id", "pay_1"}, []string{"--source"}},
	}
	for _, tc := range cases {
		start := time.Now()
		r := paystream.Run(t, nil, tc.args...)
		took := time.Since(start)
		if r.Code == 0 {
			t.Errorf("%s: exit 0, want a failure", strings.Join(tc.args, " "))
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(r.Stderr, w) {
				t.Errorf("%s: stderr %q does not mention %s", strings.Join(tc.args, " "), r.Stderr, w)
			}
		}
		if took > 10*time.Second {
			t.Errorf("%s: took %s to fail", strings.Join(tc.args, " "), took)
		}
	}
}

// TestFlagsWinOverEnv: a flag and its environment variable both work, and
// the flag wins when both are set.
func TestFlagsWinOverEnv(t *testing.T) {
	t.Parallel()
	fromEnv, fromFlag := filepath.Join(t.TempDir(), "env-dir"), filepath.Join(t.TempDir(), "flag-dir")
	args := []string{"inspect", "payment", "--source", "acme", "--id", "pay_1"}
	r := paystream.Run(t, []string{"PAYSTREAM_DATA_DIR=" + fromEnv}, args...)
	if r.Code == 0 || !strings.Contains(r.Stderr, fromEnv) {
		t.Errorf("PAYSTREAM_DATA_DIR alone: exit %d, stderr %q; want it used", r.Code, r.Stderr)
	}
	r = paystream.Run(t, []string{"PAYSTREAM_DATA_DIR=" + fromEnv}, append(args, "--data-dir", fromFlag)...)
	if r.Code == 0 || !strings.Contains(r.Stderr, fromFlag) || strings.Contains(r.Stderr, fromEnv) {
		t.Errorf("--data-dir and PAYSTREAM_DATA_DIR: exit %d, stderr %q; want the flag used", r.Code, r.Stderr)
	}
}

// TestBadSourcesFile: a sources file mistake stops the command with the
// source and field named and the secret kept out of the message.
func TestBadSourcesFile(t *testing.T) {
	t.Parallel()
	const secret = "whsec_c2VjcmV0LXRoYXQtbXVzdC1ub3QtbGVhaw=="
	path := filepath.Join(t.TempDir(), "sources.yaml")
	if err := os.WriteFile(path, []byte("sources:\n  - name: acme\n    driver: stripe2\n    secrets: [\""+secret+"\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := paystream.Run(t, nil, "ingest", "--kafka-brokers=127.0.0.1:1", "--sources", path)
	if r.Code == 0 || !strings.Contains(r.Stderr, `source "acme"`) || !strings.Contains(r.Stderr, "stripe2") {
		t.Errorf("exit %d, stderr %q; want a failure naming source acme and driver stripe2", r.Code, r.Stderr)
	}
	if strings.Contains(r.Stderr+r.Stdout, strings.TrimPrefix(secret, "whsec_")) {
		t.Errorf("output contains the secret: %q", r.Stderr)
	}
	if r := paystream.Run(t, nil, "ingest", "--kafka-brokers=127.0.0.1:1", "--sources", path+".missing"); r.Code == 0 ||
		!strings.Contains(r.Stderr, "sources.yaml.missing") {
		t.Errorf("missing sources file: exit %d, stderr %q; want a failure naming it", r.Code, r.Stderr)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"bogus"}, {"processor", "--no-such-flag"}, {"--log-level", "loud", "version"}} {
		r := paystream.Run(t, nil, args...)
		if r.Code == 0 || r.Stderr == "" {
			t.Errorf("paystream %q: exit %d, stderr %q; want a usage error", args, r.Code, r.Stderr)
		}
	}
}

func TestBannerAddr(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"127.0.0.1:8080": "127.0.0.1:8080",
		"0.0.0.0:8080":   "127.0.0.1:8080",
		"[::]:8080":      "127.0.0.1:8080",
		"[::1]:8080":     "[::1]:8080",
		"10.1.2.3:80":    "10.1.2.3:80",
	} {
		addr, err := net.ResolveTCPAddr("tcp", in)
		if err != nil {
			t.Fatal(err)
		}
		if got := bannerAddr(addr); got != want {
			t.Errorf("bannerAddr(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestKafkaSettingsValidated: every command that talks to Kafka reads the
// same TLS and SASL settings and, when one is wrong, stops before
// connecting to anything with one line naming it, the password never
// shown.
func TestKafkaSettingsValidated(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sources := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(sources, []byte("sources:\n  - name: acme\n    driver: standardwebhooks\n    secrets: [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const password = "hunter2-do-not-print"
	missing := filepath.Join(dir, "no-ca.pem")
	// Unroutable: a command that dialed before validating would fail
	// differently (or hang).
	db := "--database-url=postgres://paystream@127.0.0.1:1/paystream?sslmode=disable"
	commands := [][]string{
		{"ingest", "--sources", sources},
		{"processor", db},
		{"sink", db},
		{"migrate", db},
		{"dev", "--sources", sources, "--http-addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "dev"), db},
		{"tail"},
		{"reconcile", db},
		{"dlq", "list"},
		{"republish", db},
	}
	settings := []struct {
		env  []string
		want string
	}{
		{[]string{"PAYSTREAM_KAFKA_TLS_CA_FILE=" + missing}, "paystream: kafka: --kafka-tls-ca-file " + missing + ": no such file\n"},
		{[]string{"PAYSTREAM_KAFKA_SASL_MECHANISM=SCRAM-SHA-512", "PAYSTREAM_KAFKA_SASL_PASSWORD=" + password},
			"paystream: kafka: --kafka-sasl-mechanism SCRAM-SHA-512 needs --kafka-sasl-username\n"},
	}
	for _, args := range commands {
		for _, s := range settings {
			t.Run(strings.Join(args[:1], "_"), func(t *testing.T) {
				t.Parallel()
				env := append([]string{"PAYSTREAM_KAFKA_BROKERS=127.0.0.1:1"}, s.env...)
				r := paystream.Run(t, env, args...)
				if r.Code != 1 || r.Stderr != s.want {
					t.Errorf("%s with %q: exit %d, stderr %q; want exit 1 and %q", strings.Join(args, " "), s.env, r.Code, r.Stderr, s.want)
				}
				if strings.Contains(r.Stdout+r.Stderr, password) {
					t.Errorf("%s printed the password", args[0])
				}
			})
		}
	}
}
