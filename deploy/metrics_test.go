package deploy_test

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	promql "github.com/prometheus/prometheus/promql/parser"

	"github.com/paystream/paystream/deploy"
)

const (
	alertsFile    = "prometheus/alerts.yaml"
	dashboardFile = "grafana/paystream.json"
	runbookFile   = "../docs/operations.md"
)

// targetLabels are the labels Prometheus itself attaches to every scraped
// series; the binary does not export them.
var targetLabels = []string{"instance", "job"}

// builtinSeries are series Prometheus writes itself.
var builtinSeries = []string{"up"}

// use is one vector selector in a rule or panel: the series it names and
// the labels it matches or groups by.
type use struct {
	where  string
	metric string
	labels []string
}

// query is one PromQL expression of the rules or the dashboard.
type query struct {
	where, expr string
}

// ruleQueries parses the alert rules with Prometheus's own rule parser and
// returns them with their expressions.
func ruleQueries(t *testing.T) (*rulefmt.RuleGroups, []query) {
	t.Helper()
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, promql.NewParser(promql.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("rulefmt: %v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	var qs []query
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{where: alertsFile + ": " + cmpOr(r.Alert, r.Record), expr: r.Expr})
		}
	}
	return groups, qs
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// grafanaVars are the dashboard's template variables, replaced by values
// PromQL accepts before parsing.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "${source}", ".*", "$source", ".*")

// dashboardQueries returns every target expression of the dashboard, and
// of its template variables' label_values() queries.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []query
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
		}
		for _, tg := range p.Targets {
			qs = append(qs, query{where: fmt.Sprintf("%s: panel %q", dashboardFile, p.Title), expr: grafanaVars.Replace(tg.Expr)})
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)
	for _, v := range dash.Templating.List {
		q, ok := v.Query.(map[string]any)
		if !ok {
			continue
		}
		s, _ := q["query"].(string)
		if m := labelValues.FindStringSubmatch(s); m != nil {
			qs = append(qs, query{where: fmt.Sprintf("%s: variable %s", dashboardFile, v.Name), expr: fmt.Sprintf("count by (%s) (%s)", m[2], m[1])})
		}
	}
	return qs
}

// uses parses each query with the PromQL parser and returns every series
// it selects, with the labels it matches on and those an enclosing
// aggregation groups by.
func uses(t *testing.T, qs []query) []use {
	t.Helper()
	p := promql.NewParser(promql.Options{})
	var out []use
	for _, q := range qs {
		expr, err := p.ParseExpr(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		promql.Inspect(expr, func(node promql.Node, path []promql.Node) error {
			vs, ok := node.(*promql.VectorSelector)
			if !ok {
				return nil
			}
			u := use{where: q.where, metric: vs.Name}
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					if u.metric == "" && m.Type == labels.MatchEqual {
						u.metric = m.Value
					}
					continue
				}
				u.labels = append(u.labels, m.Name)
			}
			for _, parent := range path {
				if agg, ok := parent.(*promql.AggregateExpr); ok && !agg.Without {
					u.labels = append(u.labels, agg.Grouping...)
				}
			}
			if u.metric == "" {
				t.Errorf("%s: a selector without a metric name: %s", q.where, vs)
				return nil
			}
			out = append(out, u)
			return nil
		})
	}
	return out
}

// family is a metric as the Go code declares it.
type family struct {
	name   string
	help   string
	kind   string // counter, gauge, histogram, summary
	labels []string
	vec    bool
	pos    string
}

// series returns the series names a family is exposed under, with their
// labels.
func (f family) series() map[string][]string {
	switch f.kind {
	case "histogram":
		return map[string][]string{f.name + "_bucket": append(slices.Clone(f.labels), "le"), f.name + "_sum": f.labels, f.name + "_count": f.labels}
	case "summary":
		return map[string][]string{f.name: append(slices.Clone(f.labels), "quantile"), f.name + "_sum": f.labels, f.name + "_count": f.labels}
	}
	return map[string][]string{f.name: f.labels}
}

// constructor is a function that declares a metric: its type, and for the
// helpers of internal/metric, which argument is the first label.
type constructor struct {
	kind       string
	vec        bool
	firstLabel int
}

