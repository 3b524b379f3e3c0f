package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"

	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/testenv"
)

// proc is one container of the example overlay, run as a local process.
type proc struct {
	name  string
	w     workload
	c     corev1.Container
	env   map[string]string
	ports map[int32]int // containerPort -> local loopback port
	run   *testenv.Process
}

// localProc prepares a container of the rendered overlay to run here: its
// environment as the kubelet would build it, with the test's Kafka,
// database, topics and group in place of the overlay's, listen addresses
// moved to free loopback ports, and the mounted sources file written to a
// temporary directory.
func localProc(t *testing.T, r *rendered, w workload, podName string, overrides map[string]string) *proc {
	t.Helper()
	c := w.Pod.Spec.Containers[0]
	env, err := r.env(c, podName)
	if err != nil {
		t.Fatalf("%s: %v", podName, err)
	}
	p := &proc{name: podName, w: w, c: c, env: env, ports: map[int32]int{}}
	listen, err := listenPorts(env)
	if err != nil {
		t.Fatal(err)
	}
	for port, name := range listen {
		addr := testenv.FreeAddr(t)
		_, local, _ := net.SplitHostPort(addr)
		p.ports[port], _ = strconv.Atoi(local)
		env[name] = addr
	}
	if path, ok := env["PAYSTREAM_SOURCES"]; ok {
		file, err := r.mountedFile(w.Pod.Spec, c, path)
		if err != nil {
			t.Fatal(err)
		}
		local := filepath.Join(t.TempDir(), filepath.Base(path))
		if err := os.WriteFile(local, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		env["PAYSTREAM_SOURCES"] = local
	}
	// The Kafka connection's files must be mounted too (their placeholder
	// contents are replaced through overrides by the stack's).
	for path, setting := range mountedPaths(env) {
		if _, err := r.mountedFile(w.Pod.Spec, c, path); err != nil {
			t.Fatalf("%s: %s=%s: %v", podName, setting, path, err)
		}
	}
	for k, v := range overrides {
		env[k] = v
	}
	return p
}

// environ is the test process's environment without PAYSTREAM_* settings,
// plus the container's.
func (p *proc) environ() []string {
	var extra []string
	for k, v := range p.env {
		extra = append(extra, k+"="+v)
	}
	return testenv.Environ(extra...)
}

// start runs the container's command and stops it (SIGTERM, then SIGKILL
// after 30s) when the test ends.
func (p *proc) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(binary, p.c.Args...)
	cmd.Env = p.environ()
	p.run = testenv.StartProcess(t, p.name, cmd, 30*time.Second)
}

// url is the URL of path on the local port standing for the container's
// port (a number or a name).
func (p *proc) url(port, path string) (string, error) {
	cp, ok := containerPort(p.c, port)
	if !ok {
		return "", fmt.Errorf("%s: no container port %s", p.name, port)
	}
	local, ok := p.ports[cp]
	if !ok {
		return "", fmt.Errorf("%s: paystream does not listen on container port %d", p.name, cp)
	}
	return fmt.Sprintf("http://127.0.0.1:%d%s", local, path), nil
}

// get fetches path on the local port standing for the container's port.
func (p *proc) get(port, path string) (int, []byte, error) {
	url, err := p.url(port, path)
	if err != nil {
		return 0, nil, err
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, err = body.ReadFrom(resp.Body)
	return resp.StatusCode, body.Bytes(), err
}

// waitProbes waits until every probe of the container answers 200.
func (p *proc) waitProbes(t *testing.T) {
	t.Helper()
	for kind, pr := range probes(p.c) {
		testenv.WaitFor(t, 2*time.Minute, func() error {
			if err := p.run.Exited(); err != nil {
				return fmt.Errorf("%w: %s", err, p.run.Output.String())
			}
			code, _, err := p.get(pr.HTTPGet.Port.String(), pr.HTTPGet.Path)
			if err != nil {
				return fmt.Errorf("%s %s probe: %w", p.name, kind, err)
			}
			if code != http.StatusOK {
				return fmt.Errorf("%s %s probe GET %s: %d", p.name, kind, pr.HTTPGet.Path, code)
			}
			return nil
		})
		t.Logf("%s: %s probe GET %s on port %s answers 200", p.name, kind, pr.HTTPGet.Path, pr.HTTPGet.Port.String())
	}
}

// exported is what a scrape showed: each series name with its label names.
type exported map[string][]string

func (e exported) add(families map[string]*dto.MetricFamily) {
	for name, f := range families {
		names := map[string][]string{name: nil}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			names = map[string][]string{name + "_bucket": {"le"}, name + "_sum": nil, name + "_count": nil}
		case dto.MetricType_SUMMARY:
			names = map[string][]string{name: {"quantile"}, name + "_sum": nil, name + "_count": nil}
		}
		for series, extra := range names {
			lbls := append(e[series], extra...)
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					lbls = append(lbls, l.GetName())
				}
			}
			slices.Sort(lbls)
			e[series] = slices.Compact(lbls)
		}
	}
}

