package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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

// ErrSlotLost is what SetupSlot returns, and what keeps Relay.Run from
// relaying, when the relay's replication slot is gone but its publication
// says the slot was created (see slotMarker): the slot was lost in a
// Postgres failover (a standby has no logical slots before Postgres 17) or
// a restore, or invalidated past max_slot_wal_keep_size. State events
// committed after the relay's last checkpoint may then never have reached
// the state topic, so nothing creates a new slot silently: `paystream
// republish` (Republish) publishes them again from payment_transitions and
// creates the slot.
var ErrSlotLost = errors.New("the relay's replication slot is lost (Postgres failover or restore, or invalidated past max_slot_wal_keep_size): " +
	"state events committed after the relay's last checkpoint may be missing from the state topic; " +
	"run `paystream republish` to publish them again and recreate the slot (docs/operations.md, \"Postgres failover\")")

// ErrRepublishUnfinished is returned instead of ErrSlotLost when a
// `paystream republish` started and did not finish.
var ErrRepublishUnfinished = errors.New("a `paystream republish` of this database started and did not finish: run it again")

// SlotCollisionError says the slot a relay would use belongs to someone
// else: a relay refuses to start rather than share it.
type SlotCollisionError struct {
	Slot string
	// Owner says who holds the slot; Relay, whose relay would share it.
	Owner, Relay string
}

func (e *SlotCollisionError) Error() string {
	return fmt.Sprintf("replication slot %s belongs to %s, and this relay's (%s) would share it: "+
		"two deployments must not share a slot; drop or rename what holds it", e.Slot, e.Owner, e.Relay)
}

// The comments on a slot's publication. The publication lives in the
// database's catalog, so a physical standby and a restore have it while
// they have no logical slot: slotMarker, set once the slot exists, is how a
// relay tells a lost slot from one never created. republishMarker is set
// while a republish runs (see Republish). A publication without comment
// is from a relay before the markers, or from a setup that stopped between
// the publication and the slot: its slot is created (again).
const (
	slotMarker      = "paystream: replication slot created"
	republishMarker = "paystream: republish in progress"
)

// slotState is what resolveSlot found of a relay's slot.
type slotState int

const (
	slotNew          slotState = iota // neither slot nor publication: create both
	slotReady                         // the slot is there, in this database
	slotLost                          // the publication is there, the slot is not (or is invalidated)
	slotRepublishing                  // a republish started and did not finish
)

// slotInfo is what the catalogs say of one slot name in this database.
type slotInfo struct {
	exists    bool
	database  string // the slot's; empty for a physical slot
	kind      string // slot_type and plugin, "logical pgoutput" for ours
	walStatus string
	pub       bool   // the publication of that name exists in this database
	comment   string // the publication's comment
}