// constructors are prometheus' New* functions, whose first argument is the
// options literal and second (vectors) the label list.
var constructors = map[string]constructor{
	"NewCounter": {kind: "counter"}, "NewCounterVec": {kind: "counter", vec: true},
	"NewGauge": {kind: "gauge"}, "NewGaugeVec": {kind: "gauge", vec: true}, "NewGaugeFunc": {kind: "gauge"},
	"NewHistogram": {kind: "histogram"}, "NewHistogramVec": {kind: "histogram", vec: true},
	"NewSummary": {kind: "summary"}, "NewSummaryVec": {kind: "summary", vec: true},
}

// metricPkg is the package most paystream metrics are declared with.
const metricPkg = "github.com/paystream/paystream/internal/metric"

// helpers are metricPkg's constructors: metric.Counter(r, name, help),
// metric.CounterVec(r, name, help, labels...), metric.Histogram(r, name,
// help, buckets), metric.HistogramVec(r, name, help, buckets, labels...), ...
var helpers = map[string]constructor{
	"Counter": {kind: "counter"}, "CounterVec": {kind: "counter", vec: true, firstLabel: 3},
	"Gauge": {kind: "gauge"}, "GaugeVec": {kind: "gauge", vec: true, firstLabel: 3}, "GaugeFunc": {kind: "gauge"},
	"Histogram": {kind: "histogram"}, "HistogramVec": {kind: "histogram", vec: true, firstLabel: 4},
}

// declaredFamilies reads the module's Go code (tests excluded) and returns
// every paystream_* metric it declares with prometheus.New* or the helpers
// of internal/metric: name, help, type and label names. A declaration the
// parser cannot read literally fails the test, so a new metric cannot slip
// past the checks.
func declaredFamilies(t *testing.T) map[string]family {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]family{}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != repoRoot && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		// internal/metric itself calls prometheus.New* with its
		// parameters; its callers' literals are read instead.
		inMetricPkg := filepath.Dir(path) == filepath.Join(repoRoot, "internal", "metric")
		helperPkg := importName(file, metricPkg)
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			pos := fset.Position(call.Pos()).String()
			var f family
			switch {
			case pkg.Name == "prometheus" && !inMetricPkg:
				ctor, ok := constructors[sel.Sel.Name]
				if !ok || len(call.Args) == 0 {
					return true
				}
				f = prometheusFamily(t, pos, ctor, call)
			case helperPkg != "" && pkg.Name == helperPkg:
				ctor, ok := helpers[sel.Sel.Name]
				if !ok {
					return true
				}
				f = helperFamily(pos, ctor, call)
			default:
				return true
			}
			if f.name == "" || f.help == "" || slices.Contains(f.labels, "") {
				t.Errorf("%s: %s.%s whose name, help or labels are not string literals: teach declaredFamilies to read it", pos, pkg.Name, sel.Sel.Name)
				return true
			}
			if prev, ok := out[f.name]; ok && prev.kind != f.kind {
				t.Errorf("%s and %s declare %s as %s and %s", prev.pos, pos, f.name, prev.kind, f.kind)
			}
			out[f.name] = f
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no metric declared in the Go code: declaredFamilies is broken")
	}
	return out
}

// importName returns the name file refers to the package at path by, or
// "" if it does not import it.
func importName(file *ast.File, path string) string {
	for _, imp := range file.Imports {
		if p, err := strconv.Unquote(imp.Path.Value); err != nil || p != path {
			continue
		}
		if imp.Name != nil {
			return imp.Name.Name
		}
		return path[strings.LastIndex(path, "/")+1:]
	}
	return ""
}

// prometheusFamily reads a prometheus.New* call: the name and help of its
// options literal, and a vector's label list. Options that are not a
// literal leave the name "", which the caller reports.
func prometheusFamily(t *testing.T, pos string, ctor constructor, call *ast.CallExpr) family {
	t.Helper()
	f := family{kind: ctor.kind, vec: ctor.vec, pos: pos}
	opts, ok := call.Args[0].(*ast.CompositeLit)
	if !ok {
		return f
	}
	for _, el := range opts.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		switch key := kv.Key.(*ast.Ident); {
		case key == nil:
		case key.Name == "Name":
			f.name = stringLit(kv.Value)
		case key.Name == "Help":
			f.help = stringLit(kv.Value)
		case key.Name == "Namespace" || key.Name == "Subsystem":
			t.Errorf("%s: metric declared with %s: teach declaredFamilies to join it", pos, key.Name)
		}
	}
	if ctor.vec && len(call.Args) > 1 {
		if lbls, ok := call.Args[1].(*ast.CompositeLit); ok {
			for _, el := range lbls.Elts {
				f.labels = append(f.labels, stringLit(el))
			}
		}
	}
	return f
}

