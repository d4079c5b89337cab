-- The outbox's event_key compared byte for byte (as migrations/0001_outbox.sql now creates it),
-- for outbox tables created by an older 0001_outbox.sql, whose event_key took the database's
-- default collation (utf8mb4_general_ci, utf8mb4_0900_ai_ci: case- and accent-insensitive, and
-- PAD SPACE on MariaDB), so the application could not write two events whose keys differ only
-- in case, accent or trailing spaces (the second INSERT failed with a duplicate-key error),
-- while the consumers' inboxes compare keys byte for byte.
-- Apply in the application's database (mariadb shop < migrations/0007_outbox_event_key.sql), or
-- run `outbox-relay migrate --outbox`, which applies it to each configured outbox table.
-- Idempotent: the ALTER runs only while the table exists, its event_key is a VARCHAR in a
-- unique key, and its collation is not yet a NO PAD binary one. The collation is the one the
-- server has: utf8mb4_nopad_bin (MariaDB 10.2.2+) or utf8mb4_0900_bin (MySQL 8.0.17+); a server
-- with neither (MySQL 5.7) is left unchanged (`outbox-relay check` names the VARBINARY ALTER).
-- The column keeps its length and NULL-ness. No existing key becomes a duplicate (a byte-exact
-- key separates what the old collation merged, never the reverse).
--
-- Cost: changing a column's collation copies the table, and MySQL blocks writes to it meanwhile
-- (ALGORITHM=COPY): the application's INSERTs wait. Delete relayed rows first, run it in a quiet
-- period, or apply the same ALTER with an online schema change tool (gh-ost, pt-osc).
SET @outbox_collation = (SELECT COLLATION_NAME FROM information_schema.COLLATIONS
  WHERE COLLATION_NAME IN ('utf8mb4_nopad_bin', 'utf8mb4_0900_bin')
  ORDER BY COLLATION_NAME DESC LIMIT 1);
SET @outbox_ddl = (SELECT IF(COUNT(*) = 1 AND @outbox_collation IS NOT NULL,
  CONCAT('ALTER TABLE `outbox` MODIFY `event_key` ', MAX(c.COLUMN_TYPE),
    ' CHARACTER SET utf8mb4 COLLATE ', @outbox_collation,
    IF(MAX(c.IS_NULLABLE) = 'NO', ' NOT NULL', ' NULL')),
  'DO 0') FROM information_schema.COLUMNS c
  WHERE c.TABLE_SCHEMA = DATABASE() AND c.TABLE_NAME = 'outbox' AND c.COLUMN_NAME = 'event_key'
    AND c.DATA_TYPE = 'varchar'
    AND c.COLLATION_NAME NOT IN ('utf8mb4_nopad_bin', 'utf8mb4_0900_bin')
    AND EXISTS (SELECT 1 FROM information_schema.STATISTICS s
      WHERE s.TABLE_SCHEMA = c.TABLE_SCHEMA AND s.TABLE_NAME = c.TABLE_NAME
        AND s.COLUMN_NAME = c.COLUMN_NAME AND s.NON_UNIQUE = 0));
PREPARE outbox_stmt FROM @outbox_ddl;
EXECUTE outbox_stmt;
DEALLOCATE PREPARE outbox_stmt;
