-- Adds the column where the relay stores the outbox tables' column layouts with each checkpoint
-- (JSON: {"db.table": ["col", ...]}). The relay needs it only when the server logs table maps
-- without column names (binlog_row_metadata=MINIMAL or NO_LOG, or servers without the setting):
-- the layout in force at the checkpoint is then known on restart, and DDL in the binlog after it
-- is followed from there. Apply after 0002_checkpoint.sql, once, in the same database.
ALTER TABLE outbox_relay_checkpoint ADD COLUMN table_layouts TEXT NULL;
