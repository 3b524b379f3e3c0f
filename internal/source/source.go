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
//	    refetch: false             # optional: read payments back from the gateway API (mercadopago: always)
//	    api_base_url: ""           # optional: the gateway API (mercadopago defaults to its public API)
//	    api_token: "env:ACME_API"  # required when refetching; literal, env:NAME or file:PATH
//	    refetch_rate: 10           # optional: API requests per second (default 10)
//	    refetch_burst: 10          # optional: requests at once above the rate (default ceil(rate))
//	    refetch_timeout: 5s        # optional: per API request (default 5s)
package source

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
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
	// Refetch is how to read this source's payments back from the
	// gateway's API; nil when refetching is off. See RefetchConfig.
	Refetch *RefetchConfig `json:"refetch,omitempty"`
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

	// Refetch keys; see RefetchConfig.
	Refetch        *bool    `yaml:"refetch"`
	APIBaseURL     string   `yaml:"api_base_url"`
	APIToken       string   `yaml:"api_token"`
	RefetchRate    *float64 `yaml:"refetch_rate"`
	RefetchBurst   *int     `yaml:"refetch_burst"`
	RefetchTimeout string   `yaml:"refetch_timeout"`
}

// decodeFile decodes the sources file node by node rather than with
// yaml's struct decoding, whose errors name neither the source nor the field
// ("line 7: cannot unmarshal !!str `hunter2` into []string") and quote the
// offending value — a secret, when secrets is written as a string instead
// of a list. Its errors name the source and field and quote no value.
func decodeFile(raw []byte) ([]fileSource, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("parse sources file: %w", err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("sources file (line %d): want a mapping with a sources list", top.Line)
	}
	var list *yaml.Node
	for k := 0; k+1 < len(top.Content); k += 2 {
		key, val := top.Content[k], top.Content[k+1]
		if key.Value != "sources" {
			return nil, fmt.Errorf("sources file: unknown field %q (line %d; known: sources)", key.Value, key.Line)
		}
		if list != nil {
			return nil, fmt.Errorf("sources file: sources given twice (line %d)", key.Line)
		}
		list = val
	}
	if list == nil {
		return nil, nil
	}
	if list = resolve(list); list.Tag == "!!null" {
		return nil, nil
	}
	if list.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("sources file: sources (line %d): want a list", list.Line)
	}
	out := make([]fileSource, len(list.Content))
	for i, n := range list.Content {
		if err := decodeSource(n, i, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sourceFields maps fileSource's yaml keys to its field indexes.
var sourceFields = func() map[string]int {
	m := map[string]int{}
	t := reflect.TypeFor[fileSource]()
	for i := range t.NumField() {
		if key, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); key != "" && key != "-" {
			m[key] = i
		}
	}
	return m
}()

// resolve follows an alias (*name) to the node it refers to.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// pairs returns a mapping's key/value pairs with merge keys (<<: *base)
// expanded: merged pairs first, so that the mapping's own keys override them.
func pairs(n *yaml.Node) [][2]*yaml.Node {
	var merged, own [][2]*yaml.Node
	for k := 0; k+1 < len(n.Content); k += 2 {
		key, val := n.Content[k], resolve(n.Content[k+1])
		if key.Value != "<<" || key.Tag != "!!merge" {
			own = append(own, [2]*yaml.Node{key, val})
			continue
		}
		bases := []*yaml.Node{val}
		if val.Kind == yaml.SequenceNode {
			bases = val.Content
		}
		for _, b := range bases {
			if b = resolve(b); b.Kind == yaml.MappingNode {
				merged = append(merged, pairs(b)...)
			}
		}
	}
	return append(merged, own...)
}

// decodeSource decodes the i-th entry of the sources list into fs.
func decodeSource(n *yaml.Node, i int, fs *fileSource) error {
	where := fmt.Sprintf("sources[%d]", i)
	if n = resolve(n); n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s (line %d): want a mapping with name, driver and secrets", where, n.Line)
	}
	kv := pairs(n)
	for _, p := range kv {
		if key, val := p[0], p[1]; key.Value == "name" && val.Kind == yaml.ScalarNode && val.Value != "" {
			where = fmt.Sprintf("source %q", val.Value)
		}
	}
	own := map[string]int{} // key → line; merged keys may be overridden, own ones not repeated
	for k := 0; k+1 < len(n.Content); k += 2 {
		key := n.Content[k]
		if key.Tag == "!!merge" {
			continue
		}
		if line, dup := own[key.Value]; dup {
			return fmt.Errorf("%s: %s given twice (lines %d and %d)", where, key.Value, line, key.Line)
		}
		own[key.Value] = key.Line
	}
	v := reflect.ValueOf(fs).Elem()
	for _, p := range kv {
		key, val := p[0], p[1]
		idx, ok := sourceFields[key.Value]
		if !ok {
			return fmt.Errorf("%s: unknown field %q (line %d; known: %s)",
				where, key.Value, key.Line, strings.Join(slices.Sorted(maps.Keys(sourceFields)), ", "))
		}
		field := v.Field(idx)
		field.SetZero() // a key overriding a merged one replaces it, maps included
		if key.Value == "secrets" {
			// Checked before decoding so that no decoder message can quote one.
			if val.Kind != yaml.SequenceNode {
				return fmt.Errorf("%s: secrets (line %d): want a list, such as [\"whsec_...\"] or [\"env:NAME\"]", where, val.Line)
			}
			for j, item := range val.Content {
				if resolve(item).Kind != yaml.ScalarNode {
					return fmt.Errorf("%s: secrets[%d] (line %d): want a string", where, j, item.Line)
				}
			}
		}
		if err := val.Decode(field.Addr().Interface()); err != nil {
			return fmt.Errorf("%s: %s (line %d): want %s", where, key.Value, val.Line, describe(field.Type()))
		}
	}
	return nil
}

// describe names what a field of type t takes, for error messages.
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return describe(t.Elem())
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(describe(t.Elem()), "a ") + "s"
	case reflect.Map:
		return "a mapping"
	default:
		return t.String()
	}
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
	list, err := decodeFile(raw)
	if err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, errors.New("sources file lists no sources")
	}
	out := make(map[string]*Source, len(list))
	for i, fs := range list {
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
		if fs.Driver == "" {
			return nil, fmt.Errorf("%s: driver is required (known: %s)", where, strings.Join(slices.Sorted(maps.Keys(factories)), ", "))
		}
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
			Refetch:   fs.Refetch != nil && *fs.Refetch,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: driver %s: %w", where, fs.Driver, err)
		}
		refetch, err := buildRefetch(where, fs, driver)
		if err != nil {
			return nil, err
		}
		out[fs.Name] = &Source{
			Name:         fs.Name,
			DriverName:   fs.Driver,
			Account:      fs.Account,
			MaxBodyBytes: limit,
			Driver:       driver,
			Secrets:      secrets,
			Refetch:      refetch,
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
