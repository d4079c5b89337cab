package inbox_test

// Batch mode (inbox/CONTRACT.md, "Batch mode") against real MariaDB and MySQL 8.0 servers and
// Kafka: the MariaDB server of the suite (INBOX_TEST_DB_PORT) and MySQL 8.0
// (INBOX_TEST_MYSQL_PORT, default 3326); a test fails when it cannot connect.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

var batchServers = []string{serverMariaDB, serverMySQL}

// newEnvOn is newEnv with the database on server.
func newEnvOn(t *testing.T, server string, partitions int32, params map[string]string) *env {
	t.Helper()
	s := randSuffix()
	e := &env{db: newDBOn(t, server, params), producer: newClient(t), topic: "inbox-go-in-" + s, dlq: "inbox-go-dlq-" + s}
	newTopics(t, partitions, e.topic, e.dlq)
	return e
}

// batchRecords builds records e-from .. e-(to-1) at offsets from .. to-1 (key order-i).
func (e *env) batchRecords(from, to int) []*kgo.Record {
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		recs = append(recs, e.record(int64(i), fmt.Sprintf("order-%d", i), "event_key", fmt.Sprintf("e-%d", i)))
	}
	return recs
}

func outcomes(res []inbox.Result) string {
	var out []string
	for _, r := range res {
		out = append(out, fmt.Sprintf("%s/%d", r.Outcome, r.Attempts))
	}
	return strings.Join(out, ",")
}

func repeatOutcome(o string, n int) string {
	return strings.TrimSuffix(strings.Repeat(o+",", n), ",")
}

func mustBatch(t *testing.T, in *inbox.Inbox, recs []*kgo.Record, h inbox.Handler) []inbox.Result {
	t.Helper()
	res, err := in.ProcessBatch(context.Background(), recs, h)
	if err != nil {
		t.Fatalf("ProcessBatch: %v", err)
	}
	if len(res) != len(recs) {
		t.Fatalf("%d results for %d records", len(res), len(recs))
	}
	return res
}

// counter reads one series of a counter from reg (-1: not there).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// inboxRow is an inbox row as the single path writes it.
type inboxRow struct {
	consumer, eventKey, topic string
	partition, offset         int64
	processedSet              bool
}

func (e *env) inboxRows(t *testing.T) map[string]inboxRow {
	t.Helper()
	rows, err := e.db.Query("SELECT consumer, event_key, topic, kafka_partition, kafka_offset, processed_at IS NOT NULL FROM outbox_inbox")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rows.Close() }()
	out := map[string]inboxRow{}
	for rows.Next() {
		var r inboxRow
		if err := rows.Scan(&r.consumer, &r.eventKey, &r.topic, &r.partition, &r.offset, &r.processedSet); err != nil {
			t.Fatal(err)
		}
		out[r.eventKey] = r
	}
	return out
}

// (a) 50 new records in one batch: 50 effects, 50 inbox rows with the single path's columns,
// outcomes processed in input order, hooks and metrics per record.
func TestBatchOfNewRecords(t *testing.T) {
	for _, server := range batchServers {
		t.Run(server, func(t *testing.T) {
			e := newEnvOn(t, server, 1, nil)
			var log settledLog
			var before []string
			reg := prometheus.NewRegistry()
			s := e.settings()
			s.Registerer = reg
			s.Hooks.AfterCommit = log.hook
			s.Hooks.BeforeCommit = func(rec *kgo.Record) { before = append(before, hdr(rec, "event_key")) }
			in := e.newInbox(t, s)
			var calls atomic.Int32
			recs := e.batchRecords(0, 50)
			// The reference: one record through the single path.
			single := e.record(50, "order-50", "event_key", "e-50")
			mustProcess(t, in, single, effectHandler(&calls, nil), inbox.Processed)
			res := mustBatch(t, in, recs, effectHandler(&calls, nil))
			if got, want := outcomes(res), repeatOutcome("processed/1", 50); got != want {
				t.Errorf("outcomes %s", got)
			}
			e.effectsOnce(t, 51)
			rows := e.inboxRows(t)
			if len(rows) != 51 {
				t.Fatalf("%d inbox rows, want 51", len(rows))
			}
			ref := rows["e-50"]
			for i := range 50 {
				r := rows[fmt.Sprintf("e-%d", i)]
				want := inboxRow{ref.consumer, fmt.Sprintf("e-%d", i), ref.topic, ref.partition, int64(i), true}
				if r != want {
					t.Errorf("inbox row %+v, want %+v", r, want)
				}
			}
			var wantLog, wantBefore []string
			for i := range 50 {
				wantLog = append(wantLog, fmt.Sprintf("e-%d:processed@%d", i, i))
				wantBefore = append(wantBefore, fmt.Sprintf("e-%d", i))
			}
			if got := log.String(); got != "e-50:processed@50,"+strings.Join(wantLog, ",") {
				t.Errorf("AfterCommit: %s", got)
			}
			if got := strings.Join(before, ","); got != "e-50,"+strings.Join(wantBefore, ",") {
				t.Errorf("BeforeCommit: %s", got)
			}
			if n := counter(t, reg, "outbox_inbox_records_total", map[string]string{"outcome": "processed", "topic": e.topic}); n != 51 {
				t.Errorf("outbox_inbox_records_total{outcome=processed}: %v, want 51", n)
			}
		})
	}
}

