-- The demo's order flow, written by a separate process (the mariadb client) the way an order
-- service would: each business change and its outbox event in one transaction.
-- Orders 1001-1004 are created and paid; order 1005 is created and rolled back (no event).
CREATE TABLE IF NOT EXISTS orders (
  id         BIGINT       NOT NULL PRIMARY KEY,
  customer   VARCHAR(64)  NOT NULL,
  total      DECIMAL(10,2) NOT NULL,
  status     VARCHAR(16)  NOT NULL
) ENGINE = InnoDB;

-- DROP + CREATE (not CREATE OR REPLACE) so the same file runs on MySQL 8 too (docker-compose's
-- writer service).
DROP PROCEDURE IF EXISTS demo_order_flow;
DELIMITER //
CREATE PROCEDURE demo_order_flow()
BEGIN
  DECLARE n INT DEFAULT 1001;
  WHILE n <= 1004 DO
    START TRANSACTION;
    INSERT INTO orders VALUES (n, CONCAT('customer-', n % 3), 10.50 * (n - 1000), 'NEW');
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
    VALUES ('Order', CONCAT('order-', n), 'OrderCreated', CONCAT('order-', n, '-created'),
            JSON_OBJECT('orderId', n + 0, 'customer', CONCAT('customer-', n % 3),
                        'total', 10.50 * (n - 1000), 'note', 'café ✓'));
    COMMIT;
    START TRANSACTION;
    UPDATE orders SET status = 'PAID' WHERE id = n;
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
    VALUES ('Order', CONCAT('order-', n), 'OrderPaid', CONCAT('order-', n, '-paid'),
            JSON_OBJECT('orderId', n + 0, 'paid', TRUE));
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
    VALUES ('Payment', CONCAT('order-', n), 'PaymentCaptured', CONCAT('payment-', n),
            JSON_OBJECT('orderId', n + 0, 'amount', 10.50 * (n - 1000), 'currency', 'EUR'));
    COMMIT;
    SET n = n + 1;
  END WHILE;
  -- A transaction that is rolled back: its outbox row must never reach Kafka.
  START TRANSACTION;
  INSERT INTO orders VALUES (1005, 'customer-x', 99.00, 'NEW');
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload)
  VALUES ('Order', 'order-1005', 'OrderCreated', 'order-1005-created', JSON_OBJECT('orderId', 1005));
  ROLLBACK;
END //
DELIMITER ;

CALL demo_order_flow();
-- Relayed rows may be deleted: DELETEs on the outbox produce nothing.
DELETE FROM outbox WHERE event_type = 'OrderPaid';
