package main

import (
	"fmt"
	"os"
	"regexp"

	"github.com/paystream/paystream/deploy"
)

type alertsCmd struct {
	RunbookBaseURL string `name:"runbook-base-url" help:"Address of your copy of docs/operations.md (a wiki page, an internal docs site): each alert's runbook_url is it, '#' and the alert's name in lower case. Default: the page on GitHub at this release's tag, or at main for other builds." env:"PAYSTREAM_RUNBOOK_BASE_URL" placeholder:"URL"`
}

func (alertsCmd) Help() string {
	return `Prints the Prometheus alert rules this paystream was built with (deploy/prometheus/alerts.yaml),
each with a runbook_url an operator can click, to load with rule_files: or wrap in a
PrometheusRule:

  paystream alerts --runbook-base-url https://wiki.example.com/paystream/operations > paystream-alerts.yaml`
}

// releaseTag matches a release's version: a tag, not `git describe`'s
// tag-N-gCOMMIT, a pseudo-version or a dirty build.
var releaseTag = regexp.MustCompile(`^v\d+\.\d+\.\d+(-(alpha|beta|rc)(\.\d+)?)?$`)

func (c alertsCmd) Run() error {
	b := buildInfo()
	base := c.RunbookBaseURL
	if base == "" {
		base = deploy.RunbookBaseURL
		if releaseTag.MatchString(b.Version) {
			base = deploy.RunbookBaseURLAt(b.Version)
		}
	}
	rules, err := deploy.AlertRules(base)
	if err != nil {
		return fmt.Errorf("--runbook-base-url: %w", err)
	}
	if _, err := fmt.Printf("# paystream %s alerts; runbooks at %s\n", b.Version, base); err != nil {
		return err
	}
	_, err = os.Stdout.Write(rules)
	return err
}