func lookUpSlot(ctx context.Context, q querier, name string) (slotInfo, error) {
	var s slotInfo
	err := q.QueryRow(ctx, `
		SELECT coalesce(database, ''), slot_type || ' ' || coalesce(plugin, ''), coalesce(wal_status, '')
		  FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&s.database, &s.kind, &s.walStatus)
	switch {
	case err == nil:
		s.exists = true
	case !errors.Is(err, pgx.ErrNoRows):
		return s, fmt.Errorf("look up replication slot %s: %w", name, err)
	}
	err = q.QueryRow(ctx, `SELECT coalesce(obj_description(oid, 'pg_publication'), '') FROM pg_publication WHERE pubname = $1`, name).Scan(&s.comment)
	switch {
	case err == nil:
		s.pub = true
	case !errors.Is(err, pgx.ErrNoRows):
		return s, fmt.Errorf("look up publication %s: %w", name, err)
	}
	return s, nil
}

// state classifies s, the slot named name, for the relay of schema in
// database.
func (s slotInfo) state(name, database, schema string) (slotState, error) {
	relay := fmt.Sprintf("database %q schema %q", database, schema)
	switch {
	case s.exists && s.database != database && s.database != "":
		return 0, &SlotCollisionError{Slot: name, Owner: fmt.Sprintf("database %q", s.database), Relay: relay}
	case s.exists && s.kind != "logical pgoutput":
		return 0, &SlotCollisionError{Slot: name, Owner: "a " + s.kind + " slot, not paystream's", Relay: relay}
	case s.comment == republishMarker:
		return slotRepublishing, nil
	case s.exists && s.walStatus == "lost", !s.exists && s.comment == slotMarker:
		return slotLost, nil
	case s.exists:
		return slotReady, nil
	}
	return slotNew, nil
}

// resolveSlot finds the slot of the relay of schema in database: named by
// SlotName, or by legacySlotName when this database holds a slot of that
// older name (or its publication, the slot lost), so that an installation
// keeps its slot across the upgrade. name, when set (Config.Slot), is used
// as it is.
func resolveSlot(ctx context.Context, q querier, log *slog.Logger, name, database, schema string) (string, slotState, error) {
	if name != "" {
		s, err := lookUpSlot(ctx, q, name)
		if err != nil {
			return "", 0, err
		}
		st, err := s.state(name, database, schema)
		return name, st, err
	}
	name = SlotName(database, schema)
	s, err := lookUpSlot(ctx, q, name)
	if err != nil {
		return "", 0, err
	}
	if st, err := s.state(name, database, schema); err != nil || st != slotNew {
		return name, st, err
	}
	legacy := legacySlotName(schema)
	l, err := lookUpSlot(ctx, q, legacy)
	if err != nil {
		return "", 0, err
	}
	switch {
	case l.exists && l.database == database, !l.exists && l.pub && l.comment != "":
		st, err := l.state(legacy, database, schema)
		return legacy, st, err
	case l.exists && l.pub:
		// The bug of the schema-named slot: another database took it, and
		// this one's state events were never relayed.
		log.Warn("this database has the publication of an earlier relay whose slot belongs to another database: "+
			"its state events were never relayed; see docs/operations.md, \"Two deployments on one cluster\"",
			"publication", legacy, "slot_database", l.database, "database", database, "schema", schema)
	}
	return name, slotNew, nil
}

// SetupSlot checks the wal_level and creates, when missing, the logical
// replication slot and publication of the relay of the connection's
// current database and schema (see SlotName), and returns the slot's name.
// The slot keeps every state message committed after it exists, so the
// processor's messages are safe from the first one once migrate has called
// this; Relay.Run calls it too. A lost slot is not created again: it
// returns an error wrapping ErrSlotLost (or ErrRepublishUnfinished), and
// a *SlotCollisionError when the slot's name belongs to another database.
// It needs the REPLICATION attribute (or superuser) and CREATE on the
// database.
func SetupSlot(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	if err := CheckWALLevel(ctx, pool); err != nil {
		return "", err
	}
	var database, schema string
	if err := pool.QueryRow(ctx, `SELECT current_database(), current_schema()`).Scan(&database, &schema); err != nil {
		return "", fmt.Errorf("read current database and schema: %w", err)
	}
	return setupSlot(ctx, pool, slog.Default(), "", database, schema)
}

// setupSlot resolves the slot (see resolveSlot) and creates what is
// missing of a new or ready one.
func setupSlot(ctx context.Context, q querier, log *slog.Logger, name, database, schema string) (string, error) {
	slot, state, err := resolveSlot(ctx, q, log, name, database, schema)
	if err != nil {
		return "", err
	}
	switch state {
	case slotLost:
		return slot, fmt.Errorf("slot %s of database %q schema %q: %w", slot, database, schema, ErrSlotLost)
	case slotRepublishing:
		return slot, fmt.Errorf("slot %s of database %q schema %q: %w", slot, database, schema, ErrRepublishUnfinished)
	}
	return slot, createSlot(ctx, q, slot)
}

// createSlot creates the publication and the slot named slot, unless they
// exist, and marks the publication (slotMarker). The publication is empty:
// the relay reads only logical decoding messages, which pgoutput sends
// whatever the publication holds. It comes first: pgoutput looks the
// publication up in the catalog as of the WAL it decodes, so a slot
// created before its publication fails on its first transaction.
func createSlot(ctx context.Context, q querier, slot string) error {
	if err := createPublication(ctx, q, slot); err != nil {
		return err
	}
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&exists); err != nil {
		return fmt.Errorf("look up replication slot %s: %w", slot, err)
	}
	if !exists {
		failover, err := failoverSlots(ctx, q)
		if err != nil {
			return err
		}
		create := `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`
		if failover {
			// Postgres 17: standbys with sync_replication_slots keep a copy.
			create = `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`
		}
		_, err = q.Exec(ctx, create, slot)
		switch {
		case isSQLState(err, sqlstateInsufficientPrivilege):
			return fmt.Errorf("create replication slot %s (grant the role REPLICATION: ALTER ROLE name REPLICATION): %w", slot, err)
		case err != nil && !isSQLState(err, sqlstateDuplicateObject):
			return fmt.Errorf("create replication slot %s: %w", slot, err)
		}
	}
	return markPublication(ctx, q, slot, slotMarker)
}

// markPublication sets the comment of the publication named slot.
func markPublication(ctx context.Context, q querier, slot, marker string) error {
	_, err := q.Exec(ctx, "COMMENT ON PUBLICATION "+pgx.Identifier{slot}.Sanitize()+" IS "+quoteLiteral(marker))
	if err != nil {
		return fmt.Errorf("mark publication %s: %w", slot, err)
	}
	return nil
}

// failoverSlots reports whether the server can keep a logical slot on its
// standbys (failover slots, Postgres 17 and later).
func failoverSlots(ctx context.Context, q querier) (bool, error) {
	var version int
	if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return false, fmt.Errorf("read server version: %w", err)
	}
	return version >= 170000, nil
}

// createPublication creates the (empty) publication named slot unless it
// exists.
func createPublication(ctx context.Context, q querier, slot string) error {
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

// Slot returns the name of the replication slot, and publication, of the
// relay of pool's current database and schema, as the relay resolves it
// (see SlotName), whether it exists or not.
func Slot(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var database, schema string
	if err := pool.QueryRow(ctx, `SELECT current_database(), current_schema()`).Scan(&database, &schema); err != nil {
		return "", fmt.Errorf("read current database and schema: %w", err)
	}
	slot, _, err := resolveSlot(ctx, pool, slog.New(slog.DiscardHandler), "", database, schema)
	return slot, err
}

// keepOnStandbys makes the slot a failover slot on Postgres 17 and later
// (one created by an earlier relay is not), over conn, the replication
// connection about to stream it, and says when the server does not hold
// decoding back for its standbys (synchronized_standby_slots): a promoted
// standby then has the slot, but may lack commits the relay published.
func (r *Relay) keepOnStandbys(ctx context.Context, conn *pgconn.PgConn) error {
	failover, err := failoverSlots(ctx, r.pool)
	if err != nil || !failover {
		return err
	}
	var isFailover bool
	var standbys string
	err = r.pool.QueryRow(ctx, `SELECT failover, current_setting('synchronized_standby_slots')
		  FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&isFailover, &standbys)
	if err != nil {
		return fmt.Errorf("look up slot %s: %w", r.cfg.Slot, err)
	}
	if !isFailover {
		err := conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+r.cfg.Slot+" (FAILOVER true)").Close()
		if isSQLState(err, sqlstateObjectInUse) {
			return errSlotBusy
		}
		if err != nil {
			return fmt.Errorf("make slot %s a failover slot: %w", r.cfg.Slot, err)
		}
		r.log.Info("slot is now a failover slot: standbys with sync_replication_slots keep it", "slot", r.cfg.Slot)
	}
	if standbys == "" {
		r.log.Info("synchronized_standby_slots is empty: a promoted standby keeps the slot but may lack commits already published "+
			"(repeats for consumers); name the standbys' physical slots there (docs/operations.md, \"Postgres failover\")", "slot", r.cfg.Slot)
	}
	return nil
}
