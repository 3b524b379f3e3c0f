package processor

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrFenced is returned when a worker's commit finds that another worker has
// claimed its partition since (a higher owner_epoch): the zombie's
// transaction is rolled back and it stops.
var ErrFenced = errors.New("partition claimed by a newer owner")

// poisonError marks a failure that will recur on every retry of the same
// record: it is quarantined instead of retried.
type poisonError struct{ err error }

func (e *poisonError) Error() string { return e.err.Error() }
func (e *poisonError) Unwrap() error { return e.err }

// poison wraps err as deterministic, naming what failed.
func poison(format string, args ...any) error {
	return &poisonError{err: fmt.Errorf(format, args...)}
}

// isPoison is the one place that decides whether a failed record is
// quarantined (deterministic failure) or its whole batch retried (transient).
// Our own validation errors are poison; Postgres errors are poison unless
// their SQLSTATE says the same statement could succeed later; anything else
// (network, timeouts, closed connections) is transient.
func isPoison(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrFenced) {
		return false
	}
	var pe *poisonError
	if errors.As(err, &pe) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return !transientSQLState(pgErr.Code)
	}
	return false
}

// transientSQLState reports whether a SQLSTATE names a condition that may
// clear on retry: connection exceptions, serialization failures, deadlocks,
// lock timeouts, resource exhaustion and operator intervention.
func transientSQLState(code string) bool {
	switch code {
	case "40001", "40P01", "55P03", "57014":
		return true
	}
	if len(code) < 2 {
		return true
	}
	switch code[:2] {
	case "08", // connection exception
		"53", // insufficient resources
		"57", // operator intervention (admin shutdown, crash shutdown)
		"58", // system error (I/O)
		"XX": // internal error
		return true
	}
	return false
}
