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
CREATE TABLE IF NOT EXISTS outbox_inbox (
  consumer        VARCHAR(191) NOT NULL,
  event_key       VARCHAR(255) NOT NULL,
  topic           VARCHAR(249) NOT NULL,
  kafka_partition INT          NOT NULL,
  kafka_offset    BIGINT       NOT NULL,
  processed_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (consumer, event_key),
  KEY ix_outbox_inbox_processed (consumer, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- outbox_inbox_version: the last version applied per (consumer, aggregate), for consumers that
-- check event order by a version the producer assigned (header `version` by default). Updated in
-- the same transaction as the inbox row and the business change.
CREATE TABLE IF NOT EXISTS outbox_inbox_version (
  consumer       VARCHAR(191) NOT NULL,
  aggregate_type VARCHAR(191) NOT NULL,
  aggregate_id   VARCHAR(191) NOT NULL,
  version        BIGINT       NOT NULL,
  updated_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (consumer, aggregate_type, aggregate_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
