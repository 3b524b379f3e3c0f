// Package deploy holds the operations artifact the paystream binary
// carries: the Prometheus alert rules of prometheus/alerts.yaml, which
// `paystream alerts` prints with runbook links under the operator's base
// URL. The rest of deploy/ (manifests, images, scripts) is checked by this
// package's tests.
package deploy

import (
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

//go:embed prometheus/alerts.yaml
var alertRules []byte

// RunbookBaseURL is the runbook the rules in prometheus/alerts.yaml link
// to: docs/operations.md on the project's main branch. Each alert's
// runbook_url is this, "#" and the alert's name in lower case (the
// anchor of its section).
const RunbookBaseURL = "https://github.com/paystream/paystream/blob/main/docs/operations.md"

// RunbookBaseURLAt is the runbook of a release: docs/operations.md at the
// tag.
func RunbookBaseURLAt(tag string) string {
	return "https://github.com/paystream/paystream/blob/" + tag + "/docs/operations.md"
}

// runbookURL matches a rule's runbook_url line: its indentation and key,
// and the anchor.
var runbookURL = regexp.MustCompile(`(?m)^([ \t]+runbook_url:[ \t]+)\S+#([a-z0-9-]+)[ \t]*$`)

// AlertRules returns prometheus/alerts.yaml with every runbook_url under
// base: base + "#" + the alert's name in lower case. base is an absolute
// http(s) URL of a copy of docs/operations.md (a wiki page, an internal
// docs site, the GitHub page at a tag), without a fragment.
func AlertRules(base string) ([]byte, error) {
	u, err := url.Parse(base)
	switch {
	case err != nil:
		return nil, fmt.Errorf("runbook base URL: %w", err)
	case u.Scheme != "https" && u.Scheme != "http" || u.Host == "":
		return nil, fmt.Errorf("runbook base URL %q: want an absolute http(s) URL", base)
	case u.Fragment != "" || strings.ContainsAny(base, "# \t\r\n\"'"):
		return nil, fmt.Errorf("runbook base URL %q: want no fragment, space or quote (the alert's anchor is appended)", base)
	}
	n := 0
	out := runbookURL.ReplaceAllFunc(alertRules, func(line []byte) []byte {
		n++
		m := runbookURL.FindSubmatch(line)
		return fmt.Appendf(nil, "%s%s#%s", m[1], base, m[2])
	})
	if n == 0 {
		return nil, errors.New("alerts.yaml: no runbook_url to set")
	}
	return out, nil
}
