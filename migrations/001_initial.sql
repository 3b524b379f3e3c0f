-- paystream's initial schema (docs/design.md describes the tables).

-- Where each consumer group's partition workers resume, and who owns them.
-- Postgres, not Kafka, is the source of truth for consumed offsets: the
-- offset advances in the same transaction as the effects it covers.
CREATE TABLE consumer_offsets (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL DEFAULT 0 CHECK (next_offset >= 0),
    owner_epoch bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);

-- Payments: the machine's state, whole, plus the columns people query.
CREATE TABLE payments (
    payment_key   text        PRIMARY KEY,
    source        text        NOT NULL,
    payment_id    text        NOT NULL,
    status        text        NOT NULL,
    version       bigint      NOT NULL CHECK (version >= 0),
    amount_minor  bigint      NOT NULL DEFAULT 0,
    currency      text        NOT NULL DEFAULT '',
    state         jsonb       NOT NULL,
    held          boolean     NOT NULL DEFAULT false,
    held_reason   text,
    last_event_at timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Every delivery consumed from the raw topic is one inbox row. The first
-- delivery of an event owns its (source, dedup_key); later ones point at it
-- and are recorded as ignored duplicates. The partial unique index is the
-- deduplication itself (INSERT ... ON CONFLICT DO NOTHING), never a lookup.
CREATE TABLE inbox (
    id            bigserial   PRIMARY KEY,
    source        text        NOT NULL,
    dedup_key     text        NOT NULL,
    event_id      text,
    event_type    text        NOT NULL DEFAULT '',
    payment_key   text        NOT NULL,
    status        text        NOT NULL CHECK (status IN ('received', 'processed', 'ignored', 'deferred', 'quarantined', 'failed')),
    reason        text,
    attempts      integer     NOT NULL DEFAULT 0,
    duplicate_of  bigint      REFERENCES inbox (id),
    fact          jsonb,
    payload       bytea,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    kafka_offset  bigint      NOT NULL,
    occurred_at   timestamptz,
    received_at   timestamptz NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (topic, partition, kafka_offset)
);
CREATE UNIQUE INDEX inbox_dedup ON inbox (source, dedup_key) WHERE duplicate_of IS NULL;
CREATE INDEX inbox_payment ON inbox (payment_key, id);
CREATE INDEX inbox_waiting ON inbox (payment_key, occurred_at, id) WHERE status IN ('deferred', 'quarantined');
CREATE INDEX inbox_received_at ON inbox (received_at);

-- One row per real change of a payment.
CREATE TABLE payment_transitions (
    payment_key  text        NOT NULL REFERENCES payments (payment_key),
    version      bigint      NOT NULL CHECK (version > 0),
    from_status  text        NOT NULL,
    to_status    text        NOT NULL,
    kind         text        NOT NULL,
    amount_minor bigint      NOT NULL DEFAULT 0,
    currency     text        NOT NULL DEFAULT '',
    refund_id    text,
    inbox_id     bigint      REFERENCES inbox (id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (payment_key, version)
);

-- Double-entry postings. Unique per (payment, transition, account, currency):
-- the last barrier if anything upstream is wrong. Balance per transition and
-- currency is checked by a deferred constraint trigger at commit.
CREATE TABLE ledger_postings (
    id           bigserial   PRIMARY KEY,
    payment_key  text        NOT NULL,
    version      bigint      NOT NULL,
    account      text        NOT NULL,
    amount_minor bigint      NOT NULL CHECK (amount_minor <> 0),
    currency     text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (payment_key, version, account, currency),
    FOREIGN KEY (payment_key, version) REFERENCES payment_transitions (payment_key, version)
);

CREATE FUNCTION ledger_postings_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    unbalanced text;
BEGIN
    SELECT currency INTO unbalanced
      FROM ledger_postings
     WHERE payment_key = NEW.payment_key AND version = NEW.version
     GROUP BY currency
    HAVING sum(amount_minor) <> 0
     LIMIT 1;
    IF unbalanced IS NOT NULL THEN
        RAISE EXCEPTION 'ledger postings for % version % do not balance in %',
            NEW.payment_key, NEW.version, unbalanced
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER ledger_postings_balanced
    AFTER INSERT OR UPDATE ON ledger_postings
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_postings_balanced();

-- Normalized payment-state events waiting for (or done with) the sink relay.
-- Per payment, id order is commit order: a payment's events are written by the
-- one worker owning its partition, one transaction after another.
CREATE TABLE outbox (
    id           bigserial   PRIMARY KEY,
    payment_key  text        NOT NULL,
    version      bigint      NOT NULL,
    event_id     text        NOT NULL UNIQUE,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    FOREIGN KEY (payment_key, version) REFERENCES payment_transitions (payment_key, version)
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
