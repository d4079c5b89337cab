package inbox_test

// These tests run against a real MySQL/MariaDB server and a real Kafka broker:
// INBOX_TEST_DB_HOST (127.0.0.1), INBOX_TEST_DB_PORT (3306), INBOX_TEST_DB_USER (root),
// INBOX_TEST_DB_PASSWORD (empty), INBOX_TEST_BOOTSTRAP (127.0.0.1:9092). Each test creates its
// own database (inbox_go_*) and topics (inbox-go-*) and drops them at the end.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

var bootstrap = getenv("INBOX_TEST_BOOTSTRAP", "127.0.0.1:9092")

func randSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func dbConfig(name string) *mysql.Config {
	return dbConfigOn(serverMariaDB, name)
}

// The servers the batch tests run on: the suite's server (INBOX_TEST_DB_PORT, MariaDB in
// tests/run.sh) and MySQL 8.0 (INBOX_TEST_MYSQL_PORT), same host, user and password.
const (
	serverMariaDB = "mariadb"
	serverMySQL   = "mysql"
)

func dbConfigOn(server, name string) *mysql.Config {
	mc := mysql.NewConfig()
	mc.User = getenv("INBOX_TEST_DB_USER", "root")
	mc.Passwd = os.Getenv("INBOX_TEST_DB_PASSWORD")
	mc.Net = "tcp"
	port := getenv("INBOX_TEST_DB_PORT", "3306")
	if server == serverMySQL {
		port = getenv("INBOX_TEST_MYSQL_PORT", "3326")
	}
	mc.Addr = net.JoinHostPort(getenv("INBOX_TEST_DB_HOST", "127.0.0.1"), port)
	mc.DBName = name
	return mc
}

// newDB creates a database with the inbox tables (migrations/0004_inbox.sql,
// 0006_inbox_parked.sql) and an `effects`
// table the handlers write to; it is dropped when the test ends.
func newDB(t *testing.T) *sql.DB {
	t.Helper()
	return newDBOn(t, serverMariaDB, nil)
}

// newDBOn is newDB on server; params are extra connection settings of the returned pool (system
// variables set on each connection, e.g. transaction_isolation).
func newDBOn(t *testing.T, server string, params map[string]string) *sql.DB {
	t.Helper()
	dbConfig := func(name string) *mysql.Config { return dbConfigOn(server, name) }
	name := "inbox_go_" + randSuffix()
	admin, err := sql.Open("mysql", dbConfig("").FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.Ping(); err != nil {
		port := "INBOX_TEST_DB_PORT"
		if server == serverMySQL {
			port = "INBOX_TEST_MYSQL_PORT"
		}
		t.Fatalf("cannot connect to the %s test server at %s (set %s): %v", server, dbConfig("").Addr, port, err)
	}
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
			t.Errorf("drop database: %v", err)
		}
	})
	var migration []byte
	for _, f := range []string{"0004_inbox.sql", "0006_inbox_parked.sql"} {
		b, err := os.ReadFile("../../migrations/" + f)
		if err != nil {
			t.Fatal(err)
		}
		migration = append(append(migration, b...), '\n')
	}
	mc := dbConfig(name)
	mc.MultiStatements = true
	setup, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = setup.Close() }()
	if _, err := setup.Exec(string(migration)); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec("CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_key VARCHAR(255))"); err != nil {
		t.Fatal(err)
	}
	mc = dbConfig(name)
	mc.Params = params
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(bootstrap, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// newTopics creates topics with the given number of partitions and deletes them at the end.
func newTopics(t *testing.T, partitions int32, names ...string) {
	t.Helper()
	adm := kadm.NewClient(newClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.CreateTopics(ctx, partitions, 1, nil, names...)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, names...)
	})
	// A loaded broker may take a while to serve a new topic's metadata.
	eventually(t, "topics with leaders", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		td, err := adm.ListTopics(ctx, names...)
		if err != nil || td.Error() != nil || len(td) != len(names) {
			return false
		}
		for _, d := range td {
			if len(d.Partitions) != int(partitions) {
				return false
			}
			for _, p := range d.Partitions {
				if p.Err != nil || p.Leader < 0 {
					return false
				}
			}
		}
		return true
	})
}

