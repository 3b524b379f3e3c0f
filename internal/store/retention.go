package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Partition is one daily partition of deliveries: rows recorded in
// [Day, Day+24h), UTC.
type Partition struct {
	Name string
	Day  time.Time
}

// partitionPrefix starts the name of every daily partition of deliveries;
// the day follows as YYYYMMDD (migration 004 names them the same way).
const partitionPrefix = "deliveries_p"

// PartitionOf returns the daily partition holding rows recorded at t.
func PartitionOf(t time.Time) Partition {
	day := t.UTC().Truncate(24 * time.Hour)
	return Partition{Name: partitionPrefix + day.Format("20060102"), Day: day}
}

// ListPartitions returns the daily partitions of deliveries, oldest first
// (the default partition is not one of them).
func ListPartitions(ctx context.Context, db DB) ([]Partition, error) {
	names, err := queryRows(ctx, db, pgx.RowTo[string], "list delivery partitions", `
		SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		 WHERE i.inhparent = 'deliveries'::regclass`)
	if err != nil {
		return nil, err
	}
	var out []Partition
	for _, n := range names {
		day, err := time.Parse("20060102", strings.TrimPrefix(n, partitionPrefix))
		if !strings.HasPrefix(n, partitionPrefix) || err != nil {
			continue
		}
		out = append(out, Partition{Name: n, Day: day})
	}
	slices.SortFunc(out, func(a, b Partition) int { return a.Day.Compare(b.Day) })
	return out, nil
}

// ddlLockTimeout bounds how long one partition DDL statement waits for a
// lock: while it waits, the processor's batches queue behind it, so the
// wait must stay short. A timed-out step fails with SQLSTATE 55P03
// (IsLockTimeout) and is retried.
const ddlLockTimeout = time.Second

// IsLockTimeout reports whether err is a lock wait that timed out
// (SQLSTATE 55P03) or a deadlock (40P01): the step changed nothing and
// can be tried again.
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}

// CreatePartition creates p and attaches it to deliveries, moving the rows
// of p's day that landed in the default partition (its day had no
// partition) into it. It returns how many moved.
//
// One transaction, which locks the default partition first (ATTACH needs
// that lock anyway, to check the default holds no row of p's day): no
// processor batch can then put a row of p's day into the default between
// the move and the attach, which would fail the attach with 23514 every
// run for as long as rows keep coming. The batches wait while the rows
// move: the longer the day went without its partition, the longer. The
// new table carries a CHECK of its range, so ATTACH does not scan it;
// the CHECK is dropped after.
func CreatePartition(ctx context.Context, db DB, p Partition) (moved int64, err error) {
	name := pgx.Identifier{p.Name}.Sanitize()
	from, to := p.Day, p.Day.Add(24*time.Hour)
	lo, hi := `'`+from.Format(time.RFC3339)+`'`, `'`+to.Format(time.RFC3339)+`'`
	err = pgx.BeginFunc(ctx, beginner{db}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, Millis(ddlLockTimeout)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE deliveries_default IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE `+name+` (LIKE deliveries INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
			CONSTRAINT retention_range CHECK (recorded_at >= `+lo+` AND recorded_at < `+hi+`))`); err != nil {
			return err
		}
		ct, err := tx.Exec(ctx, `
			WITH m AS (DELETE FROM deliveries_default WHERE recorded_at >= $1 AND recorded_at < $2 RETURNING *)
			INSERT INTO `+name+` SELECT * FROM m`, from, to)
		if err != nil {
			return err
		}
		moved = ct.RowsAffected()
		if _, err := tx.Exec(ctx, `ALTER TABLE deliveries ATTACH PARTITION `+name+` FOR VALUES FROM (`+lo+`) TO (`+hi+`)`); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `ALTER TABLE `+name+` DROP CONSTRAINT retention_range`)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("create partition %s: %w", p.Name, err)
	}
	return moved, nil
}

// DefaultDays returns the days (UTC) of the rows in the default partition
// recorded at or after since, oldest first: days that had no partition
// when their rows were stored.
func DefaultDays(ctx context.Context, db DB, since time.Time) ([]time.Time, error) {
	days, err := queryRows(ctx, db, pgx.RowTo[time.Time], "list days in the default partition", `
		SELECT DISTINCT date_trunc('day', recorded_at, 'UTC') AS day FROM deliveries_default
		 WHERE recorded_at >= $1 ORDER BY day`, since)
	if err != nil {
		return nil, err
	}
	for i, d := range days {
		days[i] = d.UTC()
	}
	return days, nil
}

// DropPartition drops p. Its deferred and quarantined deliveries, which
// wait for a predecessor, a refetch or an operator, are moved into the
// default partition first, in the same transaction: a waiting delivery is
// never dropped. It returns how many rows were dropped and moved.
//
// DETACH holds ACCESS EXCLUSIVE on deliveries until the transaction ends
// (DETACH CONCURRENTLY is refused while a default partition exists), and
// every processor batch waits for it. So nothing under that lock reads
// the whole partition: the rows are counted before it (a dropped day
// gets no new rows), and the waiting ones are found through the
// deliveries_waiting partial index. The lock is held for the time the
// waiting rows take to move, whatever the day's size.
func DropPartition(ctx context.Context, db DB, p Partition) (dropped, kept int64, err error) {
	name := pgx.Identifier{p.Name}.Sanitize()
	var total int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM `+name).Scan(&total); err != nil {
		return 0, 0, fmt.Errorf("drop partition %s: count rows: %w", p.Name, err)
	}
	err = pgx.BeginFunc(ctx, beginner{db}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, Millis(ddlLockTimeout)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE deliveries DETACH PARTITION `+name); err != nil {
			return err
		}
		// The partial index holds only waiting rows; a sequential scan
		// would read the whole day under the lock.
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			return err
		}
		ct, err := tx.Exec(ctx, `INSERT INTO deliveries SELECT * FROM `+name+` WHERE status IN ('deferred', 'quarantined')`)
		if err != nil {
			return err
		}
		kept = ct.RowsAffected()
		_, err = tx.Exec(ctx, `DROP TABLE `+name)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("drop partition %s: %w", p.Name, err)
	}
	return max(total-kept, 0), kept, nil
}

// PartitionRows counts p's rows, and those waiting (deferred, quarantined).
func PartitionRows(ctx context.Context, db DB, p Partition) (rows, waiting int64, err error) {
	err = db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status IN ('deferred', 'quarantined')) FROM `+
		pgx.Identifier{p.Name}.Sanitize()).Scan(&rows, &waiting)
	if err != nil {
		return 0, 0, fmt.Errorf("count rows of %s: %w", p.Name, err)
	}
	return rows, waiting, nil
}

