package processor

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/payment"
)

// claim makes the caller the owner of a partition: it bumps the partition's
// owner_epoch and returns the epoch and the offset to resume from. fresh is
// true when paystream has never stored an offset for the partition.
func claim(ctx context.Context, db beginner, group, topic string, partition int32) (epoch, next int64, fresh bool, err error) {
	err = db.QueryRow(ctx, `
		INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, owner_epoch)
		VALUES ($1, $2, $3, 0, 1)
		ON CONFLICT (group_id, topic, partition)
		DO UPDATE SET owner_epoch = consumer_offsets.owner_epoch + 1, updated_at = now()
		RETURNING owner_epoch, next_offset, (xmax = 0)`, group, topic, partition).Scan(&epoch, &next, &fresh)
	if err != nil {
		return 0, 0, false, fmt.Errorf("claim partition %s/%d: %w", topic, partition, err)
	}
	return epoch, next, fresh, nil
}

// beginner is what a batch needs from a pool: a transaction and a query.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// batchOutcome summarizes a committed batch.
type batchOutcome struct {
	next    int64 // the partition's next offset after the commit
	applied int   // records at or past the stored offset
	slow    bool  // the batch was applied record by record (it held poison)
	results []result
}

// commitBatch applies recs (one partition's, in offset order) in a single
// transaction that also advances the partition's stored offset. It locks the
// offset row first and fails with ErrFenced if another owner has claimed the
// partition since epoch was taken. Records below the stored offset were
// applied by an earlier transaction and are skipped.
//
// The batch is first applied whole (applyBatch: a fixed number of round
// trips). If a record in it fails deterministically, the transaction is
// rolled back and run again record by record, each under a savepoint, so
// the poisonous record alone is quarantined and the rest apply. Any other
// failure aborts the transaction so the caller can retry it.
func commitBatch(ctx context.Context, db beginner, a *applier, group string, epoch int64, recs []*kgo.Record) (batchOutcome, error) {
	return commitRefetched(ctx, db, a, group, epoch, recs, nil)
}

// commitRefetched is commitBatch for a batch some of whose records were
// refetched from their gateway beforehand: refetched holds, by offset, the
// facts the gateway's API asserted, applied instead of the webhook's.
func commitRefetched(ctx context.Context, db beginner, a *applier, group string, epoch int64, recs []*kgo.Record, refetched map[int64][]payment.Fact) (batchOutcome, error) {
	out, err := runBatch(ctx, db, a, group, epoch, recs, refetched, false)
	if err != nil && isPoison(err) {
		out, err = runBatch(ctx, db, a, group, epoch, recs, refetched, true)
		out.slow = true
	}
	return out, err
}

func runBatch(ctx context.Context, db beginner, a *applier, group string, epoch int64, recs []*kgo.Record, refetched map[int64][]payment.Fact, slow bool) (batchOutcome, error) {
	var out batchOutcome
	if len(recs) == 0 {
		return out, nil
	}
	topic, partition := recs[0].Topic, recs[0].Partition
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var next, owner int64
		err := tx.QueryRow(ctx, `
			SELECT next_offset, owner_epoch FROM consumer_offsets
			 WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE`, group, topic, partition).Scan(&next, &owner)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: no offset row for %s/%d", ErrFenced, topic, partition)
		}
		if err != nil {
			return fmt.Errorf("lock partition offset: %w", err)
		}
		if owner != epoch {
			return fmt.Errorf("%w: %s/%d epoch %d, ours %d", ErrFenced, topic, partition, owner, epoch)
		}
		todo := recs
		for len(todo) > 0 && todo[0].Offset < next {
			todo = todo[1:]
		}
		out = batchOutcome{next: next, applied: len(todo)}
		if len(todo) == 0 {
			return nil
		}
		if slow {
			for _, rec := range todo {
				rs, err := applyOne(ctx, tx, a, rec, refetched)
				if err != nil {
					return err
				}
				out.results = append(out.results, rs...)
			}
		} else {
			rs, err := a.applyBatch(ctx, tx, todo, refetched)
			if err != nil {
				return err
			}
			out.results = rs
		}
		out.next = todo[len(todo)-1].Offset + 1
		if _, err := tx.Exec(ctx, `
			UPDATE consumer_offsets SET next_offset = $4, updated_at = now()
			 WHERE group_id = $1 AND topic = $2 AND partition = $3`, group, topic, partition, out.next); err != nil {
			return fmt.Errorf("store offset: %w", err)
		}
		return nil
	})
	if err != nil {
		return batchOutcome{}, err
	}
	return out, nil
}

// applyOne applies one record under a savepoint, quarantining it if it fails
// deterministically.
func applyOne(ctx context.Context, tx pgx.Tx, a *applier, rec *kgo.Record, refetched map[int64][]payment.Fact) ([]result, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	rs, err := a.applyBatch(ctx, sp, []*kgo.Record{rec}, refetched)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return nil, fmt.Errorf("release savepoint: %w", err)
		}
		return rs, nil
	}
	if !isPoison(err) {
		return nil, err
	}
	if rbErr := sp.Rollback(ctx); rbErr != nil {
		return nil, fmt.Errorf("rollback to savepoint: %w", rbErr)
	}
	r, qErr := quarantine(ctx, tx, rec, err)
	if qErr != nil {
		return nil, qErr
	}
	return []result{r}, nil
}
