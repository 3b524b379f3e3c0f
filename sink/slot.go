package sink

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrWALLevel is what CheckWALLevel and Relay.Run return when the
// server cannot do logical decoding; its message says what to set.
var ErrWALLevel = errors.New("wal_level must be logical for the sink's replication slot " +
	"(set wal_level = logical, and max_replication_slots and max_wal_senders to at least 1 per sink plus what replicas use, " +
	"in postgresql.conf or with ALTER SYSTEM, then restart Postgres)")

// SQLSTATEs the slot code tells apart.
const (
	sqlstateObjectInUse           = "55006" // replication slot is active for another process
	sqlstateUndefinedObject       = "42704" // replication slot does not exist
	sqlstateDuplicateObject       = "42710" // slot or publication created concurrently
	sqlstateInsufficientPrivilege = "42501" // no REPLICATION attribute
)

// maxIdentifier is Postgres's limit on a name (NAMEDATALEN-1).
const maxIdentifier = 63

// querier is what the slot setup needs from a pool or connection.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SlotName returns the logical replication slot, and publication, of the
// relay of schema: "paystream_" and the schema, lowercased, anything but
// letters, digits and '_' replaced by '_'. A name longer than Postgres's
// 63 bytes is cut and ends with a hash of the whole, so two long schemas
// do not share a slot.
func SlotName(schema string) string {
	var b strings.Builder
	b.WriteString("paystream_")
	for _, r := range strings.ToLower(schema) {
		if r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	name := b.String()
	if len(name) <= maxIdentifier {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(schema))
	return fmt.Sprintf("%s_%08x", name[:maxIdentifier-9], h.Sum32())
}

// CheckWALLevel returns ErrWALLevel when the server's wal_level is not
// logical or it allows no replication slot or WAL sender. migrate calls it
// so that an installation learns it before the processor writes a message
// no slot keeps.
func CheckWALLevel(ctx context.Context, q querier) error {
	var level string
	var slots, senders int
	err := q.QueryRow(ctx, `SELECT current_setting('wal_level'),
		current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int`).Scan(&level, &slots, &senders)
	if err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if level != "logical" || slots < 1 || senders < 1 {
		return fmt.Errorf("%w; it has wal_level = %s, max_replication_slots = %d, max_wal_senders = %d",
			ErrWALLevel, level, slots, senders)
	}
	return nil
}

// SetupSlot checks the wal_level and creates, when missing, the
// publication and logical replication slot of the relay of the
// connection's current schema (see SlotName), and returns the slot's name.
// The slot keeps every state message committed after it exists, so the
// processor's messages are safe from the first one once migrate has called
// this; Relay.Run calls it too. It needs the REPLICATION attribute (or
// superuser) and CREATE on the database.
func SetupSlot(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	if err := CheckWALLevel(ctx, pool); err != nil {
		return "", err
	}
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return "", fmt.Errorf("read current schema: %w", err)
	}
	slot := SlotName(schema)
	return slot, createSlot(ctx, pool, slot)
}

// createSlot creates the publication and the slot named slot unless they
// exist. The publication is empty: the relay reads only logical decoding
// messages, which pgoutput sends whatever the publication holds.
func createSlot(ctx context.Context, q querier, slot string) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, slot).Scan(&exists); err != nil {
		return fmt.Errorf("look up publication %s: %w", slot, err)
	}
	if !exists {
		_, err := q.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{slot}.Sanitize())
		if err != nil && !isSQLState(err, sqlstateDuplicateObject) {
			return fmt.Errorf("create publication %s: %w", slot, err)
		}
	}
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&exists); err != nil {
		return fmt.Errorf("look up replication slot %s: %w", slot, err)
	}
	if !exists {
		_, err := q.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
		switch {
		case isSQLState(err, sqlstateInsufficientPrivilege):
			return fmt.Errorf("create replication slot %s (grant the role REPLICATION: ALTER ROLE name REPLICATION): %w", slot, err)
		case err != nil && !isSQLState(err, sqlstateDuplicateObject):
			return fmt.Errorf("create replication slot %s: %w", slot, err)
		}
	}
	return nil
}

// replicationConfig is the pool's connection config for a walsender
// connection (replication=database) to the same database.
func replicationConfig(pool *pgxpool.Pool) *pgconn.Config {
	cfg := pool.Config().ConnConfig.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	return cfg
}

func isSQLState(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