// (b) A key already in the inbox and a key twice in the batch: duplicates, one effect per
// distinct key, the handler never run for a duplicate.
func TestBatchDuplicates(t *testing.T) {
	for _, server := range batchServers {
		t.Run(server, func(t *testing.T) {
			e := newEnvOn(t, server, 1, nil)
			var log settledLog
			s := e.settings()
			s.Hooks.AfterCommit = log.hook
			in := e.newInbox(t, s)
			var calls atomic.Int32
			h := effectHandler(&calls, nil)
			mustProcess(t, in, e.record(0, "order-0", "event_key", "e-0"), h, inbox.Processed)
			recs := []*kgo.Record{
				e.record(1, "order-0", "event_key", "e-0"), // in the inbox already
				e.record(2, "order-1", "event_key", "e-1"),
				e.record(3, "order-2", "event_key", "e-2"),
				e.record(4, "order-1", "event_key", "e-1"), // twice in the batch
				e.record(5, "order-3", "event_key", "E-1"), // another key (bytes differ)
			}
			res := mustBatch(t, in, recs, h)
			if got := outcomes(res); got != "duplicate/1,processed/1,processed/1,duplicate/1,processed/1" {
				t.Errorf("outcomes %s", got)
			}
			for _, k := range []string{"e-0", "e-1", "e-2", "E-1"} {
				// effects.event_key is text (case-insensitive): compare the bytes.
				if n := e.count(t, "SELECT COUNT(*) FROM effects WHERE BINARY event_key = ?", k); n != 1 {
					t.Errorf("%s: %d effects, want 1", k, n)
				}
			}
			if n := calls.Load(); n != 4 {
				t.Errorf("handler ran %d times, want 4", n)
			}
			if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox"); n != 4 {
				t.Errorf("%d inbox rows, want 4", n)
			}
			if n := e.count(t, "SELECT kafka_offset FROM outbox_inbox WHERE event_key = 'e-1'"); n != 2 {
				t.Errorf("e-1's inbox row at offset %d, want 2 (the first occurrence)", n)
			}
			if got := log.String(); !strings.Contains(got, "e-1:duplicate@4") || !strings.Contains(got, "e-0:duplicate@1") {
				t.Errorf("AfterCommit: %s", got)
			}
		})
	}
}

// (c) A poison record in the middle (max_attempts 2): the records before and after it are
// processed once (the rolled-back batch left nothing), it is dead-lettered with dlq_attempts 2.
func TestBatchHandlerErrorInTheMiddle(t *testing.T) {
	for _, server := range batchServers {
		t.Run(server, func(t *testing.T) {
			e := newEnvOn(t, server, 1, nil)
			s := e.settings()
			s.MaxAttempts = 2
			in := e.newInbox(t, s)
			var calls atomic.Int32
			var poisonRuns atomic.Int32
			base := effectHandler(&calls, nil)
			h := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
				if err := base(ctx, tx, rec); err != nil {
					return err
				}
				if hdr(rec, "event_key") == "e-4" {
					poisonRuns.Add(1)
					return fmt.Errorf("poison record")
				}
				return nil
			}
			recs := e.batchRecords(0, 9)
			res := mustBatch(t, in, recs, h)
			want := repeatOutcome("processed/1", 4) + ",dead_lettered/2," + repeatOutcome("processed/1", 4)
			if got := outcomes(res); got != want {
				t.Errorf("outcomes %s, want %s", got, want)
			}
			for i := range 9 {
				k, wantN := fmt.Sprintf("e-%d", i), 1
				if i == 4 {
					wantN = 0
				}
				if n := e.effects(t, k); n != wantN {
					t.Errorf("%s: %d effects, want %d", k, n, wantN)
				}
			}
			if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE event_key = 'e-4'"); n != 0 {
				t.Errorf("the poison record has an inbox row")
			}
			// The failed batch run is its first attempt: max_attempts runs in all.
			if n := poisonRuns.Load(); n != 2 {
				t.Errorf("the poison record's handler ran %d times, want 2", n)
			}
			dl := e.readDLQ(t, 1)[0]
			if hdr(dl, "event_key") != "e-4" || hdr(dl, "dlq_attempts") != "2" || hdr(dl, "dlq_reason") != "poison record" ||
				hdr(dl, "dlq_offset") != "4" || hdr(dl, "dlq_topic") != e.topic {
				t.Errorf("dead letter headers %v", dl.Headers)
			}
		})
	}
}