type env struct {
	db       *sql.DB
	producer *kgo.Client
	topic    string
	dlq      string
}

func newEnv(t *testing.T, partitions int32) *env {
	t.Helper()
	s := randSuffix()
	e := &env{db: newDB(t), producer: newClient(t), topic: "inbox-go-in-" + s, dlq: "inbox-go-dlq-" + s}
	newTopics(t, partitions, e.topic, e.dlq)
	return e
}

func (e *env) settings() inbox.Settings {
	return inbox.Settings{
		Consumer:        "test-consumer",
		DeadLetterTopic: e.dlq,
		MaxAttempts:     3,
		BackoffInitial:  10 * time.Millisecond,
		BackoffMax:      50 * time.Millisecond,
	}
}

func (e *env) newInbox(t *testing.T, s inbox.Settings) *inbox.Inbox {
	t.Helper()
	in, err := inbox.New(e.db, e.producer, s)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// record builds a record as the relay produces it (not produced to Kafka: Process takes it as
// polled). headers: name, value pairs.
func (e *env) record(offset int64, key string, headers ...string) *kgo.Record {
	r := &kgo.Record{Topic: e.topic, Partition: 0, Offset: offset, Key: []byte(key), Value: []byte(`{"order_id":"` + key + `"}`)}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

func (e *env) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) effects(t *testing.T, eventKey string) int {
	return e.count(t, "SELECT COUNT(*) FROM effects WHERE event_key = ?", eventKey)
}

// readDLQ reads the dead-letter topic from the start until it holds n records.
func (e *env) readDLQ(t *testing.T, n int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, kgo.ConsumeTopics(e.dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		f := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("dead-letter topic: %d records, want %d", len(recs), n)
		}
		recs = append(recs, f.Records()...)
	}
	return recs
}

func hdr(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return "<missing>"
}

// effectHandler inserts one effects row in the inbox transaction, then fails while fail says so.
func effectHandler(calls *atomic.Int32, fail func(n int32) error) inbox.Handler {
	return func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		n := calls.Add(1)
		var key string
		for _, h := range rec.Headers {
			if h.Key == "event_key" {
				key = string(h.Value)
			}
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO effects (event_key) VALUES (?)", key); err != nil {
			return err
		}
		if fail != nil {
			return fail(n)
		}
		return nil
	}
}

func TestSettingsRequired(t *testing.T) {
	db := &sql.DB{}
	p := &kgo.Client{}
	if _, err := inbox.New(db, p, inbox.Settings{Consumer: "c"}); err == nil {
		t.Error("no dead-letter topic: want an error")
	}
	if _, err := inbox.New(db, p, inbox.Settings{DeadLetterTopic: "d"}); err == nil {
		t.Error("no consumer: want an error")
	}
	if _, err := inbox.New(db, p, inbox.Settings{Consumer: "c", DeadLetterTopic: "d", InboxTable: "x; DROP"}); err == nil {
		t.Error("bad table name: want an error")
	}
	in, err := inbox.New(db, p, inbox.Settings{Consumer: "c", DeadLetterTopic: "d"})
	if err != nil {
		t.Fatal(err)
	}
	s := in.Settings()
	if s.MaxAttempts != 5 || s.BackoffInitial != 100*time.Millisecond || s.BackoffMax != 10*time.Second ||
		s.GapPolicy != inbox.GapPark || s.InboxTable != "outbox_inbox" || s.EventKeyHeader != "event_key" ||
		s.ParkedTable != "outbox_inbox_parked" || s.GapDeadline != time.Hour || s.ParkSweepInterval != 10*time.Second {
		t.Errorf("defaults: %+v", s)
	}
}

