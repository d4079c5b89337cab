-- The consumer side of the outbox pattern: the inbox (inbox/CONTRACT.md).
-- Apply in the CONSUMER's database (the one its business tables live in), or run
-- `outbox-relay migrate --inbox --database-url mysql://user:pass@host:3306/db`.
-- Idempotent: running it again changes nothing. MySQL 5.7+/8.x and MariaDB 10.5+.
--
-- outbox_inbox: one row per (consumer, event_key) the consumer has processed, inserted in the
-- same database transaction as the business change, BEFORE the handler runs: a duplicate
-- delivery fails on the primary key and is acknowledged without effect. The consumer name is part
-- of the key, so two services sharing a database never suppress each other's events.
-- topic/kafka_partition/kafka_offset say where the record was read (for `outbox-relay prune
-- --inbox`, which deletes a row only when the consumer group's committed offset is past it and it
-- is older than the retention, and for `outbox-relay trace`).
--
-- The key columns are VARBINARY: keys are compared byte for byte, so `evt-a1B` and `evt-A1b`,
-- `café` and `cafe`, `k` and `k ` are distinct events (a text column would take the database's
-- case- and accent-insensitive default collation and merge them: migrations/0005_inbox_keys.sql
-- says why VARBINARY and upgrades tables created by an older version of this file).
-- VARBINARY(1020) holds every event_key the outbox's VARCHAR(255) utf8mb4 can hold (4 bytes a
-- character), VARBINARY(764) every consumer name of the former VARCHAR(191). Helpers send keys as
-- UTF-8 (utf8mb4 connections), so the bytes are the key's UTF-8 form.
CREATE TABLE IF NOT EXISTS outbox_inbox (
  consumer        VARBINARY(764)  NOT NULL,
  event_key       VARBINARY(1020) NOT NULL,
  topic           VARCHAR(249) NOT NULL,
  kafka_partition INT          NOT NULL,
  kafka_offset    BIGINT       NOT NULL,
  processed_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (consumer, event_key),
  KEY ix_outbox_inbox_processed (consumer, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- outbox_inbox_version: the last version applied per (consumer, aggregate), for consumers that
-- check event order by a version the producer assigned (header `version` by default). Updated in
-- the same transaction as the inbox row and the business change. Keys byte for byte as above
-- (aggregate `A1` and `a1` keep their own versions), aggregate_type and aggregate_id hold what
-- the outbox's VARCHAR(255) utf8mb4 columns can (1020 bytes). Primary key: 764 + 1020 + 1020 =
-- 2804 bytes, within InnoDB's 3072.
CREATE TABLE IF NOT EXISTS outbox_inbox_version (
  consumer       VARBINARY(764)  NOT NULL,
  aggregate_type VARBINARY(1020) NOT NULL,
  aggregate_id   VARBINARY(1020) NOT NULL,
  version        BIGINT       NOT NULL,
  updated_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (consumer, aggregate_type, aggregate_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
