-- Adds the column where the relay stores the outbox tables' column layouts with each checkpoint
-- (JSON: {"db.table": ["col", ...]}), for tables created with an older 0002_checkpoint.sql
-- (the current 0002 creates and upgrades it too; `outbox-relay migrate` runs it). The relay needs
-- it only when the server logs table maps without column names (binlog_row_metadata=MINIMAL):
-- the layout in force at the checkpoint is then known on restart, and DDL in the binlog after it
-- is followed from there. Idempotent: applying it twice changes nothing.
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