func TestDuplicateIsAcknowledgedWithoutHandler(t *testing.T) {
	e := newEnv(t, 1)
	var events []string
	s := e.settings()
	s.Hooks = inbox.Hooks{
		BeforeCommit: func(rec *kgo.Record) { events = append(events, "before") },
		AfterCommit:  func(rec *kgo.Record, res inbox.Result) { events = append(events, "after:"+string(res.Outcome)) },
	}
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	ctx := context.Background()

	res, err := in.Process(ctx, e.record(7, "order-1", "event_key", "k1"), h)
	if err != nil || res.Outcome != inbox.Processed || res.Attempts != 1 {
		t.Fatalf("first: %+v, %v", res, err)
	}
	res, err = in.Process(ctx, e.record(9, "order-1", "event_key", "k1"), h)
	if err != nil || res.Outcome != inbox.Duplicate || res.Attempts != 1 {
		t.Fatalf("second: %+v, %v", res, err)
	}
	if calls.Load() != 1 || e.effects(t, "k1") != 1 {
		t.Errorf("handler calls %d, effects %d: want 1, 1", calls.Load(), e.effects(t, "k1"))
	}
	if got := strings.Join(events, ","); got != "before,after:processed,after:duplicate" {
		t.Errorf("hooks: %s", got)
	}
	var topic string
	var partition int32
	var offset int64
	if err := e.db.QueryRow("SELECT topic, kafka_partition, kafka_offset FROM outbox_inbox WHERE consumer = ? AND event_key = ?",
		"test-consumer", "k1").Scan(&topic, &partition, &offset); err != nil {
		t.Fatal(err)
	}
	if topic != e.topic || partition != 0 || offset != 7 {
		t.Errorf("inbox row: %s %d %d", topic, partition, offset)
	}
	// Another consumer name is another inbox key: not a duplicate.
	s2 := e.settings()
	s2.Consumer = "other-consumer"
	res, err = e.newInbox(t, s2).Process(ctx, e.record(9, "order-1", "event_key", "k1"), h)
	if err != nil || res.Outcome != inbox.Processed {
		t.Fatalf("other consumer: %+v, %v", res, err)
	}
}

// keyTwins are event keys (and aggregate ids) that differ only in case, accent or trailing
// spaces: distinct events, which the inbox must never merge.
var keyTwins = []string{"evt-a1B", "evt-A1b", "café", "cafe", "k", "k "}

func TestKeysDifferingInCaseAccentOrTrailingSpacesAreDistinct(t *testing.T) {
	e := newEnv(t, 1)
	s := e.settings()
	s.VersionHeader = "version"
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	ctx := context.Background()

	// Each key once: every one is a new event with its effect; the aggregate ids are the same
	// strings, each with version 1 (a merged version row would make the twin stale).
	for i, k := range keyTwins {
		res, err := in.Process(ctx, e.record(int64(i), k, "event_key", k, "aggregate_type", "order", "version", "1"), h)
		if err != nil || res.Outcome != inbox.Processed {
			t.Errorf("event_key %q: %+v, %v: want processed", k, res, err)
		}
	}
	// Each key again: a duplicate, no second effect.
	for i, k := range keyTwins {
		res, err := in.Process(ctx, e.record(int64(10+i), k, "event_key", k, "aggregate_type", "order", "version", "2"), h)
		if err != nil || res.Outcome != inbox.Duplicate {
			t.Errorf("event_key %q again: %+v, %v: want duplicate", k, res, err)
		}
	}
	if calls.Load() != int32(len(keyTwins)) {
		t.Errorf("handler calls %d, want %d", calls.Load(), len(keyTwins))
	}
	// The effects, read back as text (the test's own table may be in another character set).
	rows, err := e.db.Query("SELECT event_key FROM effects ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var effects []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		effects = append(effects, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%q", effects) != fmt.Sprintf("%q", keyTwins) {
		t.Errorf("effects %q, want one each of %q", effects, keyTwins)
	}
	for _, k := range keyTwins {
		if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE consumer = 'test-consumer' AND event_key = CAST(? AS BINARY)", k); n != 1 {
			t.Errorf("inbox rows of %q: %d, want 1", k, n)
		}
		if n := e.count(t, "SELECT COALESCE(MAX(version), 0) FROM outbox_inbox_version WHERE consumer = 'test-consumer' AND aggregate_type = 'order' AND aggregate_id = CAST(? AS BINARY)", k); n != 1 {
			t.Errorf("version of aggregate %q: %d, want 1", k, n)
		}
	}
}

