-- The outbox table, in the common shape (Debezium's outbox event router, most outbox libraries).
-- The application INSERTs one row per event in the same transaction as its business change;
-- outbox-relay produces each committed INSERT to Kafka. UPDATEs and DELETEs are ignored, so rows
-- may be deleted once relayed (docs/src/concepts/guarantees.md: only committed INSERTs).
-- Extra columns (status, retry_count, ...) are tolerated and ignored.
-- Apply in the application's database: mariadb shop < migrations/0001_outbox.sql
--
-- event_key is the consumers' idempotency key, which their inboxes compare byte for byte; its
-- unique key here compares the same way, in a NO PAD binary collation (`evt-A` and `evt-a`,
-- `café` and `cafe`, `k` and `k ` are distinct keys; the database's default collation would
-- reject the second of each pair as a duplicate). The collation's name differs per server, so
-- the column names both in executable comments, and each server reads only its own:
-- MariaDB (10.2.2+) `/*M!…*/`, utf8mb4_nopad_bin; MySQL (8.0.17+) `/*!80017 …*/`,
-- utf8mb4_0900_bin, which MariaDB ignores (it skips MySQL 5.7+ version comments). On an older
-- MySQL the column keeps the table's default collation (`outbox-relay check` warns and names
-- the ALTER). migrations/0007_outbox_event_key.sql upgrades tables created before.
CREATE TABLE IF NOT EXISTS outbox (
  id             BIGINT       NOT NULL AUTO_INCREMENT,
  aggregate_type VARCHAR(255) NOT NULL,
  aggregate_id   VARCHAR(255) NOT NULL,
  event_type     VARCHAR(255) NOT NULL,
  event_key      VARCHAR(255)
                 /*M!100202 CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin */
                 /*!80017 CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_bin */ NOT NULL,
  payload        JSON         NULL,
  created_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uk_outbox_event_key (event_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
