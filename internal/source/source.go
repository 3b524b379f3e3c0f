// Package source loads paystream's sources file: which gateways may post
// webhooks, under which URL segment, verified by which driver and secrets.
//
//	sources:
//	  - name: acme                 # URL segment: POST /webhooks/acme
//	    driver: standardwebhooks
//	    secrets: ["whsec_..."]     # several allowed (rotation); env:NAME and file:PATH too
//	    account: ""                # optional: scopes payment and dedup keys
//	    tolerance: 5m              # optional: clock skew for timestamped schemes
//	    max_body_bytes: 1048576    # optional: defaults to 1 MiB
//	    options: {}                # optional: driver-specific settings
package source

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/paystream/paystream/internal/provider"
)

// DefaultMaxBodyBytes is the body limit of a source that sets none.
const DefaultMaxBodyBytes = 1 << 20

// Source is one configured webhook sender, with its driver built.
type Source struct {
	Name         string
	DriverName   string
	Account      string
	MaxBodyBytes int64
	Driver       provider.Driver
	// Secrets are the resolved secrets, kept for tools that sign requests
	// (paystream dev's example, the load generator). Never log them.
	Secrets []string `json:"-"`
}

// PaymentKey scopes a gateway payment id to this source (and account).
func (s *Source) PaymentKey(paymentID string) string {
	return provider.PaymentKey(s.Name, s.Account, paymentID)
}

type fileSource struct {
	Name         string            `yaml:"name"`
	Driver       string            `yaml:"driver"`
	Secrets      []string          `yaml:"secrets"`
	Account      string            `yaml:"account"`
	Tolerance    string            `yaml:"tolerance"`
	MaxBodyBytes int64             `yaml:"max_body_bytes"`
	Options      map[string]string `yaml:"options"`
}

type file struct {
	Sources []fileSource `yaml:"sources"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Load reads and validates the sources file at path, building each source's
// driver with the factory its driver name selects. Errors name the source and
// field at fault; secrets never appear in them.
func Load(path string, factories map[string]provider.Factory) (map[string]*Source, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read sources file: %w", err)
	}
	return Parse(raw, factories)
}

// Parse is Load for a sources file already in memory.
func Parse(raw []byte, factories map[string]provider.Factory) (map[string]*Source, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse sources file: %w", err)
	}
	if len(f.Sources) == 0 {
		return nil, errors.New("sources file lists no sources")
	}
	out := make(map[string]*Source, len(f.Sources))
	for i, fs := range f.Sources {
		where := fmt.Sprintf("sources[%d]", i)
		if fs.Name != "" {
			where = fmt.Sprintf("source %q", fs.Name)
		}
		if !nameRE.MatchString(fs.Name) {
			return nil, fmt.Errorf("%s: name must match %s", where, nameRE)
		}
		if _, dup := out[fs.Name]; dup {
			return nil, fmt.Errorf("%s: name used twice", where)
		}
		factory, ok := factories[fs.Driver]
		if !ok {
			return nil, fmt.Errorf("%s: unknown driver %q (known: %s)", where, fs.Driver, strings.Join(slices.Sorted(maps.Keys(factories)), ", "))
		}
		secrets := make([]string, 0, len(fs.Secrets))
		for j, ref := range fs.Secrets {
			s, err := resolveSecret(ref)
			if err != nil {
				return nil, fmt.Errorf("%s: secrets[%d]: %w", where, j, err)
			}
			secrets = append(secrets, s)
		}
		var tolerance time.Duration
		if fs.Tolerance != "" {
			d, err := time.ParseDuration(fs.Tolerance)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("%s: tolerance %q: want a positive duration such as 5m", where, fs.Tolerance)
			}
			tolerance = d
		}
		if fs.MaxBodyBytes < 0 {
			return nil, fmt.Errorf("%s: max_body_bytes must be positive", where)
		}
		limit := fs.MaxBodyBytes
		if limit == 0 {
			limit = DefaultMaxBodyBytes
		}
		driver, err := factory(provider.Config{
			Secrets:   secrets,
			Tolerance: tolerance,
			Account:   fs.Account,
			Options:   fs.Options,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: driver %s: %w", where, fs.Driver, err)
		}
		out[fs.Name] = &Source{
			Name:         fs.Name,
			DriverName:   fs.Driver,
			Account:      fs.Account,
			MaxBodyBytes: limit,
			Driver:       driver,
			Secrets:      secrets,
		}
	}
	return out, nil
}

// resolveSecret turns a secrets entry into the secret: "env:NAME" reads an
// environment variable, "file:PATH" a file (trailing newline trimmed),
// anything else is the secret itself.
func resolveSecret(ref string) (string, error) {
	switch {
	case strings.HasPrefix(ref, "env:"):
		name := strings.TrimPrefix(ref, "env:")
		v, ok := os.LookupEnv(name)
		if !ok || v == "" {
			return "", fmt.Errorf("environment variable %s is unset or empty", name)
		}
		return v, nil
	case strings.HasPrefix(ref, "file:"):
		path := strings.TrimPrefix(ref, "file:")
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("read secret file: %w", err)
		}
		v := strings.TrimRight(string(b), "\r\n")
		if v == "" {
			return "", fmt.Errorf("secret file %s is empty", path)
		}
		return v, nil
	case ref == "":
		return "", errors.New("empty secret")
	}
	return ref, nil
}