func TestHandlerErrorRollsBackRetriesThenDeadLetters(t *testing.T) {
	e := newEnv(t, 1)
	in := e.newInbox(t, e.settings())
	ctx := context.Background()

	// Fails twice, then succeeds: the failed attempts leave no effect.
	var calls atomic.Int32
	start := time.Now()
	res, err := in.Process(ctx, e.record(1, "order-1", "event_key", "flaky"), effectHandler(&calls, func(n int32) error {
		if n <= 2 {
			return fmt.Errorf("transient failure %d of 2", n)
		}
		return nil
	}))
	if err != nil || res.Outcome != inbox.Processed || res.Attempts != 3 {
		t.Fatalf("flaky: %+v, %v", res, err)
	}
	if el := time.Since(start); el < 30*time.Millisecond { // backoff 10 ms + 20 ms
		t.Errorf("retries did not wait the backoff: %v", el)
	}
	if n := e.effects(t, "flaky"); n != 1 {
		t.Errorf("flaky effects: %d, want 1", n)
	}

	// Always fails: dead-lettered after MaxAttempts, nothing left in the database.
	calls.Store(0)
	rec := e.record(5, "order-2", "event_key", "poison", "aggregate_type", "order")
	res, err = in.Process(ctx, rec, effectHandler(&calls, func(int32) error { return errors.New("poison record") }))
	if err != nil || res.Outcome != inbox.DeadLettered || res.Attempts != 3 || res.Reason != "poison record" {
		t.Fatalf("poison: %+v, %v", res, err)
	}
	if calls.Load() != 3 || e.effects(t, "poison") != 0 {
		t.Errorf("poison: calls %d (want 3), effects %d (want 0)", calls.Load(), e.effects(t, "poison"))
	}
	if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE event_key = 'poison'"); n != 0 {
		t.Errorf("inbox row of a dead-lettered record: %d", n)
	}
	dl := e.readDLQ(t, 1)[0]
	want := map[string]string{
		"dlq_reason": "poison record", "dlq_topic": e.topic, "dlq_partition": "0", "dlq_offset": "5",
		"dlq_consumer": "test-consumer", "dlq_attempts": "3", "event_key": "poison", "aggregate_type": "order",
	}
	for k, v := range want {
		if got := hdr(dl, k); got != v {
			t.Errorf("dead letter header %s = %q, want %q", k, got, v)
		}
	}
	if string(dl.Key) != "order-2" || string(dl.Value) != string(rec.Value) {
		t.Errorf("dead letter key/value changed: %q %q", dl.Key, dl.Value)
	}
}

func TestMissingEventKeyIsDeadLetteredAtOnce(t *testing.T) {
	e := newEnv(t, 1)
	in := e.newInbox(t, e.settings())
	var calls atomic.Int32
	for i, rec := range []*kgo.Record{e.record(3, "order-1", "id", "1"), e.record(4, "order-1", "event_key", "")} {
		res, err := in.Process(context.Background(), rec, effectHandler(&calls, nil))
		if err != nil || res.Outcome != inbox.DeadLettered || res.Attempts != 0 {
			t.Fatalf("record %d: %+v, %v", i, res, err)
		}
	}
	if calls.Load() != 0 {
		t.Errorf("handler ran %d times", calls.Load())
	}
	dls := e.readDLQ(t, 2)
	for i, dl := range dls {
		if hdr(dl, "dlq_reason") != "missing event_key header" || hdr(dl, "dlq_attempts") != "0" ||
			hdr(dl, "dlq_offset") != fmt.Sprint(3+i) {
			t.Errorf("dead letter %d headers: %v", i, dl.Headers)
		}
	}
	if hdr(dls[0], "id") != "1" {
		t.Error("original header lost")
	}
}

func versioned(e *env, offset int64, agg, key string, version string) *kgo.Record {
	return e.record(offset, agg, "event_key", key, "aggregate_type", "order", "version", version)
}

