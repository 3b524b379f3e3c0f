package schemas_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/paystream/paystream/schemas"
)

// TestSchemasCompatibleWithFrozen: every published schema still accepts
// what its consumers were promised when it was published (compat/ keeps a
// frozen copy of each). Allowed: new optional fields and new descriptions.
// Anything else fails here: a field removed, retyped or given another
// constraint, a new required field, a field no longer required, a new enum
// value (a consumer's switch over status would not know it). Such a change
// needs a new version of the topic and schema (…v2), never an edit of v1.
func TestSchemasCompatibleWithFrozen(t *testing.T) {
	t.Parallel()
	for _, name := range schemas.Published {
		frozenName := strings.TrimSuffix(name, ".json") + ".frozen.json"
		frozen, current := readSchema(t, filepath.Join("compat", frozenName)), readSchema(t, name)
		if breaks := breakingChanges(frozen, current); len(breaks) > 0 {
			t.Errorf("%s breaks its consumers (compared with compat/%s):\n  %s", name, frozenName, strings.Join(breaks, "\n  "))
		}
	}
}

// TestCompatibilityCheckCatchesBreaks: the comparison used above flags each
// kind of breaking change, made to the real payment-state schema, and lets
// the compatible ones through.
func TestCompatibilityCheckCatchesBreaks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		change   string
		edit     func(s map[string]any)
		breaking string // a substring of the reported break; "" for a compatible change
	}{
		{"new optional field", func(s map[string]any) { props(s)["tenant"] = map[string]any{"type": "string"} }, ""},
		{"new nested optional field", func(s map[string]any) {
			props(obj(props(s), "payment"))["captured_at"] = map[string]any{"type": "string"}
		}, ""},
		{"description reworded", func(s map[string]any) { obj(props(s), "kind")["description"] = "what moved" }, ""},
		{"field removed", func(s map[string]any) { delete(props(s), "amount_minor") }, "amount_minor: removed"},
		{"optional field removed", func(s map[string]any) { delete(props(s), "refund_id") }, "refund_id: removed"},
		{"field retyped", func(s map[string]any) { obj(props(s), "version")["type"] = "string" }, "version: type changed"},
		{"nested field retyped", func(s map[string]any) { obj(props(obj(props(s), "payment")), "amount_minor")["type"] = "number" }, "payment.amount_minor: type changed"},
		{"format changed", func(s map[string]any) { obj(props(s), "occurred_at")["format"] = "date" }, "occurred_at: format changed"},
		{"new required field", func(s map[string]any) {
			props(s)["tenant"] = map[string]any{"type": "string"}
			s["required"] = append(s["required"].([]any), "tenant")
		}, "tenant: new required field"},
		{"optional field made required", func(s map[string]any) { s["required"] = append(s["required"].([]any), "refund_id") }, "refund_id: new required field"},
		{"required field made optional", func(s map[string]any) {
			s["required"] = slices.DeleteFunc(s["required"].([]any), func(v any) bool { return v == "currency" })
		}, "currency: no longer required"},
		{"new status", func(s map[string]any) {
			st := obj(s["$defs"].(map[string]any), "status")
			st["enum"] = append(st["enum"].([]any), "settled")
		}, `status: enum value "settled" added`},
		{"new constraint", func(s map[string]any) { obj(props(s), "currency")["minLength"] = 3 }, "currency: minLength added"},
	}
	base := readSchema(t, schemas.PaymentState)
	for _, tc := range cases {
		current := readSchema(t, schemas.PaymentState)
		tc.edit(current)
		breaks := strings.Join(breakingChanges(base, current), "\n")
		switch {
		case tc.breaking == "" && breaks != "":
			t.Errorf("%s: reported as breaking, want compatible:\n%s", tc.change, breaks)
		case tc.breaking != "" && !strings.Contains(breaks, tc.breaking):
			t.Errorf("%s: reported %q, want a break containing %q", tc.change, breaks, tc.breaking)
		}
	}
}

func readSchema(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return doc
}

