-- Inbox keys compared byte for byte (inbox/CONTRACT.md, "Tables"), for inbox tables created by
-- an older migrations/0004_inbox.sql. Apply in the CONSUMER's database, or run
-- `outbox-relay migrate --inbox --database-url mysql://user:pass@host:3306/db` (which applies
-- 0004 and this file and says which tables it upgraded).
-- Idempotent: each ALTER runs only while its table exists and a key column is not yet VARBINARY
-- of the new length.
-- MySQL 5.7+/8.x and MariaDB 10.5+.
--
-- Why: the old key columns were VARCHAR in the database's default collation, which on MariaDB
-- and MySQL 8 is case- and accent-insensitive (utf8mb4_general_ci, utf8mb4_0900_ai_ci,
-- uca1400_ai_ci). So `evt-a1B` and `evt-A1b`, or `café` and `cafe`, were ONE primary key: the
-- second event was reported a duplicate and its business effect never happened. The same held
-- for the version table's aggregates (`A1` and `a1` shared one version).
--
-- Why VARBINARY and not a binary collation:
-- - utf8mb4_bin is a PAD SPACE collation (MariaDB, MySQL 5.7 and 8.0): 'k' = 'k ', so keys that
--   differ only in trailing spaces would still be merged.
-- - A NO PAD binary collation exists, but under a different name on each server
--   (utf8mb4_nopad_bin on MariaDB; utf8mb4_0900_bin on MySQL 8.0.17+ only; none on MySQL 5.7),
--   so no single statement works on every supported server.
-- - VARBINARY compares bytes, pads nothing, and exists everywhere. The helpers send keys as
--   UTF-8 over utf8mb4 connections, so the stored bytes are the keys' UTF-8 form. (Reading the
--   column in a client: CONVERT(event_key USING utf8mb4).)
--
-- Lengths: event_key VARBINARY(1020), aggregate_type / aggregate_id VARBINARY(1020): every value
-- the outbox's VARCHAR(255) utf8mb4 columns can hold; consumer VARBINARY(764): every value of
-- the former VARCHAR(191). Primary keys: 764 + 1020 = 1784 and 764 + 1020 + 1020 = 2804 bytes,
-- within InnoDB's 3072-byte limit. Every existing key is kept: the conversion keeps the utf8mb4
-- bytes (and trailing spaces) of each value, and cannot create a duplicate (a byte-exact key
-- separates what the old collation merged, never the reverse).
--
-- Cost: changing a column's type copies the table, and MySQL blocks writes to it meanwhile
-- (ALGORITHM=COPY). Prune the inbox first (`outbox-relay prune --inbox`), run it in a quiet
-- period, or apply the same ALTER with an online schema change tool (gh-ost, pt-osc).
-- Events merged before the upgrade stay merged: their inbox row records the first key only.
SET @outbox_inbox_table = (SELECT COUNT(*) FROM information_schema.TABLES
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_inbox');
SET @outbox_inbox_ddl = (SELECT IF(@outbox_inbox_table = 1 AND COUNT(*) < 2,
  'ALTER TABLE outbox_inbox MODIFY consumer VARBINARY(764) NOT NULL, MODIFY event_key VARBINARY(1020) NOT NULL',
  'DO 0') FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_inbox' AND DATA_TYPE = 'varbinary'
    AND ((COLUMN_NAME = 'consumer' AND CHARACTER_MAXIMUM_LENGTH >= 764)
      OR (COLUMN_NAME = 'event_key' AND CHARACTER_MAXIMUM_LENGTH >= 1020)));
PREPARE outbox_inbox_stmt FROM @outbox_inbox_ddl;
EXECUTE outbox_inbox_stmt;
DEALLOCATE PREPARE outbox_inbox_stmt;

SET @outbox_inbox_table = (SELECT COUNT(*) FROM information_schema.TABLES
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_inbox_version');
SET @outbox_inbox_ddl = (SELECT IF(@outbox_inbox_table = 1 AND COUNT(*) < 3,
  'ALTER TABLE outbox_inbox_version MODIFY consumer VARBINARY(764) NOT NULL, MODIFY aggregate_type VARBINARY(1020) NOT NULL, MODIFY aggregate_id VARBINARY(1020) NOT NULL',
  'DO 0') FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_inbox_version' AND DATA_TYPE = 'varbinary'
    AND ((COLUMN_NAME = 'consumer' AND CHARACTER_MAXIMUM_LENGTH >= 764)
      OR (COLUMN_NAME IN ('aggregate_type', 'aggregate_id') AND CHARACTER_MAXIMUM_LENGTH >= 1020)));
PREPARE outbox_inbox_stmt FROM @outbox_inbox_ddl;
EXECUTE outbox_inbox_stmt;
DEALLOCATE PREPARE outbox_inbox_stmt;
