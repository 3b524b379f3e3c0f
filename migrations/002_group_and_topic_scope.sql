-- Consumer groups and topic incarnations.
--
-- An inbox row records where a delivery was read (topic, partition,
-- kafka_offset), but that position is not unique: a new consumer group
-- re-reads the topic from its start (each record becomes an ignored
-- duplicate_event row), and a topic deleted and recreated under the same
-- name starts its offsets at 0 again. Rows now reference each other by id,
-- allocated before they are inserted, so the unique key goes.
ALTER TABLE inbox DROP CONSTRAINT IF EXISTS inbox_topic_partition_kafka_offset_key;

-- Kafka's topic ID (base64, as kafka-topics --describe shows it) of the
-- incarnation the stored offsets belong to. A claim that finds a different
-- ID resumes the partition from its start. NULL for rows stored before this
-- migration: the next claim records the current ID and keeps the offset.
ALTER TABLE consumer_offsets ADD COLUMN IF NOT EXISTS topic_id text;