func props(s map[string]any) map[string]any { return s["properties"].(map[string]any) }

func obj(m map[string]any, key string) map[string]any { return m[key].(map[string]any) }

// annotations change nothing a consumer relies on.
var annotations = map[string]bool{"description": true, "title": true, "$comment": true, "examples": true, "$id": true, "$schema": true, "$defs": true}

// breakingChanges compares a schema with its frozen copy, structurally,
// and describes each change that would break a consumer of the frozen one.
func breakingChanges(frozen, current map[string]any) []string {
	c := comparer{frozenRoot: frozen, currentRoot: current}
	c.compare("", frozen, current)
	sort.Strings(c.breaks)
	return c.breaks
}

type comparer struct {
	frozenRoot, currentRoot map[string]any
	breaks                  []string
}

func (c *comparer) report(path, format string, args ...any) {
	if path == "" {
		path = "(root)"
	}
	c.breaks = append(c.breaks, path+": "+fmt.Sprintf(format, args...))
}

// resolve follows local "$ref": "#/$defs/name" references.
func resolve(root, s map[string]any) map[string]any {
	for range 10 {
		ref, ok := s["$ref"].(string)
		if !ok || !strings.HasPrefix(ref, "#/$defs/") {
			return s
		}
		def, ok := root["$defs"].(map[string]any)[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
		if !ok {
			return s
		}
		s = def
	}
	return s
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func (c *comparer) compare(path string, fAny, cAny any) {
	f, fok := fAny.(map[string]any)
	cur, cok := cAny.(map[string]any)
	if !fok || !cok {
		if !reflect.DeepEqual(fAny, cAny) {
			c.report(path, "schema changed from %v to %v", fAny, cAny)
		}
		return
	}
	f, cur = resolve(c.frozenRoot, f), resolve(c.currentRoot, cur)
	for key, fv := range f {
		if annotations[key] || key == "$ref" {
			continue
		}
		cv, ok := cur[key]
		switch key {
		case "properties":
			cprops, _ := cv.(map[string]any)
			for name, fp := range fv.(map[string]any) {
				cp, ok := cprops[name]
				if !ok {
					c.report(join(path, name), "removed")
					continue
				}
				c.compare(join(path, name), fp, cp)
			}
		case "required":
			var creq []any
			if ok {
				creq = cv.([]any)
			}
			for _, name := range fv.([]any) {
				if !slices.Contains(creq, name) {
					c.report(join(path, name.(string)), "no longer required")
				}
			}
		case "enum":
			cenum, _ := cv.([]any)
			for _, v := range cenum {
				if !slices.Contains(fv.([]any), v) {
					c.report(path, "enum value %q added", v)
				}
			}
		case "items", "additionalProperties":
			c.compare(path+"[]", fv, cv)
		case "anyOf", "oneOf", "allOf":
			fl, cl := fv.([]any), asSlice(cv)
			if len(fl) != len(cl) {
				c.report(path, "%s changed from %d to %d alternatives", key, len(fl), len(cl))
				continue
			}
			for i := range fl {
				c.compare(fmt.Sprintf("%s(%s %d)", path, key, i), fl[i], cl[i])
			}
		default:
			if !ok {
				c.report(path, "%s removed (was %v)", key, fv)
			} else if !reflect.DeepEqual(fv, cv) {
				c.report(path, "%s changed from %v to %v", key, fv, cv)
			}
		}
	}
	for key, cv := range cur {
		if annotations[key] || key == "$ref" || key == "properties" {
			continue
		}
		if _, ok := f[key]; ok {
			continue
		}
		switch key {
		case "required":
			for _, name := range cv.([]any) {
				c.report(join(path, name.(string)), "new required field")
			}
		default:
			c.report(path, "%s added", key)
		}
	}
	if freq, ok := f["required"]; ok {
		if creq, ok := cur["required"]; ok {
			for _, name := range creq.([]any) {
				if !slices.Contains(freq.([]any), name) {
					c.report(join(path, name.(string)), "new required field")
				}
			}
		}
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
