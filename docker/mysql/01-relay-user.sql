-- The relay's least-privileged user (README, "Least-privileged MySQL user"), created by the
-- mysql image's entrypoint on first start, in database `shop` (after the migrations).
CREATE USER IF NOT EXISTS 'relay'@'%' IDENTIFIED BY 'relay-password';
-- Binlog dump; SHOW MASTER/BINARY LOG STATUS, SHOW BINARY LOGS, SHOW REPLICA STATUS; SHOW REPLICAS.
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'relay'@'%';
-- The outbox tables (column names are read from information_schema, which shows only the
-- columns of tables the user has a privilege on).
GRANT SELECT ON shop.outbox TO 'relay'@'%';
-- The checkpoint (state) table.
GRANT SELECT, INSERT, UPDATE ON shop.outbox_relay_checkpoint TO 'relay'@'%';