// scrape fetches and parses a process's /metrics on the ServiceMonitor's port.
func (p *proc) scrape(t *testing.T, port, path string) testenv.Metrics {
	t.Helper()
	url, err := p.url(port, path)
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Scrape(t, url)
}

// buildVersion returns the version label of paystream_build_info if the
// family has exactly one series, of value 1.
func buildVersion(families map[string]*dto.MetricFamily) string {
	f, ok := families["paystream_build_info"]
	if !ok || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetGauge().GetValue() != 1 {
		return ""
	}
	for _, l := range f.GetMetric()[0].GetLabel() {
		if l.GetName() == "version" {
			return l.GetValue()
		}
	}
	return ""
}

// TestManifestsRunOnTheBinary runs the example overlay's containers as
// local processes on the real Kafka and Postgres, each with the command,
// environment, secrets and sources file the manifests give it (only the
// addresses, topics, group and database are the test's): the migrate Job to
// completion, then ingest, one processor and two sinks. It checks that
// every probe the manifests declare answers 200 on the port they name,
// that a webhook signed with the overlay's source secret goes through to
// the state topic, that exactly one sink is active, and — scraping each
// process on the port the ServiceMonitor scrapes — that every metric the
// alert rules and the dashboard name is exported by the binary with the
// labels they use (or is a labelled family the code declares that has no
// series until its first event, such as batch failures by class).
func TestManifestsRunOnTheBinary(t *testing.T) {
	testenv.SkipIfShort(t)
	r := render(t, exampleDir)
	db := testenv.NewDB(t)
	testenv.Kafka(t) // the cluster answers
	// The overlay's Kafka is TLS with SCRAM-SHA-512 and its Postgres
	// verify-full: the processes run with its settings on the stack's
	// SASL_SSL listener and Postgres over TLS, only the addresses, user and
	// the mounted files' contents being the stack's.
	sec := testenv.Secured(t)
	overrides := map[string]string{
		"PAYSTREAM_KAFKA_BROKERS":            strings.Join(sec.SASLBrokers, ","),
		"PAYSTREAM_KAFKA_SASL_USERNAME":      sec.Username,
		"PAYSTREAM_KAFKA_TLS_CA_FILE":        sec.CAFile,
		"PAYSTREAM_KAFKA_SASL_PASSWORD_FILE": sec.PasswordFile,
		"PAYSTREAM_DATABASE_URL":             db.TLSURL(t),
		"PAYSTREAM_RAW_TOPIC":                testenv.Topic(t, "raw", 3),
		"PAYSTREAM_STATE_TOPIC":              testenv.Topic(t, "state", 3),
		"PAYSTREAM_DLQ_TOPIC":                testenv.Topic(t, "dlq", 3),
		"PAYSTREAM_CHECKPOINT_TOPIC":         testenv.Topic(t, "ckpt", 1),
		"PAYSTREAM_GROUP":                    testenv.Group(t),
		"PAYSTREAM_PARTITIONS":               "3",
		"PAYSTREAM_REPLICATION_FACTOR":       "1",
		"PAYSTREAM_SINK_STANDBY_RETRY":       "200ms",
		"PAYSTREAM_SINK_HEARTBEAT_INTERVAL":  "1s",
	}

	migrate := localProc(t, r, r.workload(t, "migrate"), "paystream-migrate", overrides)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, migrate.c.Args...)
	cmd.Env = migrate.environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("migrate Job: %v\n%s", err, out)
	}

	ingest := localProc(t, r, r.workload(t, "ingest"), "paystream-ingest", overrides)
	processor := localProc(t, r, r.workload(t, "processor"), "paystream-processor-0", overrides)
	sinks := []*proc{
		localProc(t, r, r.workload(t, "sink"), "paystream-sink-a", overrides),
		localProc(t, r, r.workload(t, "sink"), "paystream-sink-b", overrides),
	}
	running := append([]*proc{ingest, processor}, sinks...)
	for _, p := range running {
		p.start(t)
	}
	for _, p := range running {
		p.waitProbes(t)
	}

	// A webhook signed with the overlay's secret, its redelivery, and a
	// forged one: accepted, ignored as a duplicate, rejected.
	secret := ingest.env["ACME_WEBHOOK_SECRET"]
	now := time.Now().UTC().Truncate(time.Second)
	body := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_deploy_1","amount":1050,"currency":"BRL"}}`, now.Format(time.RFC3339))
	post := func(sig string) int {
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/webhooks/acme", ingest.ports[8080]), strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("content-type", "application/json")
		req.Header.Set("webhook-id", "msg_deploy_1")
		req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
		req.Header.Set("webhook-signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	sig, err := standardwebhooks.Sign(secret, "msg_deploy_1", now, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	forged, err := standardwebhooks.Sign("whsec_"+strings.Repeat("A", 32), "msg_deploy_1", now, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sig  string
		want int
	}{{sig, http.StatusOK}, {sig, http.StatusOK}, {forged, http.StatusUnauthorized}} {
		if got := post(c.sig); got != c.want {
			t.Fatalf("POST /webhooks/acme: %d, want %d", got, c.want)
		}
	}
	testenv.WaitFor(t, time.Minute, func() error {
		var decided int
		err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM deliveries WHERE status IN ('processed', 'ignored')`).Scan(&decided)
		if err == nil && decided < 2 {
			err = fmt.Errorf("%d deliveries decided, want 2", decided)
		}
		return err
	})

	// Scrape every process on the port the ServiceMonitor scrapes.
	sm := r.ServiceMonitors[0]
	builds := map[string]string{} // process: its paystream_build_info's version label
	scrapeAll := func() (exported, map[string]float64) {
		got := exported{}
		sums := map[string]float64{}
		for _, s := range r.Services {
			if !selects(sm.Spec.Selector.MatchLabels, s.Labels) {
				continue
			}
			for _, ep := range sm.Spec.Endpoints {
				i := slices.IndexFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port })
				if i < 0 {
					continue
				}
				for _, p := range running {
					if !selects(s.Spec.Selector, p.w.Pod.Labels) {
						continue
					}
					families := p.scrape(t, s.Spec.Ports[i].TargetPort.String(), ep.Path)
					got.add(families)
					builds[p.name] = buildVersion(families)
					for _, name := range []string{"paystream_sink_active", "paystream_sink_events_published_total"} {
						sums[name] += families.Sum(name, nil)
					}
				}
			}
		}
		return got, sums
	}
	var got exported
	testenv.WaitFor(t, time.Minute, func() error {
		var sums map[string]float64
		got, sums = scrapeAll()
		if sums["paystream_sink_active"] != 1 || sums["paystream_sink_events_published_total"] < 1 {
			return fmt.Errorf("sum(paystream_sink_active) = %v, events published %v; want 1 active sink and the event published",
				sums["paystream_sink_active"], sums["paystream_sink_events_published_total"])
		}
		return nil
	})

	// Each process says which paystream it is, as `paystream version` does.
	out, err := exec.Command(binary, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	version, _, _ := strings.Cut(strings.TrimPrefix(string(out), "paystream "), "\n")
	for _, p := range running {
		if builds[p.name] != version {
			t.Errorf("%s: paystream_build_info version %q, want %q (paystream version)", p.name, builds[p.name], version)
		}
	}
	t.Logf("paystream version %q; paystream_build_info version by process: %v", version, builds)

	_, rules := ruleQueries(t)
	families := declaredFamilies(t)
	declared := declaredSeries(families)
	var absent []string
	for _, u := range uses(t, append(rules, dashboardQueries(t)...)) {
		if slices.Contains(builtinSeries, u.metric) {
			continue
		}
		lbls, ok := got[u.metric]
		if !ok {
			// A labelled family has no series before its first label
			// value: accept it only if the code declares it so.
			if d, ok := declared[u.metric]; ok && d.family.vec {
				if !slices.Contains(absent, u.metric) {
					absent = append(absent, u.metric)
				}
				continue
			}
			t.Errorf("%s: %s is not exported by the running binary", u.where, u.metric)
			continue
		}
		for _, l := range u.labels {
			if !slices.Contains(lbls, l) && !slices.Contains(targetLabels, l) {
				t.Errorf("%s: %s as exported has no label %q (it has %v)", u.where, u.metric, l, lbls)
			}
		}
	}
	var paystream int
	for name := range got {
		if strings.HasPrefix(name, "paystream_") {
			paystream++
		}
	}
	t.Logf("the running ingest, processor and sinks export %d series names (%d paystream_*); "+
		"named by rules or dashboard but without series yet (labelled families before their first event): %v",
		len(got), paystream, absent)
}
