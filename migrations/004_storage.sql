-- Storage for scale: every row written once and as narrow as it can be,
-- deliveries partitioned by time, no outbox, a ledger balanced by
-- construction. docs/design.md ("Storage") explains each table and index.
--
-- Upgrading in place: inbox rows move to deliveries (into daily partitions;
-- their Kafka record value kept byte-exact in `record`) and
-- dedup_keys; ledger postings become movements; outbox rows not yet
-- published are emitted as state messages by this migration's transaction
-- (migrations.go, before this file runs) and the outbox goes.

-- Dedup keys: the first delivery of each (source, dedup key). Narrow and
-- not partitioned, so the key is unique across every delivery partition;
-- `paystream retention` deletes keys older than --dedup-retention in small
-- batches. recorded_at is the processor's clock when it stored the key;
-- the BRIN index (a few pages, no WAL per insert on append-ordered rows)
-- finds expired keys without a B-tree on every row.
CREATE TABLE dedup_keys (
    source      text        NOT NULL,
    dedup_key   text        NOT NULL,
    delivery_id bigint      NOT NULL,
    recorded_at timestamptz NOT NULL,
    PRIMARY KEY (source, dedup_key)
);
CREATE INDEX dedup_keys_recorded_at ON dedup_keys USING brin (recorded_at);

-- Deliveries: every record consumed from the raw topic and its outcome,
-- partitioned by the day the processor stored it (recorded_at, UTC days).
-- Retention drops whole partitions: no DELETE, no vacuum debt. A row whose
-- day has no partition (retention has not run) lands in deliveries_default
-- instead of failing.
--
-- A delivery is stored once, with its outcome. Its webhook is kept as the
-- body, byte-exact, plus the normalized event in typed columns (driver ..
-- needs_refetch): together they rebuild the raw envelope without storing
-- the base64 body a second time. `record` holds the Kafka record value
-- instead, byte-exact, for quarantined records (which may not decode) and
-- rows migrated from the inbox. Redeliveries keep neither.
CREATE TABLE deliveries (
    id            bigint      NOT NULL,
    recorded_at   timestamptz NOT NULL,
    source        text        NOT NULL,
    dedup_key     text        NOT NULL,
    event_id      text,
    event_type    text        NOT NULL DEFAULT '',
    payment_key   text        NOT NULL,
    status        text        NOT NULL CHECK (status IN ('received', 'processed', 'ignored', 'deferred', 'quarantined', 'failed')),
    reason        text,
    attempts      integer     NOT NULL DEFAULT 1,
    duplicate_of  bigint,
    driver        text,
    payment_id    text,
    fact_status   text,
    amount_minor  bigint,
    currency      text,
    refund_id     text,
    needs_refetch boolean     NOT NULL DEFAULT false,
    body          bytea,
    record        bytea,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    kafka_offset  bigint      NOT NULL,
    occurred_at   timestamptz,
    received_at   timestamptz NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (recorded_at);
CREATE TABLE deliveries_default PARTITION OF deliveries DEFAULT;

-- A partition for each day the inbox holds rows of, up to two days ahead,
-- so migrated history is dropped by retention like any other. After this,
-- `paystream retention` and the processor create them ahead of time.
DO $$
DECLARE
    day date;
BEGIN
    FOR day IN
        SELECT generate_series(COALESCE((SELECT min(processed_at AT TIME ZONE 'UTC')::date FROM inbox), (now() AT TIME ZONE 'UTC')::date),
                               (now() AT TIME ZONE 'UTC')::date + 2, interval '1 day')::date
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF deliveries FOR VALUES FROM (%L) TO (%L)',
                       'deliveries_p' || to_char(day, 'YYYYMMDD'),
                       (day::timestamp AT TIME ZONE 'UTC'), ((day + 1)::timestamp AT TIME ZONE 'UTC'));
    END LOOP;
END
$$;

-- inspect and replay find a payment's deliveries.
CREATE INDEX deliveries_payment ON deliveries (payment_key);
-- Each batch loads its payments' waiting events, the sweeper and replay
-- theirs: only deferred and quarantined rows are in it, so a delivery
-- decided at once never touches it.
CREATE INDEX deliveries_waiting ON deliveries (payment_key, id) WHERE status IN ('deferred', 'quarantined');

