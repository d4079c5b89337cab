-- The relay's state (checkpoint) table: one row per connector name.
-- Apply in the database named by mysql.url (or the one in checkpoint.table).
--
-- A stored position means: every INSERT on the outbox tables committed in the binlog before
-- (binlog_file, binlog_pos) -- and, when gtid_set is set, every transaction in gtid_set -- has been
-- acknowledged by Kafka (acks=all); (binlog_file, binlog_pos) is the end of a transaction's
-- XID/COMMIT event (a transaction boundary), from which the relay resumes.
CREATE TABLE IF NOT EXISTS outbox_relay_checkpoint (
  connector_name     VARCHAR(191)    NOT NULL,
  binlog_file        VARCHAR(255)    NOT NULL,
  binlog_pos         BIGINT UNSIGNED NOT NULL,
  gtid_set           TEXT            NULL,
  source_server_id   INT UNSIGNED    NOT NULL,
  source_server_uuid VARCHAR(64)     NULL,
  updated_at         TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (connector_name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
