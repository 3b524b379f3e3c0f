package provider

import (
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
)

// A plan says how DecodeJSON's scanner stores a JSON value into a Go type
// while it checks the body, exactly as encoding/json would. Only the types
// webhook payloads are made of have one: structs of plain named fields,
// strings, bools, json.Number, json.Unmarshaler types (Amount,
// json.RawMessage) and pointers to these. Any other type has no plan and is
// decoded by encoding/json after the check.
type plan struct {
	kind   planKind
	fields []fieldPlan // planStruct
	elem   *plan       // planPointer
}

type planKind int

const (
	planString      planKind = iota // a string kind: JSON strings
	planNumber                      // json.Number: JSON numbers, as text
	planBool                        // a bool kind: true and false
	planUnmarshaler                 // *T implements json.Unmarshaler: any value, raw
	planStruct                      // JSON objects, by exact field name
	planPointer                     // null sets nil; anything else goes to elem
)

// fieldPlan is one struct field a JSON key can name.
type fieldPlan struct {
	name  string
	index int
	plan  *plan
}

var (
	numberType          = reflect.TypeFor[json.Number]()
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// plans caches planFor: reflect.Type → *plan (nil: no plan).
var plans sync.Map

// planFor returns t's plan, or nil when encoding/json must decode t.
func planFor(t reflect.Type) *plan {
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	p := buildPlan(t, map[reflect.Type]*plan{})
	plans.Store(t, p)
	return p
}

// buildPlan builds t's plan; building holds the plans under construction,
// for types that refer to themselves.
func buildPlan(t reflect.Type, building map[reflect.Type]*plan) *plan {
	if p, ok := building[t]; ok {
		return p
	}
	if t.Kind() == reflect.Pointer {
		// encoding/json looks for methods on a named pointer type's
		// address: leave those to it.
		if t.Name() != "" {
			return nil
		}
		p := &plan{kind: planPointer}
		building[t] = p
		if p.elem = buildPlan(t.Elem(), building); p.elem == nil {
			return nil
		}
		return p
	}
	pt := reflect.PointerTo(t)
	if pt.Implements(unmarshalerType) {
		return &plan{kind: planUnmarshaler}
	}
	if pt.Implements(textUnmarshalerType) {
		return nil
	}
	switch {
	case t == numberType:
		return &plan{kind: planNumber}
	case t.Kind() == reflect.String:
		return &plan{kind: planString}
	case t.Kind() == reflect.Bool:
		return &plan{kind: planBool}
	case t.Kind() != reflect.Struct:
		return nil
	}
	p := &plan{kind: planStruct}
	building[t] = p
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			return nil // embedded fields follow rules of their own
		}
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		for o := range strings.SplitSeq(opts, ",") {
			if o == "string" {
				return nil
			}
		}
		if name == "" {
			name = f.Name
		}
		if !plainName(name) {
			return nil
		}
		for _, other := range p.fields {
			if strings.EqualFold(other.name, name) {
				return nil // encoding/json picks one by rules of its own
			}
		}
		fp := buildPlan(f.Type, building)
		if fp == nil {
			return nil
		}
		p.fields = append(p.fields, fieldPlan{name: name, index: i, plan: fp})
	}
	return p
}

// plainName reports whether a field name is ASCII letters, digits, '_',
// '-' and '.': a valid tag for encoding/json, and one that only an ASCII
// key can match without regard to case.
func plainName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// field returns the field a key (a raw JSON string, quotes included) names
// exactly. maybe reports a key encoding/json could still match to a field
// without regard to case, which the plan does not handle.
func (p *plan) field(raw []byte) (f *fieldPlan, maybe bool) {
	key := raw[1 : len(raw)-1]
	for i := range p.fields {
		if p.fields[i].name == string(key) {
			return &p.fields[i], false
		}
	}
	for _, c := range key {
		if c >= 0x80 || c == '\\' {
			return nil, true // an escape or a Unicode letter may fold to a field's name
		}
	}
	for i := range p.fields {
		if strings.EqualFold(p.fields[i].name, string(key)) {
			return nil, true
		}
	}
	return nil, false
}
