package deploy_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/paystream/paystream/internal/testenv"
)

// TestRunbookQueries runs every ```sql block of docs/operations.md on a
// freshly migrated schema, each in a read-only transaction, so the
// runbook's queries name tables and columns that exist and change nothing.
func TestRunbookQueries(t *testing.T) {
	testenv.SkipIfShort(t)
	t.Parallel()
	b, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	if len(blocks) == 0 {
		t.Fatal("the runbook has no sql block")
	}
	db := testenv.NewDB(t)
	for _, blk := range blocks {
		query := blk[1]
		err := pgx.BeginTxFunc(t.Context(), db.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			rows, err := tx.Query(t.Context(), query)
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		})
		if err != nil {
			t.Errorf("runbook query fails: %v\n%s", err, query)
		}
	}
	t.Logf("%d runbook queries ran", len(blocks))
}
