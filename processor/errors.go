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

// ErrOffsetRolledBack is returned when a partition's stored offset in
// Postgres is below what its worker committed: Postgres lost committed
// transactions (a failover to a replica that lagged, a restore from a
// backup). Applying on would skip the records between the two, so the
// processor stops instead (Run returns the error), and a restart resumes
// every partition from Postgres's offsets, which applies them again.
var ErrOffsetRolledBack = errors.New("stored offset went back: Postgres lost committed transactions")

// poisonError marks a failure that will recur on every retry of the same
// record: it is quarantined instead of retried.
type poisonError struct{ err error }

func (e *poisonError) Error() string { return e.err.Error() }
func (e *poisonError) Unwrap() error { return e.err }

// poison wraps err as deterministic, naming what failed.
func poison(format string, args ...any) error {
	return &poisonError{err: fmt.Errorf(format, args...)}
}

// Failure classes: the label of paystream_processor_batch_failures_total
// and what the log line of a stalled batch tells the operator to fix.
const (
	classPoison        = "poison"         // the record's own data; quarantined
	classContention    = "contention"     // lock timeout, deadlock, serialization, a dedup race, a partition attached meanwhile
	classConnection    = "connection"     // the connection to Postgres failed
	classTimeout       = "timeout"        // a statement or the batch took too long
	classPermission    = "permission"     // the role lacks a privilege
	classMissingObject = "missing_object" // a table, column or function is missing
	classResources     = "resources"      // Postgres is out of disk, memory or connections
	classOther         = "other"
)

// failure is what a failed batch means.
type failure struct {
	class string
	// poison: the record's own data caused it, so it is quarantined. Any
	// other failure stalls the partition: its batch is retried, with
	// backoff, until it commits.
	poison bool
	// code is the SQLSTATE, when Postgres raised the error.
	code string
	// fix tells the operator what to do about a stall, if anything.
	fix string
}

// classify is the one place that decides whether a failed record is
// quarantined or its batch retried. Only an error caused by the record's own
// data may quarantine it: our own poisonError, and the SQLSTATE classes 22
// (data exception), 23 (integrity violation, except 23505 unique_violation,
// which two writers racing produce, and a 23514 check_violation naming no
// constraint, which a delivery partition attached meanwhile produces) and
// 54 (program limit exceeded: a value too large). Everything else — a missing privilege or table, a lost
// connection, exhausted resources, an internal error, an unknown error —
// would quarantine every record alike, so it stalls the partition instead
// until someone fixes it.
func classify(err error) failure {
	var pe *poisonError
	if errors.As(err, &pe) {
		return failure{class: classPoison, poison: true}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == "23514" && pgErr.ConstraintName == "" {
			// check_violation naming no constraint: a row against a
			// partition's bounds, not a CHECK of ours. Deliveries are
			// routed by their recording time and the default partition
			// takes any day, so only a partition attached or detached
			// while the statement ran (retention creating tomorrow's)
			// raises it: the retry routes the row anew.
			return failure{class: classContention, code: pgErr.Code}
		}
		return classifySQLState(pgErr.Code)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return failure{class: classTimeout, fix: "the batch transaction exceeded its timeout; check Postgres load and locks"}
	case pgconn.SafeToRetry(err), pgconn.Timeout(err), isConnError(err):
		return failure{class: classConnection, fix: "check that Postgres is up and reachable"}
	}
	return failure{class: classOther}
}

func classifySQLState(code string) failure {
	f := failure{code: code}
	switch code {
	case "23505": // unique_violation: a concurrent writer got there first
		f.class = classContention
		return f
	case "40001", "40P01", "55P03": // serialization failure, deadlock, lock not available
		f.class = classContention
		return f
	case "57014": // query_canceled: statement_timeout or a cancel request
		f.class, f.fix = classTimeout, "a statement exceeded statement_timeout or was canceled; check Postgres load and locks"
		return f
	case "42501": // insufficient_privilege
		f.class, f.fix = classPermission, "grant the processor's database role SELECT, INSERT, UPDATE on paystream's tables and USAGE on their sequences"
		return f
	case "42P01", "42703", "42883", "42704", "3F000": // undefined table, column, function, object; invalid schema
		f.class, f.fix = classMissingObject, "run paystream migrate and check the connection's search_path"
		return f
	case "25P03", "57P01", "57P02", "57P03": // idle-in-transaction timeout, admin/crash shutdown, cannot connect now
		f.class, f.fix = classConnection, "check that Postgres is up and reachable"
		return f
	}
	if len(code) != 5 {
		f.class = classOther
		return f
	}
	switch code[:2] {
	case "22", "23", "54": // data exception, integrity violation, program limit exceeded
		f.class, f.poison = classPoison, true
	case "08":
		f.class, f.fix = classConnection, "check that Postgres is up and reachable"
	case "53":
		f.class, f.fix = classResources, "Postgres is out of disk, memory or connections"
	case "42":
		f.class, f.fix = classMissingObject, "a statement refers to something the schema lacks; run paystream migrate"
	default: // 55 object state, 57 operator intervention, 58 system error, XX internal, ...
		f.class = classOther
	}
	return f
}

// isConnError reports whether err is a failure of the connection itself
// (closed, reset, refused) rather than of a statement.
func isConnError(err error) bool {
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var netErr interface{ Timeout() bool }
	return errors.As(err, &netErr)
}

// isPoison reports whether err, from applying a record, quarantines it.
func isPoison(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrFenced) {
		return false
	}
	return classify(err).poison
}

// batchFailed counts and logs a batch that failed and will be retried. A
// stall that needs an operator (a missing privilege or table, exhausted
// resources, an unknown error) is logged as an error naming the SQLSTATE and
// what to fix; contention and connection trouble, which clear by
// themselves, as warnings.
func (p *Processor) batchFailed(partition int32, attempt, records int, err error) {
	f := classify(err)
	p.metrics.batchRetries.Inc()
	p.metrics.batchFailures.WithLabelValues(f.class).Inc()
	attrs := []any{"partition", partition, "attempt", attempt, "records", records, "class", f.class}
	if f.code != "" {
		attrs = append(attrs, "sqlstate", f.code)
	}
	if f.fix != "" {
		attrs = append(attrs, "fix", f.fix)
	}
	attrs = append(attrs, "error", err)
	switch f.class {
	case classPermission, classMissingObject, classResources, classOther:
		p.log.Error("partition stalled: batch failed, retrying until fixed", attrs...)
	default:
		p.log.Warn("batch failed, retrying", attrs...)
	}
}
