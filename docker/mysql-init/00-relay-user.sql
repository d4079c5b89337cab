-- The relay's MySQL user: replication privileges, read on the outbox, write on its state table.
CREATE USER IF NOT EXISTS 'relay'@'%' IDENTIFIED BY 'relay-password';
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'relay'@'%';
GRANT SELECT ON shop.* TO 'relay'@'%';
GRANT INSERT, UPDATE ON shop.outbox_relay_checkpoint TO 'relay'@'%';
