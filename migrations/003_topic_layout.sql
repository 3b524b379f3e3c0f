-- The partition count of each topic paystream keys by payment, as
-- `paystream migrate` recorded it. Kafka maps a key to a partition by the
-- partition count, so adding partitions moves payments to other partitions
-- and breaks their order while old records are still being processed; the
-- processor refuses to start when the live count differs from this one
-- (see README, "Changing the partition count").
CREATE TABLE IF NOT EXISTS topic_layout (
    topic       text        PRIMARY KEY,
    partitions  integer     NOT NULL CHECK (partitions > 0),
    recorded_at timestamptz NOT NULL DEFAULT now()
);
