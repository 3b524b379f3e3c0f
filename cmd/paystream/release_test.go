package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLicense: LICENSE is the Apache License 2.0, whole, and the README
// says so and links it.
func TestLicense(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(b)), " ")
	for _, want := range []string{
		"Apache License Version 2.0, January 2004 http://www.apache.org/licenses/",
		"TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
		"1. Definitions.", "2. Grant of Copyright License.", "3. Grant of Patent License.",
		"4. Redistribution.", "5. Submission of Contributions.", "6. Trademarks.",
		"7. Disclaimer of Warranty.", "8. Limitation of Liability.",
		"9. Accepting Warranty or Additional Liability.", "END OF TERMS AND CONDITIONS",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("LICENSE lacks %q: not the Apache License 2.0 text", want)
		}
	}
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^## License\n\n.*\[Apache License 2\.0\]\(LICENSE\)`).Match(readme) {
		t.Error("README.md has no License section naming the Apache License 2.0 and linking LICENSE")
	}
}

// TestChangelog: CHANGELOG.md follows Keep a Changelog: an Unreleased
// section first, then released versions newest first with their dates,
// each made of the six kinds of change with at least one entry, and a link
// for every version.
func TestChangelog(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if !strings.HasPrefix(text, "# Changelog\n") || !strings.Contains(text, "https://keepachangelog.com/") || !strings.Contains(text, "https://semver.org/") {
		t.Error("CHANGELOG.md: want \"# Changelog\" first, naming Keep a Changelog and Semantic Versioning")
	}
	version := regexp.MustCompile(`^## \[(Unreleased|\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?)\](?: - (\d{4}-\d{2}-\d{2}))?$`)
	kinds := []string{"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
	var versions []string
	var kind string
	last := time.Now()          // the date of the version above
	entries := map[string]int{} // "version/kind": entries
	for i, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			m := version.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("CHANGELOG.md:%d: %q is not \"## [Unreleased]\" or \"## [x.y.z] - YYYY-MM-DD\"", i+1, line)
				continue
			}
			if m[1] != "Unreleased" {
				date, err := time.Parse(time.DateOnly, m[2])
				if err != nil {
					t.Errorf("CHANGELOG.md:%d: version %s without a valid date", i+1, m[1])
				} else if date.After(last) {
					t.Errorf("CHANGELOG.md:%d: version %s (%s) after an older one: newest first", i+1, m[1], m[2])
				}
				last = date
			} else if m[2] != "" || len(versions) > 0 {
				t.Errorf("CHANGELOG.md:%d: Unreleased must come first, without a date", i+1)
			}
			if slices.Contains(versions, m[1]) {
				t.Errorf("CHANGELOG.md:%d: %s twice", i+1, m[1])
			}
			versions, kind = append(versions, m[1]), ""
		case strings.HasPrefix(line, "### "):
			kind = strings.TrimPrefix(line, "### ")
			if !slices.Contains(kinds, kind) || len(versions) == 0 {
				t.Errorf("CHANGELOG.md:%d: %q: want one of %v under a version", i+1, line, kinds)
			}
			if key := versions[len(versions)-1] + "/" + kind; entries[key] == 0 {
				entries[key] = 0 // a kind listed without entries is reported below
			}
		case strings.HasPrefix(line, "- "):
			if kind == "" {
				t.Errorf("CHANGELOG.md:%d: an entry outside a kind of change", i+1)
				continue
			}
			entries[versions[len(versions)-1]+"/"+kind]++
		}
	}
	if len(versions) == 0 || versions[0] != "Unreleased" {
		t.Fatalf("CHANGELOG.md: versions %v, want [Unreleased] first", versions)
	}
	for k, n := range entries {
		if n == 0 {
			t.Errorf("CHANGELOG.md: %s has no entry", k)
		}
	}
	for _, v := range versions {
		if !regexp.MustCompile(`(?m)^\[` + regexp.QuoteMeta(v) + `\]: https://\S+$`).MatchString(text) {
			t.Errorf("CHANGELOG.md: no link for [%s]", v)
		}
	}
	t.Logf("CHANGELOG.md: versions %v; entries %v", versions, entries)
}