// TestVersionsStaleAndGapDeadLetter: GapDeadLetter keeps what GapPark did before parked
// versions existed: a gap is dead-lettered at once.
func TestVersionsStaleAndGapDeadLetter(t *testing.T) {
	e := newEnv(t, 1)
	s := e.settings()
	s.VersionHeader = "version"
	s.GapPolicy = inbox.GapDeadLetter
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	steps := []struct {
		agg, key, version string
		want              inbox.Outcome
	}{
		{"A", "A-v1", "1", inbox.Processed},
		{"A", "A-v2", "2", inbox.Processed},
		{"A", "A-v2-again", "2", inbox.Stale},
		{"A", "A-v1-late", "1", inbox.Stale},
		{"A", "A-v4-early", "4", inbox.DeadLettered},
		{"A", "A-v3", "3", inbox.Processed},
		{"A", "A-v4", "4", inbox.Processed},
		{"B", "B-v1", "1", inbox.Processed},
		{"A", "A-v1-late", "1", inbox.Duplicate}, // a stale record's inbox row stays
	}
	for i, st := range steps {
		res, err := in.Process(context.Background(), versioned(e, int64(i), st.agg, st.key, st.version), h)
		if err != nil || res.Outcome != st.want {
			t.Fatalf("%s: %+v, %v; want %s", st.key, res, err, st.want)
		}
	}
	for key, want := range map[string]int{"A-v1": 1, "A-v2": 1, "A-v2-again": 0, "A-v1-late": 0, "A-v4-early": 0, "A-v3": 1, "A-v4": 1, "B-v1": 1} {
		if got := e.effects(t, key); got != want {
			t.Errorf("effects of %s: %d, want %d", key, got, want)
		}
	}
	for agg, want := range map[string]int{"A": 4, "B": 1} {
		if got := e.count(t, "SELECT version FROM outbox_inbox_version WHERE consumer = 'test-consumer' AND aggregate_type = 'order' AND aggregate_id = ?", agg); got != want {
			t.Errorf("stored version of %s: %d, want %d", agg, got, want)
		}
	}
	dl := e.readDLQ(t, 1)[0]
	if hdr(dl, "event_key") != "A-v4-early" || hdr(dl, "dlq_reason") != "version gap: expected 3, got 4" ||
		hdr(dl, "dlq_attempts") != "1" {
		t.Errorf("gap dead letter: %v", dl.Headers)
	}
	// A dead-lettered gap left no inbox row (a redelivery after the gap closed is processed),
	// and nothing parked.
	if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE event_key = 'A-v4-early'"); n != 0 {
		t.Errorf("inbox row of a dead-lettered gap: %d", n)
	}
	if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox_parked"); n != 0 {
		t.Errorf("parked rows under GapDeadLetter: %d", n)
	}
}

func TestVersionGapRetryAndInvalidVersion(t *testing.T) {
	e := newEnv(t, 1)
	s := e.settings()
	s.VersionHeader = "version"
	s.GapPolicy = inbox.GapRetry
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	ctx := context.Background()
	if res, err := in.Process(ctx, versioned(e, 0, "A", "A-v1", "1"), h); err != nil || res.Outcome != inbox.Processed {
		t.Fatalf("A-v1: %+v, %v", res, err)
	}
	res, err := in.Process(ctx, versioned(e, 1, "A", "A-v3", "3"), h)
	if err != nil || res.Outcome != inbox.DeadLettered || res.Attempts != 3 || res.Reason != "version gap: expected 2, got 3" {
		t.Fatalf("A-v3: %+v, %v", res, err)
	}
	res, err = in.Process(ctx, versioned(e, 2, "A", "A-vx", "two"), h)
	if err != nil || res.Outcome != inbox.DeadLettered || res.Attempts != 0 || res.Reason != "invalid version header: two" {
		t.Fatalf("A-vx: %+v, %v", res, err)
	}
	res, err = in.Process(ctx, versioned(e, 3, "A", "A-vempty", ""), h)
	if err != nil || res.Outcome != inbox.DeadLettered || res.Reason != "invalid version header: " {
		t.Fatalf("A-vempty: %+v, %v", res, err)
	}
	// No version header: no version check.
	if res, err := in.Process(ctx, e.record(4, "A", "event_key", "A-none"), h); err != nil || res.Outcome != inbox.Processed {
		t.Fatalf("A-none: %+v, %v", res, err)
	}
	if calls.Load() != 2 {
		t.Errorf("handler calls: %d, want 2", calls.Load())
	}
	dls := e.readDLQ(t, 3)
	if hdr(dls[0], "dlq_reason") != "version gap: expected 2, got 3" || hdr(dls[0], "dlq_attempts") != "3" ||
		hdr(dls[1], "dlq_reason") != "invalid version header: two" || hdr(dls[1], "dlq_attempts") != "0" {
		t.Errorf("dead letters: %v / %v", dls[0].Headers, dls[1].Headers)
	}
}

