-- The outbox table, in the common shape (Debezium's outbox event router, most outbox libraries).
-- The application INSERTs one row per event in the same transaction as its business change;
-- outbox-relay produces each committed INSERT to Kafka. UPDATEs and DELETEs are ignored, so rows
-- may be deleted once relayed (docs/src/concepts/guarantees.md: only committed INSERTs).
-- Extra columns (status, retry_count, ...) are tolerated and ignored.
-- Apply in the application's database: mariadb shop < migrations/0001_outbox.sql
CREATE TABLE IF NOT EXISTS outbox (
  id             BIGINT       NOT NULL AUTO_INCREMENT,
  aggregate_type VARCHAR(255) NOT NULL,
  aggregate_id   VARCHAR(255) NOT NULL,
  event_type     VARCHAR(255) NOT NULL,
  event_key      VARCHAR(255) NOT NULL,
  payload        JSON         NULL,
  created_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uk_outbox_event_key (event_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
