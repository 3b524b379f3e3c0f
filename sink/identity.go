package sink

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Identity is what a relay relays: the state events of one schema of one
// database of one Postgres system, for one deployment. Everything that must
// be unique per deployment derives from it, never from the schema alone:
//
//   - the replication slot and its publication (SlotName), unique on a
//     Postgres cluster, from the database and the schema;
//   - the Kafka transactional id and the checkpoint key (Key), unique on a
//     Kafka cluster, from all four.
//
// A primary and its physical standbys share the system identifier, so a
// failover keeps the identity; a new cluster (initdb, pg_upgrade, a restored
// dump) gets a new one.
type Identity struct {
	// Deployment is the operator's name for the deployment (--deployment).
	// Optional: it tells apart two environments whose databases share a
	// system identifier (one cloned from the other's backup) and a Kafka
	// cluster.
	Deployment string
	// SystemID is the Postgres system identifier (IDENTIFY_SYSTEM).
	SystemID string
	// Database and Schema are the relayed schema's database and name.
	Database string
	Schema   string
}

// Key is the identity as one string, "deployment/system/database/schema"
// (without "deployment/" when Deployment is empty): the relay's checkpoint
// key, and its transactional id after "paystream-sink/".
func (id Identity) Key() string {
	parts := []string{id.SystemID, id.Database, id.Schema}
	if id.Deployment != "" {
		parts = append([]string{id.Deployment}, parts...)
	}
	return strings.Join(parts, "/")
}

// TransactionalID is the relay's Kafka transactional id: a relay that takes
// the slot over fences the previous one's producer with it.
func (id Identity) TransactionalID() string { return "paystream-sink/" + id.Key() }

// String names the identity in log lines and errors.
func (id Identity) String() string {
	s := fmt.Sprintf("database %q schema %q of system %s", id.Database, id.Schema, id.SystemID)
	if id.Deployment != "" {
		s += fmt.Sprintf(" (deployment %q)", id.Deployment)
	}
	return s
}

// SlotName returns the logical replication slot, and publication, of the
// relay of schema in database: "paystream_", the database, the schema
// (lowercased, anything but letters, digits and '_' replaced by '_') and
// eight hex digits of a hash of the exact pair, so two pairs that read the
// same once cleaned do not share a slot. The readable part is cut to fit
// Postgres's 63 bytes.
func SlotName(database, schema string) string {
	h := fnv.New32a()
	h.Write([]byte(database))
	h.Write([]byte{0})
	h.Write([]byte(schema))
	suffix := fmt.Sprintf("_%08x", h.Sum32())
	name := "paystream_" + cleanIdentifier(database) + "_" + cleanIdentifier(schema)
	return name[:min(len(name), maxIdentifier-len(suffix))] + suffix
}

// legacySlotName is the slot name of relays before the slot carried the
// database: "paystream_" and the schema alone, so two databases with one
// schema name shared it on a cluster. A database that holds such a slot
// keeps using it (see resolveSlot).
func legacySlotName(schema string) string {
	name := "paystream_" + cleanIdentifier(schema)
	if len(name) <= maxIdentifier {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(schema))
	return fmt.Sprintf("%s_%08x", name[:maxIdentifier-9], h.Sum32())
}

func cleanIdentifier(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Identify returns the identity of the relay of pool's current database and
// schema, with deployment. It asks the server's system identifier over a
// replication connection (IDENTIFY_SYSTEM), which the relay needs anyway.
func Identify(ctx context.Context, pool *pgxpool.Pool, deployment string) (Identity, error) {
	id := Identity{Deployment: deployment}
	if err := pool.QueryRow(ctx, `SELECT current_database(), current_schema()`).Scan(&id.Database, &id.Schema); err != nil {
		return Identity{}, fmt.Errorf("read current database and schema: %w", err)
	}
	conn, err := pgconn.ConnectConfig(ctx, replicationConfig(pool))
	if err != nil {
		return Identity{}, fmt.Errorf("open replication connection: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Identity{}, fmt.Errorf("identify system: %w", err)
	}
	id.SystemID = sys.SystemID
	return id, nil
}