func TestDeadLetterThatCannotBeProducedIsAnError(t *testing.T) {
	e := newEnv(t, 1)
	s := e.settings()
	s.DeadLetterTopic = "inbox-go-missing-" + randSuffix() // does not exist
	s.DeadLetterTimeout = 3 * time.Second
	var settled atomic.Int32
	s.Hooks.AfterCommit = func(*kgo.Record, inbox.Result) { settled.Add(1) }
	in := e.newInbox(t, s)
	var calls atomic.Int32
	// kgo does not ask the broker to create missing topics: producing fails after retries.
	_, err := in.Process(context.Background(), e.record(0, "order-1"), effectHandler(&calls, nil))
	if err == nil {
		t.Fatal("a dead letter that cannot be produced: want an error")
	}
	if settled.Load() != 0 {
		t.Error("AfterCommit ran for an unsettled record")
	}
}

// produce sends records (key order-i, event_key e-i) to a partition (with a client using the
// manual partitioner, or to a one-partition topic) and waits for them.
func produce(t *testing.T, cl *kgo.Client, topic string, partition int32, from, to int) {
	t.Helper()
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: partition, Key: []byte(fmt.Sprintf("order-%d", i)),
			Value: []byte(`{"order_id":"x"}`), Headers: []kgo.RecordHeader{{Key: "event_key", Value: []byte(fmt.Sprintf("e-%d", i))}}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// committed returns the group's committed offset of partition 0 of topic (-1: none).
func committed(t *testing.T, adm *kadm.Client, group, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := resp.Lookup(topic, 0); ok && o.Err == nil {
		return o.At
	}
	return -1
}

func TestRunnerCommitsOnlyProcessedOffsets(t *testing.T) {
	e := newEnv(t, 1)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	produce(t, e.producer, e.topic, 0, 0, 5)

	// The first runner blocks in the handler of e-2 (offset 2).
	entered, release := make(chan struct{}), make(chan struct{})
	var seen1 sync.Map
	h1 := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		seen1.Store(string(rec.Key), true)
		if string(rec.Key) == "order-2" {
			close(entered)
			<-release
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO effects (event_key) VALUES (?)", string(rec.Key))
		return err
	}
	cfg := inbox.RunnerConfig{Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group, MaxPollRecords: 100}
	r1, err := inbox.NewRunner(e.db, e.settings(), h1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx1, stop1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- r1.Run(ctx1) }()
	select {
	case <-entered:
	case err := <-done1:
		t.Fatalf("runner stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the handler never saw order-2")
	}
	if c := committed(t, adm, group, e.topic); c > 2 {
		t.Errorf("committed offset %d while offset 2 is in hand", c)
	}
	// Stop while order-2 is in hand: it is finished, then offsets up to it are committed.
	stop1()
	close(release)
	if err := <-done1; err != nil {
		t.Fatalf("run: %v", err)
	}
	if c := committed(t, adm, group, e.topic); c != 3 {
		t.Errorf("committed offset after stop: %d, want 3", c)
	}
	if _, ok := seen1.Load("order-3"); ok {
		t.Error("the first runner went on after the stop")
	}

	// A second runner in the group processes the rest, and only the rest.
	var mu sync.Mutex
	var seen2 []string
	h2 := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		mu.Lock()
		seen2 = append(seen2, string(rec.Key))
		mu.Unlock()
		_, err := tx.ExecContext(ctx, "INSERT INTO effects (event_key) VALUES (?)", string(rec.Key))
		return err
	}
	r2, err := inbox.NewRunner(e.db, e.settings(), h2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, stop2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- r2.Run(ctx2) }()
	eventually(t, "5 effects", func() bool { return e.count(t, "SELECT COUNT(*) FROM effects") == 5 })
	eventually(t, "offset 5 committed", func() bool { return committed(t, adm, group, e.topic) == 5 })
	stop2()
	if err := <-done2; err != nil {
		t.Fatalf("run 2: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(seen2, ",") != "order-3,order-4" {
		t.Errorf("second runner processed %v, want order-3,order-4", seen2)
	}
	if n := e.count(t, "SELECT COUNT(DISTINCT event_key) FROM effects"); n != 5 {
		t.Errorf("distinct effects: %d", n)
	}
}

func TestRunnerDeadLettersAndMovesOn(t *testing.T) {
	e := newEnv(t, 2)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	manual := newClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produce(t, manual, e.topic, 0, 0, 3)
	produce(t, manual, e.topic, 1, 3, 6)
	// A record without event_key, and a poison one, on partition 1.
	ctx := context.Background()
	if err := manual.ProduceSync(ctx,
		&kgo.Record{Topic: e.topic, Partition: 1, Key: []byte("order-x"), Value: []byte("{}")},
		&kgo.Record{Topic: e.topic, Partition: 1, Key: []byte("order-p"), Value: []byte("{}"),
			Headers: []kgo.RecordHeader{{Key: "event_key", Value: []byte("e-p")}}},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	produce(t, manual, e.topic, 1, 6, 8)

	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	poisonAware := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		if string(rec.Key) == "order-p" {
			return errors.New("poison record")
		}
		return h(ctx, tx, rec)
	}
	r, err := inbox.NewRunner(e.db, e.settings(), poisonAware, inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	eventually(t, "8 effects", func() bool { return e.count(t, "SELECT COUNT(*) FROM effects") == 8 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	dls := e.readDLQ(t, 2)
	if hdr(dls[0], "dlq_reason") != "missing event_key header" || hdr(dls[1], "dlq_reason") != "poison record" ||
		hdr(dls[1], "dlq_attempts") != "3" || hdr(dls[1], "dlq_partition") != "1" {
		t.Errorf("dead letters: %v / %v", dls[0].Headers, dls[1].Headers)
	}
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[int32]int64{0: 3, 1: 7} {
		if o, _ := offs.Lookup(e.topic, p); o.At != want {
			t.Errorf("partition %d committed %d, want %d", p, o.At, want)
		}
	}
}

func TestRunnerCreatesAMissingDeadLetterTopic(t *testing.T) {
	e := newEnv(t, 1)
	// A dead-letter topic nobody created.
	e.dlq = "inbox-go-fresh-dlq-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), e.dlq) })
	group := "inbox-go-group-" + randSuffix()
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	ctx := context.Background()
	if err := e.producer.ProduceSync(ctx,
		&kgo.Record{Topic: e.topic, Key: []byte("order-x"), Value: []byte("{}")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r, err := inbox.NewRunner(e.db, e.settings(), effectHandler(&atomic.Int32{}, nil), inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	dls := e.readDLQ(t, 1)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if hdr(dls[0], "dlq_reason") != "missing event_key header" {
		t.Errorf("dead letter: %v", dls[0].Headers)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the dead letter took %v", d)
	}
}

func TestRunnerRefusesADeadLetterTopicTheBrokerWillNotCreate(t *testing.T) {
	e := newEnv(t, 1)
	s := e.settings()
	s.DeadLetterTopic = "inbox-go-bad/dlq-" + randSuffix() // '/' is not allowed in a topic name
	_, err := inbox.NewRunner(e.db, s, effectHandler(&atomic.Int32{}, nil), inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}})
	if err == nil {
		t.Fatal("NewRunner accepted a dead-letter topic the broker cannot create")
	}
	if !strings.Contains(err.Error(), s.DeadLetterTopic) || !strings.Contains(err.Error(), "kafka-topics.sh --create") {
		t.Errorf("error does not name the topic and the fix: %v", err)
	}
}