// (d) Versions: one aggregate's v1, v2, v4, v3 and another's stale version in one batch: v4
// parked in the batch, then resumed after it; stored version 4, no parked row left.
func TestBatchVersions(t *testing.T) {
	for _, server := range batchServers {
		t.Run(server, func(t *testing.T) {
			e := newEnvOn(t, server, 1, nil)
			var log settledLog
			in := e.newInbox(t, e.parkedSettings(&log))
			var calls atomic.Int32
			h := effectHandler(&calls, nil)
			mustProcess(t, in, versioned(e, 0, "B", "b-5", "5"), h, inbox.Processed)
			recs := []*kgo.Record{
				versioned(e, 1, "A", "a-1", "1"),
				versioned(e, 2, "A", "a-2", "2"),
				versioned(e, 3, "A", "a-4", "4"),
				versioned(e, 4, "A", "a-3", "3"),
				versioned(e, 5, "B", "b-3", "3"),
			}
			res := mustBatch(t, in, recs, h)
			if got := outcomes(res); got != "processed/1,processed/1,parked/1,processed/1,stale/1" {
				t.Errorf("outcomes %s", got)
			}
			if res[2].Reason != "version gap: expected 3, got 4" {
				t.Errorf("parked reason %q", res[2].Reason)
			}
			if got := log.String(); got != "b-5:processed@0,a-1:processed@1,a-2:processed@2,a-4:parked@3,a-3:processed@4,b-3:stale@5,a-4:resumed@3" {
				t.Errorf("AfterCommit: %s", got)
			}
			if v := e.storedVersion(t, "A"); v != 4 {
				t.Errorf("stored version of A: %d, want 4", v)
			}
			if v := e.storedVersion(t, "B"); v != 5 {
				t.Errorf("stored version of B: %d, want 5", v)
			}
			if n := e.parked(t); n != 0 {
				t.Errorf("%d parked rows left", n)
			}
			for _, k := range []string{"a-1", "a-2", "a-3", "a-4", "b-5"} {
				if n := e.effects(t, k); n != 1 {
					t.Errorf("%s: %d effects, want 1", k, n)
				}
			}
			if n := e.effects(t, "b-3"); n != 0 {
				t.Errorf("the stale record ran")
			}
			// The stale record's inbox row stays (a redelivery is a duplicate); the resumed one
			// names the parked record's place.
			if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE event_key = 'b-3'"); n != 1 {
				t.Errorf("stale record: %d inbox rows, want 1", n)
			}
			if n := e.count(t, "SELECT kafka_offset FROM outbox_inbox WHERE event_key = 'a-4'"); n != 3 {
				t.Errorf("resumed record's inbox row at offset %d, want 3", n)
			}
		})
	}
}

