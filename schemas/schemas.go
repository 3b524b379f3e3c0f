// Package schemas embeds the JSON Schemas of paystream's topics and
// validates values against them.
//
// A published schema version changes only compatibly: new optional fields.
// A field is never removed, retyped or made required, and a new field is
// never required; compat/ keeps a frozen copy of each version and the
// package's tests fail on any other change (see docs/consumers.md).
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
	DLQRecord    = "dlq-record.v1.json"
)

// Published lists every schema file: each has a frozen copy in compat/
// that the compatibility test holds it to.
var Published = []string{RawEnvelope, PaymentState, DLQRecord}

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
	for _, name := range Published {
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