// helperFamily reads a call of an internal/metric helper: name and help
// are its second and third arguments, and a vector's labels the arguments
// from firstLabel on. A label list passed as labels... is not read: it
// leaves a label "", which the caller reports.
func helperFamily(pos string, ctor constructor, call *ast.CallExpr) family {
	f := family{kind: ctor.kind, vec: ctor.vec, pos: pos}
	if len(call.Args) < 3 {
		return f
	}
	f.name, f.help = stringLit(call.Args[1]), stringLit(call.Args[2])
	if ctor.vec {
		if call.Ellipsis.IsValid() {
			f.labels = append(f.labels, "")
		}
		for _, el := range call.Args[min(ctor.firstLabel, len(call.Args)):] {
			f.labels = append(f.labels, stringLit(el))
		}
	}
	return f
}

func stringLit(e ast.Expr) string {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return ""
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		return ""
	}
	return s
}

// declaredSeries maps every series name the declared families expose to
// its family and labels.
func declaredSeries(fams map[string]family) map[string]struct {
	family family
	labels []string
} {
	out := map[string]struct {
		family family
		labels []string
	}{}
	for _, f := range fams {
		for name, lbls := range f.series() {
			out[name] = struct {
				family family
				labels []string
			}{f, lbls}
		}
	}
	return out
}

// githubAnchors returns the anchors GitHub gives the Markdown file's headings.
func githubAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	out := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		heading, ok := strings.CutPrefix(strings.TrimSpace(line), "#")
		if !ok {
			continue
		}
		heading = strings.TrimSpace(strings.TrimLeft(heading, "#"))
		slug := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(heading), ""), " ", "-")
		out[slug] = true
	}
	return out
}

// TestAlertRulesAndDashboard parses the alert rules with Prometheus's own
// rule parser (rulefmt: YAML schema, PromQL, templates) and every dashboard
// query with its PromQL parser, and checks that each names only series the
// Go code declares (paystream_* metrics, histograms as _bucket/_sum/_count)
// with labels those metrics have; that each alert has a severity, a summary
// and a runbook link (absolute, under deploy.RunbookBaseURL) to a section
// of docs/operations.md that exists. The running binary is checked too, in
// TestManifestsRunOnTheBinary.
func TestAlertRulesAndDashboard(t *testing.T) {
	t.Parallel()
	groups, rules := ruleQueries(t)
	anchors := githubAnchors(t, runbookFile)
	alerts := alertRules(groups)
	for _, r := range alerts {
		if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
			t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, s)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: no summary or description", r.Alert)
		}
		want := deploy.RunbookBaseURL + "#" + strings.ToLower(r.Alert)
		if got := r.Annotations["runbook_url"]; got != want {
			t.Errorf("%s: runbook_url %q, want %q (a link an operator can click)", r.Alert, got, want)
		}
		if !anchors[strings.ToLower(r.Alert)] {
			t.Errorf("%s: docs/operations.md has no section %q", r.Alert, r.Alert)
		}
	}
	panels := dashboardQueries(t)
	t.Logf("%d alerts, %d dashboard queries", len(alerts), len(panels))

	declared := declaredSeries(declaredFamilies(t))
	used := uses(t, append(rules, panels...))
	for _, u := range used {
		if slices.Contains(builtinSeries, u.metric) {
			continue
		}
		d, ok := declared[u.metric]
		if !ok {
			t.Errorf("%s: %s is not a metric paystream declares", u.where, u.metric)
			continue
		}
		for _, l := range u.labels {
			if !slices.Contains(d.labels, l) && !slices.Contains(targetLabels, l) {
				t.Errorf("%s: %s has no label %q (its labels: %v)", u.where, u.metric, l, d.labels)
			}
		}
	}
	// The metrics the operations issue names are all alerted on.
	for _, m := range []string{
		"paystream_processor_held_payments", "paystream_processor_quarantined_events", "paystream_processor_lag_records",
		"paystream_sink_slot_lag_bytes", "paystream_sink_slot_lag_seconds", "paystream_ingest_signature_failures_total",
		"paystream_processor_events_total", "paystream_ingest_requests_total", "paystream_processor_batch_failures_total",
		"paystream_processor_offset_copy_failures_total", "paystream_sink_active",
	} {
		if !slices.ContainsFunc(used, func(u use) bool { return u.metric == m && strings.HasPrefix(u.where, alertsFile) }) {
			t.Errorf("no alert rule uses %s", m)
		}
	}
}
