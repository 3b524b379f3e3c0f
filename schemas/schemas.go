// Package schemas embeds the JSON Schemas of paystream's topics and
// validates values against them.
package schemas

import (
	"bytes"
	"embed"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

//go:embed *.json
var files embed.FS

// Schema file names.
const (
	RawEnvelope  = "raw-envelope.v1.json"
	PaymentState = "payment-state.v1.json"
)

var (
	compileOnce sync.Once
	compiled    map[string]*jsonschema.Schema
	compileErr  error
)

func compile() {
	c := jsonschema.NewCompiler()
	// Under draft 2020-12, "format" and "contentEncoding" are annotations
	// unless asserted: without these, an occurred_at of "yesterday" or a body
	// that is not base64 would validate.
	c.AssertFormat()
	c.AssertContent()
	compiled = map[string]*jsonschema.Schema{}
	for _, name := range []string{RawEnvelope, PaymentState} {
		b, err := files.ReadFile(name)
		if err != nil {
			compileErr = err
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			compileErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		if err := c.AddResource(name, doc); err != nil {
			compileErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		s, err := c.Compile(name)
		if err != nil {
			compileErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		compiled[name] = s
	}
}

// Validate checks a JSON value against the named schema, asserting its
// formats (date-time) and content encodings (base64) too.
func Validate(name string, value []byte) error {
	compileOnce.Do(compile)
	if compileErr != nil {
		return compileErr
	}
	s, ok := compiled[name]
	if !ok {
		return fmt.Errorf("unknown schema %q", name)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(value))
	if err != nil {
		return fmt.Errorf("decode value: %w", err)
	}
	return s.Validate(doc)
}
