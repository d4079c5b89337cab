-- Parked versions (inbox/CONTRACT.md, "Parked versions"): records a consumer received ahead of
-- their aggregate's next version, stored instead of applied, and applied by the helper itself
-- once the version before them has been (or dead-lettered at their deadline). Apply in the
-- CONSUMER's database, or run `outbox-relay migrate --inbox --database-url mysql://…`.
-- Idempotent. MySQL 5.7+/8.x and MariaDB 10.5+.
--
-- Keys byte for byte, as in 0004_inbox.sql (VARBINARY). Primary key: 764 + 1020 + 1020 + 8 =
-- 2812 bytes, within InnoDB's 3072. A redelivered parked record hits the primary key and is
-- ignored. record_headers: a JSON array of [name, base64 value or null] pairs in the record's
-- order. expires_at: parked_at + the topic's gap deadline; the helpers' sweep dead-letters (or
-- compensates) a row past it.
CREATE TABLE IF NOT EXISTS outbox_inbox_parked (
  consumer        VARBINARY(764)  NOT NULL,
  aggregate_type  VARBINARY(1020) NOT NULL,
  aggregate_id    VARBINARY(1020) NOT NULL,
  version         BIGINT          NOT NULL,
  event_key       VARBINARY(1020) NOT NULL,
  topic           VARCHAR(249)    NOT NULL,
  kafka_partition INT             NOT NULL,
  kafka_offset    BIGINT          NOT NULL,
  record_key      LONGBLOB        NULL,
  record_value    LONGBLOB        NULL,
  record_headers  LONGTEXT        NOT NULL,
  reason          VARCHAR(512)    NOT NULL,
  parked_at       DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  expires_at      DATETIME(6)     NOT NULL,
  PRIMARY KEY (consumer, aggregate_type, aggregate_id, version),
  KEY ix_outbox_inbox_parked_expires (consumer, expires_at),
  KEY ix_outbox_inbox_parked_event (consumer, event_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