// DeleteExpiredDefault deletes up to limit decided deliveries recorded
// before cutoff from the default partition (rows whose day had no
// partition, and waiting rows moved out of dropped partitions once they
// were decided).
func DeleteExpiredDefault(ctx context.Context, db DB, cutoff time.Time, limit int) (int64, error) {
	ct, err := db.Exec(ctx, `
		DELETE FROM deliveries_default WHERE ctid = ANY(ARRAY(
			SELECT ctid FROM deliveries_default
			 WHERE recorded_at < $1 AND status NOT IN ('deferred', 'quarantined') LIMIT $2))`, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("delete expired deliveries of the default partition: %w", err)
	}
	return ct.RowsAffected(), nil
}

// WaitingDeliveryIDs returns the ids of every deferred and quarantined
// delivery: their dedup keys are kept whatever their age.
func WaitingDeliveryIDs(ctx context.Context, db DB) ([]int64, error) {
	return queryRows(ctx, db, pgx.RowTo[int64], "list waiting deliveries", `SELECT id FROM deliveries WHERE status IN ('deferred', 'quarantined')`)
}

// DeleteExpiredDedupKeys deletes up to limit dedup keys recorded before
// cutoff, except those of the deliveries keep, and returns how many it
// deleted. Call it until it returns less than limit: small batches keep
// each transaction short.
func DeleteExpiredDedupKeys(ctx context.Context, db DB, cutoff time.Time, keep []int64, limit int) (int64, error) {
	ct, err := db.Exec(ctx, `
		DELETE FROM dedup_keys WHERE ctid = ANY(ARRAY(
			SELECT ctid FROM dedup_keys WHERE recorded_at < $1 AND delivery_id <> ALL($2) LIMIT $3))`, cutoff, keep, limit)
	if err != nil {
		return 0, fmt.Errorf("delete expired dedup keys: %w", err)
	}
	return ct.RowsAffected(), nil
}

// CountExpiredDedupKeys counts the dedup keys DeleteExpiredDedupKeys would
// delete, for a dry run.
func CountExpiredDedupKeys(ctx context.Context, db DB, cutoff time.Time, keep []int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT count(*) FROM dedup_keys WHERE recorded_at < $1 AND delivery_id <> ALL($2)`, cutoff, keep).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count expired dedup keys: %w", err)
	}
	return n, nil
}

// retentionLockKey is the advisory lock one retention run holds ("psrt"
// in ASCII), with the schema's hash as its second key: one session per
// schema does it at a time.
const retentionLockKey = 0x70737274

// ErrRetentionBusy is returned by TryRetentionLock when another session
// runs retention.
var ErrRetentionBusy = errors.New("retention is running elsewhere")

// TryRetentionLock takes the retention advisory lock on conn's session, or
// fails with ErrRetentionBusy. The returned function releases it.
func TryRetentionLock(ctx context.Context, conn DB) (func(), error) {
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::int, hashtext(current_schema()))`, retentionLockKey).Scan(&ok); err != nil {
		return nil, fmt.Errorf("take retention lock: %w", err)
	}
	if !ok {
		return nil, ErrRetentionBusy
	}
	return func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1::int, hashtext(current_schema()))`, retentionLockKey)
	}, nil
}

// beginner adapts a DB that can begin transactions (a pool, a connection,
// a transaction: a savepoint) for pgx.BeginFunc.
type beginner struct{ DB }

func (b beginner) Begin(ctx context.Context) (pgx.Tx, error) {
	tb, ok := b.DB.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return nil, errors.New("store: DB cannot begin a transaction")
	}
	return tb.Begin(ctx)
}
