package loadgen

import (
	"bytes"
	"fmt"
	"os"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
)

// Source is what the load generator needs to know about one configured
// source to sign for it. Secrets are secret: never log them.
type Source struct {
	// Name is the URL segment.
	Name string
	// Driver is the driver name, one of Drivers.
	Driver string
	// Secrets are the resolved secrets; Builder signs with the first one
	// it can sign with.
	Secrets []string
	// Options are the driver options (the hmac driver's header, algorithm,
	// prefix, encoding and id_header).
	Options map[string]string
}

// LoadSources reads the sources file ingest reads, validating it the same
// way (every driver is built), and returns its sources in file order.
func LoadSources(path string) ([]Source, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read sources file: %w", err)
	}
	return ParseSources(raw)
}

// ParseSources is LoadSources for a sources file already in memory.
func ParseSources(raw []byte) ([]Source, error) {
	built, err := source.Parse(raw, drivers.Factories())
	if err != nil {
		return nil, err
	}
	// source.Source does not keep driver options (only the driver uses
	// them), and the hmac signer needs them: read them, and the file
	// order, from the YAML again.
	var f struct {
		Sources []struct {
			Name    string            `yaml:"name"`
			Options map[string]string `yaml:"options"`
		} `yaml:"sources"`
	}
	if err := yaml.NewDecoder(bytes.NewReader(raw)).Decode(&f); err != nil {
		return nil, fmt.Errorf("parse sources file: %w", err)
	}
	out := make([]Source, 0, len(f.Sources))
	for _, fs := range f.Sources {
		s, ok := built[fs.Name]
		if !ok {
			continue
		}
		out = append(out, Source{
			Name:    s.Name,
			Driver:  s.DriverName,
			Secrets: slices.Clone(s.Secrets),
			Options: fs.Options,
		})
	}
	return out, nil
}
