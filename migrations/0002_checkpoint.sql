-- The relay's state (checkpoint) table: one row per connector name.
-- Apply in the database named by mysql.url (or the one in checkpoint.table), or run
-- `outbox-relay migrate --config relay.toml`, which applies this file to the configured table.
-- Idempotent: running it again changes nothing; on a table of an older layout it adds the
-- missing columns (each ALTER runs only when its column is missing; portable to MySQL, which
-- has no ADD COLUMN IF NOT EXISTS).
--
-- A stored position means: (binlog_file, binlog_pos) is the end of a transaction (after its
-- XID/COMMIT event) and every outbox INSERT committed before it -- plus the first `rows_acked`
-- outbox rows of the transaction that follows it -- has been acknowledged by Kafka (acks=all);
-- gtid_set, when set, is the GTID position (MariaDB) or GTID set (MySQL) at that same boundary.
-- The relay resumes there, skipping those `rows_acked` rows. lease_token fences writers: only the
-- instance holding the newest token may update the row.
CREATE TABLE IF NOT EXISTS `outbox_relay_checkpoint` (
  connector_name     VARCHAR(191)    NOT NULL,
  binlog_file        VARCHAR(255)    NOT NULL,
  binlog_pos         BIGINT UNSIGNED NOT NULL,
  rows_acked         BIGINT UNSIGNED NOT NULL DEFAULT 0,
  gtid_set           TEXT            NULL,
  source_server_id   INT UNSIGNED    NOT NULL,
  source_server_uuid VARCHAR(64)     NULL,
  lease_token        BIGINT UNSIGNED NOT NULL DEFAULT 0,
  lease_owner        VARCHAR(255)    NULL,
  table_layouts      MEDIUMTEXT      NULL,
  updated_at         TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (connector_name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Upgrades from the first layout (no rows_acked, lease_token, lease_owner).
SET @outbox_relay_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE `outbox_relay_checkpoint` ADD COLUMN rows_acked BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER binlog_pos',
  'DO 0') FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_checkpoint' AND COLUMN_NAME = 'rows_acked');
PREPARE outbox_relay_stmt FROM @outbox_relay_ddl;
EXECUTE outbox_relay_stmt;
DEALLOCATE PREPARE outbox_relay_stmt;

SET @outbox_relay_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE `outbox_relay_checkpoint` ADD COLUMN lease_token BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER source_server_uuid',
  'DO 0') FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_checkpoint' AND COLUMN_NAME = 'lease_token');
PREPARE outbox_relay_stmt FROM @outbox_relay_ddl;
EXECUTE outbox_relay_stmt;
DEALLOCATE PREPARE outbox_relay_stmt;

SET @outbox_relay_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE `outbox_relay_checkpoint` ADD COLUMN lease_owner VARCHAR(255) NULL AFTER lease_token',
  'DO 0') FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_checkpoint' AND COLUMN_NAME = 'lease_owner');
PREPARE outbox_relay_stmt FROM @outbox_relay_ddl;
EXECUTE outbox_relay_stmt;
DEALLOCATE PREPARE outbox_relay_stmt;

-- Upgrade: the column for the outbox tables' column layouts (see 0003_checkpoint_layouts.sql).
SET @outbox_relay_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE `outbox_relay_checkpoint` ADD COLUMN table_layouts MEDIUMTEXT NULL AFTER lease_owner',
  'DO 0') FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_checkpoint' AND COLUMN_NAME = 'table_layouts');
PREPARE outbox_relay_stmt FROM @outbox_relay_ddl;
EXECUTE outbox_relay_stmt;
DEALLOCATE PREPARE outbox_relay_stmt;

-- Upgrade: table_layouts as MEDIUMTEXT (16 MB; TEXT holds 64 KB, which the layouts of a few
-- hundred tables matched by a pattern outgrow).
SET @outbox_relay_ddl = (SELECT IF(COUNT(*) = 1,
  'ALTER TABLE `outbox_relay_checkpoint` MODIFY COLUMN table_layouts MEDIUMTEXT NULL',
  'DO 0') FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_relay_checkpoint' AND COLUMN_NAME = 'table_layouts'
    AND DATA_TYPE IN ('tinytext', 'text'));
PREPARE outbox_relay_stmt FROM @outbox_relay_ddl;
EXECUTE outbox_relay_stmt;
DEALLOCATE PREPARE outbox_relay_stmt;