// (e) The MySQL race: under READ COMMITTED another transaction inserts the inbox row of one key
// of the batch between the SELECT ... FOR UPDATE and the INSERT: the INSERT fails with 1062, the
// batch is redone and the key is a duplicate. On MariaDB the same insert before the INSERT
// IGNORE ... RETURNING: the key is not returned, a duplicate.
func TestBatchRaceWithAnotherInserter(t *testing.T) {
	for _, server := range batchServers {
		t.Run(server, func(t *testing.T) {
			var params map[string]string
			if server == serverMySQL {
				params = map[string]string{"transaction_isolation": "'READ-COMMITTED'"}
			}
			e := newEnvOn(t, server, 1, params)
			if server == serverMySQL {
				var iso string
				if err := e.db.QueryRow("SELECT @@transaction_isolation").Scan(&iso); err != nil || iso != "READ-COMMITTED" {
					t.Fatalf("isolation %q, %v", iso, err)
				}
			}
			in := e.newInbox(t, e.settings())
			other, err := sql.Open("mysql", dbConfigOn(server, "").FormatDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = other.Close() })
			var dbName string
			if err := e.db.QueryRow("SELECT DATABASE()").Scan(&dbName); err != nil {
				t.Fatal(err)
			}
			var hookRuns atomic.Int32
			inbox.SetTestHookAfterBatchSelect(func() {
				if hookRuns.Add(1) != 1 {
					return
				}
				if _, err := other.Exec("INSERT INTO " + dbName + ".outbox_inbox (consumer, event_key, topic, kafka_partition, kafka_offset) VALUES ('test-consumer', 'e-2', 'elsewhere', 0, 0)"); err != nil {
					t.Errorf("the other transaction: %v", err)
				}
			})
			t.Cleanup(func() { inbox.SetTestHookAfterBatchSelect(nil) })
			var calls atomic.Int32
			res := mustBatch(t, in, e.batchRecords(0, 5), effectHandler(&calls, nil))
			if got := outcomes(res); got != "processed/1,processed/1,duplicate/1,processed/1,processed/1" {
				t.Errorf("outcomes %s", got)
			}
			wantRuns := int32(1)
			if server == serverMySQL {
				wantRuns = 2 // the INSERT met the row: rolled back and redone
			}
			if n := hookRuns.Load(); n != wantRuns {
				t.Errorf("the batch's statements ran %d times, want %d", n, wantRuns)
			}
			if n := e.effects(t, "e-2"); n != 0 {
				t.Errorf("e-2: %d effects, want 0", n)
			}
			for _, k := range []string{"e-0", "e-1", "e-3", "e-4"} {
				if n := e.effects(t, k); n != 1 {
					t.Errorf("%s: %d effects, want 1", k, n)
				}
			}
			if n := calls.Load(); n != 4 {
				t.Errorf("handler ran %d times, want 4", n)
			}
		})
	}
}

// (f) An infrastructure error mid-batch: the 3rd record's handler has its own connection killed
// once: the whole batch is redone, every record processed once with attempts 1.
func TestBatchInfrastructureErrorRedoesTheBatch(t *testing.T) {
	for _, server := range batchServers {
		t.Run(server, func(t *testing.T) {
			e := newEnvOn(t, server, 1, nil)
			in := e.newInbox(t, e.settings())
			var calls atomic.Int32
			base := effectHandler(&calls, nil)
			var killed atomic.Bool
			var handlerErr error
			h := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
				if hdr(rec, "event_key") == "e-2" && killed.CompareAndSwap(false, true) {
					var id int64
					if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
						return err
					}
					if _, err := e.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
						t.Errorf("kill: %v", err)
					}
					err := base(ctx, tx, rec)
					handlerErr = err
					return err
				}
				return base(ctx, tx, rec)
			}
			res := mustBatch(t, in, e.batchRecords(0, 6), h)
			if got, want := outcomes(res), repeatOutcome("processed/1", 6); got != want {
				t.Errorf("outcomes %s", got)
			}
			if handlerErr == nil || !inbox.IsInfrastructureError(handlerErr) {
				t.Errorf("the killed connection's error %v is not an infrastructure error", handlerErr)
			}
			e.effectsOnce(t, 6)
			// e-0, e-1, e-2 ran twice (the first batch was rolled back), e-3 .. e-5 once.
			if n := calls.Load(); n != 9 {
				t.Errorf("handler ran %d times, want 9", n)
			}
			if !e.dlqEmpty(t) {
				t.Error("a dead letter was produced")
			}
		})
	}
}