-- Ids go on from the inbox's.
ALTER SEQUENCE inbox_id_seq OWNED BY NONE;
ALTER SEQUENCE inbox_id_seq RENAME TO deliveries_id_seq;

INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason, attempts,
                        duplicate_of, record, topic, partition, kafka_offset, occurred_at, received_at, processed_at)
SELECT id, processed_at, source, dedup_key, event_id, event_type, payment_key, status, reason, attempts,
       duplicate_of, payload, topic, partition, kafka_offset, occurred_at, received_at, processed_at
  FROM inbox;
INSERT INTO dedup_keys (source, dedup_key, delivery_id, recorded_at)
SELECT source, dedup_key, id, processed_at FROM inbox WHERE duplicate_of IS NULL;

-- Transitions: written once per real change; the constraints that pointed
-- at the inbox and payments were per-row triggers (foreign keys), checking
-- what the batch transaction writes together anyway.
ALTER TABLE payment_transitions DROP CONSTRAINT IF EXISTS payment_transitions_inbox_id_fkey;
ALTER TABLE payment_transitions DROP CONSTRAINT IF EXISTS payment_transitions_payment_key_fkey;
ALTER TABLE payment_transitions RENAME COLUMN inbox_id TO delivery_id;

-- Ledger movements: one row per movement, balanced by construction (the
-- debit and the credit are one row), unique per (payment, version,
-- movement) as the last barrier against applying a transition twice.
CREATE TABLE ledger_movements (
    payment_key    text     NOT NULL,
    version        bigint   NOT NULL,
    movement       smallint NOT NULL,
    debit_account  text     NOT NULL,
    credit_account text     NOT NULL,
    amount_minor   bigint   NOT NULL CHECK (amount_minor > 0),
    currency       text     NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    PRIMARY KEY (payment_key, version, movement),
    CHECK (debit_account <> credit_account)
);

-- Stored postings become movements by the rule of ledger.Movements: per
-- transition and currency, debits and credits in account order, matched
-- greedily (the overlaps of their running totals).
INSERT INTO ledger_movements (payment_key, version, movement, debit_account, credit_account, amount_minor, currency)
WITH legs AS (
    SELECT payment_key, version, currency, account, amount_minor > 0 AS debit, abs(amount_minor) AS amount,
           sum(abs(amount_minor)) OVER (PARTITION BY payment_key, version, currency, amount_minor > 0 ORDER BY account) AS upto
      FROM ledger_postings
)
SELECT d.payment_key, d.version,
       row_number() OVER (PARTITION BY d.payment_key, d.version ORDER BY d.currency, d.account, c.account) - 1,
       d.account, c.account,
       least(d.upto, c.upto) - greatest(d.upto - d.amount, c.upto - c.amount), d.currency
  FROM legs d
  JOIN legs c ON c.payment_key = d.payment_key AND c.version = d.version AND c.currency = d.currency AND NOT c.debit
 WHERE d.debit AND least(d.upto, c.upto) > greatest(d.upto - d.amount, c.upto - c.amount);

DROP TABLE ledger_postings;
DROP FUNCTION ledger_postings_balanced();

-- Signed postings per account: a view of the movements, never a second truth.
CREATE VIEW ledger_postings AS
SELECT payment_key, version, movement, debit_account AS account, amount_minor, currency FROM ledger_movements
UNION ALL
SELECT payment_key, version, movement, credit_account, -amount_minor, currency FROM ledger_movements;

-- No outbox: state events are logical decoding messages of the batch
-- transaction (package statelog).
DROP TABLE outbox;
DROP TABLE inbox;

-- Updated in place once per batch (offsets) or per transition (payments):
-- room on each page keeps those updates HOT (no index entry, no new page).
ALTER TABLE consumer_offsets SET (fillfactor = 50);
ALTER TABLE payments SET (fillfactor = 80);
-- The machine's state as JSON text: read back whole by the processor,
-- never queried inside. json is stored as sent (about a fifth smaller than
-- jsonb for a state) and only validated on input, not converted.
ALTER TABLE payments ALTER COLUMN state TYPE json USING state::json;
