package inbox_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"os/signal"
	"syscall"

	_ "github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kgo"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

// A consumer that grants one coupon per order event, however often the event is delivered.
func Example() {
	db, _ := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop")
	handler := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO coupons (order_id) VALUES (?)", string(rec.Key))
		return err // an error rolls back the inbox row too, and the record is retried
	}
	r, err := inbox.NewRunner(db, inbox.Settings{
		Consumer:        "coupon-service",
		DeadLetterTopic: "coupon-service.dlq",
		VersionHeader:   "version", // optional
	}, handler, inbox.RunnerConfig{Brokers: []string{"127.0.0.1:9092"}, Topics: []string{"outbox.event.order"}})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := r.Run(ctx); err != nil { // polls, processes, commits offsets; returns after SIGTERM
		log.Fatal(err)
	}
}
