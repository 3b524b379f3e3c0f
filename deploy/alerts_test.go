package deploy_test

import (
	"bytes"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	promengine "github.com/prometheus/prometheus/promql"
	promql "github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"go.yaml.in/yaml/v3"

	"github.com/paystream/paystream/deploy"
)

// parseRules parses rule groups with Prometheus's own rule parser.
func parseRules(t *testing.T, where string, b []byte) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, promql.NewParser(promql.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", where, err)
	}
	if groups == nil {
		t.FailNow()
	}
	return groups
}

// alertRules returns the alerting rules of groups in order, recording
// rules left out, each pointing into groups so that a caller may edit it.
func alertRules(groups *rulefmt.RuleGroups) []*rulefmt.Rule {
	var out []*rulefmt.Rule
	for i := range groups.Groups {
		for j := range groups.Groups[i].Rules {
			if r := &groups.Groups[i].Rules[j]; r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// alertRule returns the alert named name of the rules file.
func alertRule(t *testing.T, name string) rulefmt.Rule {
	t.Helper()
	groups, _ := ruleQueries(t)
	for _, r := range alertRules(groups) {
		if r.Alert == name {
			return *r
		}
	}
	t.Fatalf("%s: no alert %s", alertsFile, name)
	return rulefmt.Rule{}
}

// TestAlertRulesRunbookBase: deploy.AlertRules(base) is the rules file
// with each runbook_url under base, and nothing else changed; bases that
// would not give a link are refused.
func TestAlertRulesRunbookBase(t *testing.T) {
	t.Parallel()
	file, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	want := parseRules(t, alertsFile, file)
	for _, base := range []string{"https://wiki.example.com/paystream/operations", "http://docs.internal:8080/runbooks/paystream.html", deploy.RunbookBaseURLAt("v1.2.0")} {
		out, err := deploy.AlertRules(base)
		if err != nil {
			t.Fatalf("AlertRules(%q): %v", base, err)
		}
		got := parseRules(t, "AlertRules("+base+")", out)
		alerts, wantAlerts := alertRules(got), alertRules(want)
		if len(alerts) != len(wantAlerts) {
			t.Fatalf("AlertRules(%q): %d alerts, the file %d", base, len(alerts), len(wantAlerts))
		}
		for i, r := range alerts {
			if url, want := r.Annotations["runbook_url"], base+"#"+strings.ToLower(r.Alert); url != want {
				t.Errorf("AlertRules(%q): %s runbook_url %q, want %q", base, r.Alert, url, want)
			}
			r.Annotations["runbook_url"] = wantAlerts[i].Annotations["runbook_url"]
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("AlertRules(%q) changed more than the runbook links", base)
		}
		if n := bytes.Count(out, []byte("\n")); n != bytes.Count(file, []byte("\n")) {
			t.Errorf("AlertRules(%q): %d lines, the file %d", base, n, bytes.Count(file, []byte("\n")))
		}
		t.Logf("AlertRules(%q): %d alerts linked", base, len(alerts))
	}
	for _, base := range []string{"", "docs/operations.md", "ftp://example.com/ops", "https:///ops", "https://example.com/ops#top", "https://example.com/my ops", `https://example.com/"ops"`} {
		if _, err := deploy.AlertRules(base); err == nil {
			t.Errorf("AlertRules(%q) accepted", base)
		}
	}
}

// TestAlertsCommand: `paystream alerts --runbook-base-url URL` prints
// deploy.AlertRules(URL) under a comment line, and without the flag links
// the page on GitHub (the test binary is not a release: at main).
func TestAlertsCommand(t *testing.T) {
	t.Parallel()
	base := "https://wiki.example.com/paystream/operations"
	for _, c := range []struct {
		args []string
		base string
	}{{[]string{"alerts", "--runbook-base-url", base}, base}, {[]string{"alerts"}, deploy.RunbookBaseURL}} {
		cmd := exec.Command(binary, c.args...)
		cmd.Env = append(os.Environ(), "PAYSTREAM_RUNBOOK_BASE_URL=")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("paystream %s: %v", strings.Join(c.args, " "), err)
		}
		comment, rules, _ := bytes.Cut(out, []byte("\n"))
		want, err := deploy.AlertRules(c.base)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(comment, []byte("# paystream ")) || !bytes.Equal(rules, want) {
			t.Errorf("paystream %s printed something else than the rules linked under %s:\n%s", strings.Join(c.args, " "), c.base, out)
		}
	}
	cmd := exec.Command(binary, "alerts", "--runbook-base-url", "docs/operations.md")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "--runbook-base-url") {
		t.Errorf("paystream alerts with a relative base: %v, %q; want an error naming --runbook-base-url", err, out)
	}
}

// TestNewAlertsFire evaluates the ingest-down and dead-letter rules'
// expressions with Prometheus's own engine on series, one sample a minute,
// that should and should not fire them.
func TestNewAlertsFire(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	// Ingest: instances a and b up; a down from 3m, b from 6m; another
	// job up throughout. From 10m ingest is not scraped at all.
	up, down := []float64{1, 1, 1, 0, 0, 0, 0, 0, 0, 0}, []float64{1, 1, 1, 1, 1, 1, 0, 0, 0, 0}
	// DLQ: acme's counter gains 2 at 20m; beta's stays at 0.
	acme, beta := make([]float64, 40), make([]float64, 40)
	for i := 20; i < 40; i++ {
		acme[i] = 2
	}
	db := queryable(t, map[string][]float64{
		`up{job="paystream-ingest", instance="a"}`:                                              up,
		`up{job="paystream-ingest", instance="b"}`:                                              down,
		`up{job="paystream-processor", instance="c"}`:                                           slices.Repeat([]float64{1}, 40),
		`paystream_ingest_requests_total{source="acme", outcome="dead_lettered"}`:               acme,
		`paystream_ingest_requests_total{source="beta", outcome="dead_lettered"}`:               beta,
		`paystream_ingest_requests_total{source="acme", outcome="accepted", instance="x"}`:      slices.Repeat([]float64{7}, 40),
		`paystream_ingest_requests_total{source="gone", outcome="dead_lettered", instance="y"}`: append(slices.Repeat([]float64{5}, 5), slices.Repeat([]float64{nan}, 35)...),
	})
	for _, c := range []struct {
		alert string
		at    time.Duration
		want  map[string]float64 // firing series and their values; none: not firing
	}{
		{"PaystreamIngestDown", 2 * time.Minute, nil},
		{"PaystreamIngestDown", 4 * time.Minute, nil}, // b still up
		{"PaystreamIngestDown", 7 * time.Minute, map[string]float64{"{}": 0}},
		{"PaystreamIngestDown", 20 * time.Minute, map[string]float64{"{}": 0}}, // not scraped at all
		{"PaystreamWebhooksDeadLettered", 15 * time.Minute, nil},
		{"PaystreamWebhooksDeadLettered", 25 * time.Minute, map[string]float64{`{source="acme"}`: 2}},
		{"PaystreamWebhooksDeadLettered", 39 * time.Minute, nil}, // 15 minutes later
	} {
		got := eval(t, db, alertRule(t, c.alert).Expr, c.at)
		t.Logf("%s at %v: %v", c.alert, c.at, got)
		if len(got) != len(c.want) {
			t.Errorf("%s at %v: %v, want %v", c.alert, c.at, got, c.want)
			continue
		}
		for k, v := range c.want {
			if g, ok := got[k]; !ok || math.Abs(g-v) > 1e-9 {
				t.Errorf("%s at %v: %v, want %v", c.alert, c.at, got, c.want)
			}
		}
	}
}

// floatSample is one float sample of a series.
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                    { return s.t }
func (floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                  { return s.f }
func (floatSample) H() *histogram.Histogram       { return nil }
func (floatSample) FH() *histogram.FloatHistogram { return nil }
func (floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample         { return s }

// seriesSet is a storage.SeriesSet over a slice.
type seriesSet struct {
	series []storage.Series
	i      int
}

func (s *seriesSet) Next() bool                      { s.i++; return s.i <= len(s.series) }
func (s *seriesSet) At() storage.Series              { return s.series[s.i-1] }
func (*seriesSet) Err() error                        { return nil }
func (*seriesSet) Warnings() annotations.Annotations { return nil }

// queryable is an in-memory storage of series, given as selectors with
// one value a minute from time 0 (NaN: no sample).
func queryable(t *testing.T, series map[string][]float64) storage.Queryable {
	t.Helper()
	var all []storage.Series
	for sel, values := range series {
		lbls, err := promql.NewParser(promql.Options{}).ParseMetric(sel)
		if err != nil {
			t.Fatal(err)
		}
		var samples []chunks.Sample
		for i, v := range values {
			if !math.IsNaN(v) {
				samples = append(samples, floatSample{t: int64(i) * time.Minute.Milliseconds(), f: v})
			}
		}
		all = append(all, storage.NewListSeries(lbls, samples))
	}
	slices.SortFunc(all, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
	return &storage.MockQueryable{MockQuerier: &storage.MockQuerier{
		SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			var out []storage.Series
			for _, s := range all {
				if !slices.ContainsFunc(ms, func(m *labels.Matcher) bool { return !m.Matches(s.Labels().Get(m.Name)) }) {
					out = append(out, s)
				}
			}
			return &seriesSet{series: out}
		},
	}}
}

// eval runs expr at the instant at on db and returns the resulting series
// and their values.
func eval(t *testing.T, db storage.Queryable, expr string, at time.Duration) map[string]float64 {
	t.Helper()
	engine := promengine.NewEngine(promengine.EngineOpts{MaxSamples: 1e6, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})
	q, err := engine.NewInstantQuery(t.Context(), db, nil, expr, time.UnixMilli(0).Add(at))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(t.Context())
	if res.Err != nil {
		t.Fatalf("%s at %v: %v", expr, at, res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatalf("%s at %v: %v", expr, at, err)
	}
	out := map[string]float64{}
	for _, s := range vec {
		out[s.Metric.String()] = s.F
	}
	return out
}

// TestIngestDownSelectsIngestJob: the job the ingest-down rule selects is
// the one Prometheus gives ingest's scrape, both in deploy/prometheus.yml
// (compose) and under the Prometheus Operator (the ServiceMonitor's job is
// the name of the Service it scrapes, the manifests setting no jobLabel).
func TestIngestDownSelectsIngestJob(t *testing.T) {
	t.Parallel()
	var jobs []string
	p := promql.NewParser(promql.Options{})
	e, err := p.ParseExpr(alertRule(t, "PaystreamIngestDown").Expr)
	if err != nil {
		t.Fatal(err)
	}
	promql.Inspect(e, func(n promql.Node, _ []promql.Node) error {
		if vs, ok := n.(*promql.VectorSelector); ok && vs.Name == "up" {
			for _, m := range vs.LabelMatchers {
				if m.Name == "job" {
					jobs = append(jobs, m.Value)
				}
			}
		}
		return nil
	})
	if len(jobs) != 1 {
		t.Fatalf("PaystreamIngestDown selects jobs %q, want one", jobs)
	}
	job := jobs[0]

	b, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	compose := ""
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				if strings.HasPrefix(target, "ingest:") {
					compose = sc.JobName
				}
			}
		}
	}
	if compose != job {
		t.Errorf("deploy/prometheus.yml scrapes ingest as job %q, PaystreamIngestDown selects job %q", compose, job)
	}

	r := render(t, exampleDir)
	sm := r.ServiceMonitors[0]
	operator := ""
	for _, s := range r.Services {
		if s.Labels["app.kubernetes.io/component"] == "ingest" && selects(sm.Spec.Selector.MatchLabels, s.Labels) {
			operator = s.Name
		}
	}
	if operator != job {
		t.Errorf("the ServiceMonitor scrapes ingest's Service %q (the job's name), PaystreamIngestDown selects job %q", operator, job)
	}
	t.Logf("ingest's job: %q in the rule, compose's Prometheus and the ServiceMonitor", job)
}