// (g) The runner with BatchMaxRecords 100 over real Kafka: 500 records, 500 effects, offsets
// committed to the end; the records were settled in batches (handlers sharing transactions).
func TestRunnerBatchMode(t *testing.T) {
	for _, server := range batchServers {
		t.Run(server, func(t *testing.T) {
			e := newEnvOn(t, server, 1, nil)
			group := "inbox-go-group-" + randSuffix()
			adm := kadm.NewClient(newClient(t))
			t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
			produce(t, e.producer, e.topic, 0, 0, 500)
			s := e.settings()
			s.BatchMaxRecords = 100
			var mu sync.Mutex
			perTx := map[*sql.Tx]int{}
			var calls atomic.Int32
			base := effectHandler(&calls, nil)
			h := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
				mu.Lock()
				perTx[tx]++
				mu.Unlock()
				return base(ctx, tx, rec)
			}
			stop, done := startRunner(t, e.db, s, h, inbox.RunnerConfig{
				Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
			eventually(t, "500 effects", func() bool { return e.count(t, "SELECT COUNT(*) FROM effects") == 500 })
			eventually(t, "offset 500 committed", func() bool { return committed(t, adm, group, e.topic) == 500 })
			stop()
			if err := <-done; err != nil {
				t.Fatalf("run: %v", err)
			}
			e.effectsOnce(t, 500)
			mu.Lock()
			defer mu.Unlock()
			biggest := 0
			for _, n := range perTx {
				biggest = max(biggest, n)
			}
			if biggest < 2 || biggest > 100 || len(perTx) > 500 {
				t.Errorf("%d transactions, the largest with %d records: want batches of 2 .. 100", len(perTx), biggest)
			}
		})
	}
}

// (h) The batch settings: 1 ..= 10000 (0 is the Go zero value: the default 1), BatchMaxWait
// not negative (0: the default 20 ms).
func TestBatchSettings(t *testing.T) {
	db := &sql.DB{}
	p := &kgo.Client{}
	base := inbox.Settings{Consumer: "c", DeadLetterTopic: "d"}
	for _, n := range []int{-1, 10001} {
		s := base
		s.BatchMaxRecords = n
		_, err := inbox.New(db, p, s)
		want := fmt.Sprintf("inbox: Settings.BatchMaxRecords = %d is out of range (allowed 1 ..= 10000; 1: batch mode off)", n)
		if err == nil || err.Error() != want {
			t.Errorf("BatchMaxRecords %d: %v, want %q", n, err, want)
		}
	}
	for _, n := range []int{1, 2, 10000} {
		s := base
		s.BatchMaxRecords = n
		in, err := inbox.New(db, p, s)
		if err != nil || in.Settings().BatchMaxRecords != n {
			t.Errorf("BatchMaxRecords %d: %v", n, err)
		}
	}
	in, err := inbox.New(db, p, base)
	if err != nil || in.Settings().BatchMaxRecords != 1 || in.Settings().BatchMaxWait != 20*time.Millisecond {
		t.Errorf("defaults: %+v, %v", in.Settings(), err)
	}
	s := base
	s.BatchMaxWait = -time.Millisecond
	if _, err := inbox.New(db, p, s); err == nil || !strings.Contains(err.Error(), "BatchMaxWait = -1ms must not be negative") {
		t.Errorf("negative BatchMaxWait: %v", err)
	}
}

// (i) In batch mode a retry copy goes alone through the single path: its handler's transaction
// is not shared with any other record, while the ordinary records are batched.
func TestRunnerBatchModeRetryCopyGoesAlone(t *testing.T) {
	e := newEnv(t, 1)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	tier1 := e.topic + ".retry.1"
	deleteTopicsAtEnd(t, tier1)
	produce(t, e.producer, e.topic, 0, 0, 10) // e-3 fails until tier 1
	var log settledLog
	s := e.settings()
	s.MaxAttempts = 1
	s.BatchMaxRecords = 50
	s.RetryTiers = []time.Duration{300 * time.Millisecond}
	s.Hooks.AfterCommit = log.hook
	var mu sync.Mutex
	perTx := map[*sql.Tx][]string{}
	base := tierFailing(func(rec *kgo.Record) int {
		if hdr(rec, "event_key") == "e-3" {
			return 1
		}
		return 0
	}, nil)
	h := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		mu.Lock()
		perTx[tx] = append(perTx[tx], fmt.Sprintf("%s@%s", hdr(rec, "event_key"), rec.Topic))
		mu.Unlock()
		return base(ctx, tx, rec)
	}
	stop, done := startRunner(t, e.db, s, h, inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
	eventually(t, "e-3 processed from tier 1", func() bool { return strings.Contains(log.String(), "e-3:processed@0") })
	// More ordinary records while the copy may still be in a poll with them.
	produce(t, e.producer, e.topic, 0, 10, 20)
	eventually(t, "20 effects", func() bool { return e.count(t, "SELECT COUNT(*) FROM effects") == 20 })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	e.effectsOnce(t, 20)
	mu.Lock()
	defer mu.Unlock()
	shared := false
	for _, recs := range perTx {
		for _, r := range recs {
			if strings.HasSuffix(r, "@"+tier1) && len(recs) != 1 {
				t.Errorf("the retry copy shared its transaction: %v", recs)
			}
		}
		shared = shared || len(recs) > 1
	}
	if !shared {
		t.Error("no two ordinary records shared a transaction: batch mode was off")
	}
	if got := log.String(); !strings.Contains(got, "e-3:retried@3") {
		t.Errorf("settled: %s", got)
	}
}

// Step 1: a record without event_key, one with an invalid version and one with an event_key over
// the column's 1020 bytes get exactly the single path's outcomes and dead letters; the others
// of the batch are processed.
func TestBatchPreSettlement(t *testing.T) {
	for _, server := range batchServers {
		t.Run(server, func(t *testing.T) {
			e := newEnvOn(t, server, 1, nil)
			s := e.settings()
			s.VersionHeader = "version"
			in := e.newInbox(t, s)
			var calls atomic.Int32
			long := strings.Repeat("k", 1021)
			recs := []*kgo.Record{
				e.record(0, "order-0", "event_key", "e-0"),
				e.record(1, "order-1"), // no event_key
				e.record(2, "order-2", "event_key", "e-2", "aggregate_type", "order", "version", "x"),
				e.record(3, "order-3", "event_key", long),
				e.record(4, "order-4", "event_key", "e-4"),
			}
			res := mustBatch(t, in, recs, effectHandler(&calls, nil))
			if got := outcomes(res); got != "processed/1,dead_lettered/0,dead_lettered/0,dead_lettered/3,processed/1" {
				t.Errorf("outcomes %s", got)
			}
			if res[1].Reason != "missing event_key header" || res[2].Reason != "invalid version header: x" ||
				!strings.Contains(res[3].Reason, "Data too long") {
				t.Errorf("reasons %q, %q, %q", res[1].Reason, res[2].Reason, res[3].Reason)
			}
			dls := e.readDLQ(t, 3)
			var got []string
			for _, dl := range dls {
				got = append(got, hdr(dl, "dlq_offset")+":"+hdr(dl, "dlq_attempts"))
			}
			if strings.Join(got, ",") != "1:0,2:0,3:3" {
				t.Errorf("dead letters (offset:attempts) %v", got)
			}
			if n := e.count(t, "SELECT COUNT(*) FROM effects"); n != 2 {
				t.Errorf("%d effects, want 2", n)
			}
		})
	}
}

// MySQL: a batch that keeps meeting rows inserted by others after its SELECT is redone at once
// 5 times in a row, then after the backoff (as after an infrastructure error); every key found
// is a duplicate, never ignored.
func TestBatchRaceRedosAreBounded(t *testing.T) {
	e := newEnvOn(t, serverMySQL, 1, map[string]string{"transaction_isolation": "'READ-COMMITTED'"})
	s := e.settings()
	s.BackoffInitial = 300 * time.Millisecond
	s.BackoffMax = time.Second
	in := e.newInbox(t, s)
	other, err := sql.Open("mysql", dbConfigOn(serverMySQL, "").FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	var dbName string
	if err := e.db.QueryRow("SELECT DATABASE()").Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	var seventh time.Time
	inbox.SetTestHookAfterBatchSelect(func() {
		n := runs.Add(1)
		if n == 7 {
			seventh = time.Now()
		}
		if n <= 7 { // the first 7 runs meet a new row each
			if _, err := other.Exec(fmt.Sprintf("INSERT INTO %s.outbox_inbox (consumer, event_key, topic, kafka_partition, kafka_offset) VALUES ('test-consumer', 'e-%d', 'elsewhere', 0, 0)", dbName, n-1)); err != nil {
				t.Errorf("the other transaction: %v", err)
			}
		}
	})
	t.Cleanup(func() { inbox.SetTestHookAfterBatchSelect(nil) })
	var calls atomic.Int32
	start := time.Now()
	res := mustBatch(t, in, e.batchRecords(0, 8), effectHandler(&calls, nil))
	if got := outcomes(res); got != repeatOutcome("duplicate/1", 7)+",processed/1" {
		t.Errorf("outcomes %s", got)
	}
	if n := runs.Load(); n != 8 {
		t.Errorf("%d runs, want 8", n)
	}
	// Runs 1-6 back to back, then the backoff before run 7.
	if d := seventh.Sub(start); d < 300*time.Millisecond {
		t.Errorf("run 7 came %v after the start: want the backoff (300 ms) after 6 races", d)
	}
	if n := e.count(t, "SELECT COUNT(*) FROM effects"); n != 1 || calls.Load() != 1 {
		t.Errorf("%d effects, handler ran %d times; want 1, 1", n, calls.Load())
	}
}
