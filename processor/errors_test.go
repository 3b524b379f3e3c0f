package processor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestClassify is the decision table: only an error caused by the record's
// own data quarantines it; anything else stalls the partition (the batch is
// retried) under a low-cardinality class.
func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("write effects: %w", &pgconn.PgError{Code: code}) }
	cases := []struct {
		name   string
		err    error
		poison bool
		class  string
	}{
		{"our own validation", poison("event %s: invalid fact", "e1"), true, classPoison},
		{"22P02 invalid text representation", pg("22P02"), true, classPoison},
		{"22021 invalid UTF-8 / NUL", pg("22021"), true, classPoison},
		{"22003 numeric out of range", pg("22003"), true, classPoison},
		{"23514 check violation (unbalanced postings)", pg("23514"), true, classPoison},
		{"23502 not null violation", pg("23502"), true, classPoison},
		{"23503 foreign key violation", pg("23503"), true, classPoison},
		{"54000 program limit (index row too large)", pg("54000"), true, classPoison},
		{"23505 unique violation: a racing writer", pg("23505"), false, classContention},
		{"40001 serialization failure", pg("40001"), false, classContention},
		{"40P01 deadlock", pg("40P01"), false, classContention},
		{"55P03 lock not available", pg("55P03"), false, classContention},
		{"57014 statement timeout", pg("57014"), false, classTimeout},
		{"context deadline", fmt.Errorf("lock partition offset: %w", context.DeadlineExceeded), false, classTimeout},
		{"42501 insufficient privilege", pg("42501"), false, classPermission},
		{"42P01 undefined table", pg("42P01"), false, classMissingObject},
		{"42703 undefined column", pg("42703"), false, classMissingObject},
		{"42883 undefined function", pg("42883"), false, classMissingObject},
		{"3F000 invalid schema", pg("3F000"), false, classMissingObject},
		{"42601 syntax error", pg("42601"), false, classMissingObject},
		{"08006 connection failure", pg("08006"), false, classConnection},
		{"57P01 admin shutdown", pg("57P01"), false, classConnection},
		{"25P03 idle in transaction timeout", pg("25P03"), false, classConnection},
		{"53100 disk full", pg("53100"), false, classResources},
		{"53300 too many connections", pg("53300"), false, classResources},
		{"55006 object in use", pg("55006"), false, classOther},
		{"58030 I/O error", pg("58030"), false, classOther},
		{"XX000 internal error", pg("XX000"), false, classOther},
		{"XX001 data corrupted", pg("XX001"), false, classOther},
		{"unknown SQLSTATE", pg("ZZ999"), false, classOther},
		{"malformed SQLSTATE", pg("2"), false, classOther},
		{"network error", fmt.Errorf("load deliveries: %w", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}), false, classConnection},
		{"unknown error", errors.New("something else"), false, classOther},
		{"unexpected EOF", io.ErrUnexpectedEOF, false, classOther},
	}
	for _, tc := range cases {
		f := classify(tc.err)
		if f.poison != tc.poison || f.class != tc.class {
			t.Errorf("%s: classify = {poison %v, class %s}, want {poison %v, class %s}", tc.name, f.poison, f.class, tc.poison, tc.class)
		}
		if got := isPoison(tc.err); got != tc.poison {
			t.Errorf("%s: isPoison = %v, want %v", tc.name, got, tc.poison)
		}
		if !f.poison && tc.class != classContention && tc.class != classOther && f.fix == "" {
			t.Errorf("%s: a stall of class %s names no fix", tc.name, f.class)
		}
	}
	for _, err := range []error{nil, context.Canceled, fmt.Errorf("commit: %w", ErrFenced)} {
		if isPoison(err) {
			t.Errorf("isPoison(%v) = true, want false", err)
		}
	}
}
