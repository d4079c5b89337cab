package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

// readTopic reads topic from the start until it holds n records.
func readTopic(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		f := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s: %d records, want %d", topic, len(recs), n)
		}
		recs = append(recs, f.Records()...)
	}
	return recs
}

// endOffset is the end offset of partition p of topic.
func endOffset(t *testing.T, topic string, p int32) int64 {
	t.Helper()
	adm := kadm.NewClient(newClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := ends.Lookup(topic, p)
	if !ok || o.Err != nil {
		t.Fatalf("end offset of %s/%d: %v", topic, p, o.Err)
	}
	return o.Offset
}

// deleteTopicsAtEnd deletes the topics the runner created (the tier topics).
func deleteTopicsAtEnd(t *testing.T, names ...string) {
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, names...)
	})
}

// tierFailing is the scenario handler's fail_until_tier: it writes an effect, then fails while
// the record's retry tier is < until(rec) ("failing until tier N"). at records when each
// event_key last ran.
func tierFailing(until func(rec *kgo.Record) int, at *sync.Map) inbox.Handler {
	h := effectHandler(new(atomic.Int32), nil)
	return func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		if at != nil {
			at.Store(hdr(rec, "event_key"), time.Now())
		}
		if err := h(ctx, tx, rec); err != nil {
			return err
		}
		if n := until(rec); inbox.RetryTier(rec) < n {
			return fmt.Errorf("failing until tier %d", n)
		}
		return nil
	}
}

func history(t *testing.T, rec *kgo.Record) []map[string]any {
	t.Helper()
	var h []map[string]any
	if err := json.Unmarshal([]byte(hdr(rec, "retry_history")), &h); err != nil {
		t.Fatalf("retry_history %q: %v", hdr(rec, "retry_history"), err)
	}
	return h
}

func msHeader(t *testing.T, rec *kgo.Record, name string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(hdr(rec, name), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// A record fails its 3 attempts in the main topic, goes to tier 1 as a copy, and succeeds
// there once the tier's delay has passed: one effect, the inbox row names the original record.
func TestRetryTierThenSuccess(t *testing.T) {
	e := newEnv(t, 1)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	produce(t, e.producer, e.topic, 0, 0, 2) // e-0 processed, e-1 fails until tier 1
	var log settledLog
	s := e.settings()
	s.RetryTiers = []time.Duration{500 * time.Millisecond, time.Hour}
	s.Hooks.AfterCommit = log.hook
	tier1 := e.topic + ".retry.1"
	deleteTopicsAtEnd(t, tier1, e.topic+".retry.2")
	var ran sync.Map
	h := tierFailing(func(rec *kgo.Record) int {
		if hdr(rec, "event_key") == "e-1" {
			return 1
		}
		return 0
	}, &ran)
	stop, done := startRunner(t, e.db, s, h, inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
	eventually(t, "e-1 processed from tier 1", func() bool { return strings.Contains(log.String(), "e-1:processed@0") })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if got := log.String(); got != "e-0:processed@0,e-1:retried@1,e-1:processed@0" {
		t.Errorf("settled: %s", got)
	}
	e.effectsOnce(t, 2)
	cp := readTopic(t, tier1, 1)[0]
	if string(cp.Key) != "order-1" || string(cp.Value) != `{"order_id":"x"}` || hdr(cp, "event_key") != "e-1" ||
		hdr(cp, "retry_count") != "1" || hdr(cp, "original_topic") != e.topic ||
		hdr(cp, "original_partition") != "0" || hdr(cp, "original_offset") != "1" ||
		hdr(cp, "retry_error") != "failing until tier 1" {
		t.Errorf("copy: key %s, headers %v", cp.Key, cp.Headers)
	}
	hist := history(t, cp)
	if len(hist) != 1 || hist[0]["topic"] != e.topic || hist[0]["partition"] != 0.0 || hist[0]["offset"] != 1.0 ||
		hist[0]["attempts"] != 3.0 || hist[0]["error"] != "failing until tier 1" {
		t.Errorf("retry_history: %v", hist)
	}
	failedAt, retryAt := int64(hist[0]["failed_at"].(float64)), msHeader(t, cp, "retry_at")
	if retryAt-failedAt < 500 || retryAt-failedAt > 2000 {
		t.Errorf("retry_at %d, failed at %d: want about 500 ms later", retryAt, failedAt)
	}
	if last, _ := ran.Load("e-1"); last.(time.Time).Before(time.UnixMilli(retryAt)) {
		t.Errorf("the copy ran at %v, before its retry_at %v", last, time.UnixMilli(retryAt))
	}
	var topic string
	var partition, offset int64
	if err := e.db.QueryRow("SELECT topic, kafka_partition, kafka_offset FROM outbox_inbox WHERE event_key = 'e-1'").
		Scan(&topic, &partition, &offset); err != nil {
		t.Fatal(err)
	}
	if topic != e.topic || partition != 0 || offset != 1 {
		t.Errorf("inbox row: %s/%d@%d, want the original %s/0@1", topic, partition, offset, e.topic)
	}
	if !e.dlqEmpty(t) {
		t.Error("a dead letter was produced")
	}
}

// A record that keeps failing goes through both tiers, then to the dead-letter topic with its
// history; the dead letter names the original record.
func TestRetryTiersExhaustedToDeadLetter(t *testing.T) {
	e := newEnv(t, 1)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	produce(t, e.producer, e.topic, 0, 0, 3) // e-1 always fails
	var log settledLog
	s := e.settings()
	s.RetryTiers = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
	s.RetryTopicFormat = "{topic}-tier{n}"
	s.Hooks.AfterCommit = log.hook
	deleteTopicsAtEnd(t, e.topic+"-tier1", e.topic+"-tier2")
	h := tierFailing(func(rec *kgo.Record) int {
		if hdr(rec, "event_key") == "e-1" {
			return 99
		}
		return 0
	}, nil)
	stop, done := startRunner(t, e.db, s, h, inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
	dl := readTopic(t, e.dlq, 1)[0]
	eventually(t, "e-1 dead-lettered", func() bool { return strings.Contains(log.String(), "e-1:dead_lettered") })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if got := log.String(); got != "e-0:processed@0,e-1:retried@1,e-2:processed@2,e-1:retried@0,e-1:dead_lettered@0" {
		t.Errorf("settled: %s", got)
	}
	if hdr(dl, "retry_count") != "2" || hdr(dl, "dlq_topic") != e.topic || hdr(dl, "dlq_partition") != "0" ||
		hdr(dl, "dlq_offset") != "1" || hdr(dl, "dlq_attempts") != "3" || hdr(dl, "dlq_reason") != "failing until tier 99" ||
		hdr(dl, "original_topic") != e.topic || hdr(dl, "original_offset") != "1" || hdr(dl, "event_key") != "e-1" {
		t.Errorf("dead letter: %v", dl.Headers)
	}
	hist := history(t, dl)
	if len(hist) != 2 || hist[0]["topic"] != e.topic || hist[0]["offset"] != 1.0 ||
		hist[1]["topic"] != e.topic+"-tier1" || hist[1]["offset"] != 0.0 || hist[1]["attempts"] != 3.0 {
		t.Errorf("retry_history: %v", hist)
	}
	if n := e.effects(t, "e-1"); n != 0 {
		t.Errorf("e-1: %d effects, want 0", n)
	}
	if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE event_key = 'e-1'"); n != 0 {
		t.Errorf("e-1: %d inbox rows, want 0", n)
	}
}

// A copy whose retry_at has not come pauses its partition (the copies behind it wait too, their
// offsets are not committed) while the other partitions and topics go on.
func TestCopyWaitsForItsRetryAt(t *testing.T) {
	e := newEnv(t, 1)
	tier1 := e.topic + ".retry.1"
	newTopics(t, 2, tier1)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	due := time.Now().Add(4 * time.Second)
	copyRec := func(p int32, key string, at time.Time) *kgo.Record {
		return &kgo.Record{Topic: tier1, Partition: p, Key: []byte("order-" + key), Value: []byte("{}"), Headers: []kgo.RecordHeader{
			{Key: "event_key", Value: []byte(key)}, {Key: "retry_count", Value: []byte("1")},
			{Key: "retry_at", Value: []byte(strconv.FormatInt(at.UnixMilli(), 10))},
			{Key: "original_topic", Value: []byte(e.topic)}, {Key: "original_partition", Value: []byte("0")},
			{Key: "original_offset", Value: []byte("7")}}}
	}
	manual := newClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := manual.ProduceSync(context.Background(),
		copyRec(0, "c-late", due), copyRec(0, "c-behind", due),
		copyRec(1, "c-due", time.Now().Add(-time.Second))).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var log settledLog
	s := e.settings()
	s.RetryTiers = []time.Duration{time.Minute}
	s.Hooks.AfterCommit = log.hook
	var ran sync.Map
	stop, done := startRunner(t, e.db, s, tierFailing(func(*kgo.Record) int { return 0 }, &ran), inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
	produce(t, e.producer, e.topic, 0, 0, 1)
	eventually(t, "c-due and e-0 processed", func() bool {
		l := log.String()
		return strings.Contains(l, "c-due:processed") && strings.Contains(l, "e-0:processed")
	})
	if time.Now().Before(due) {
		if l := log.String(); strings.Contains(l, "c-late") || strings.Contains(l, "c-behind") {
			t.Errorf("a copy was processed before its retry_at: %s", l)
		}
		if o, _ := func() (kadm.OffsetResponse, bool) {
			offs, err := adm.FetchOffsets(context.Background(), group)
			if err != nil {
				t.Fatal(err)
			}
			return offs.Lookup(tier1, 0)
		}(); o.At > 0 {
			t.Errorf("%s/0 committed at %d while its copy waits", tier1, o.At)
		}
	} else {
		t.Log("the other records took longer than the wait: pause not observed")
	}
	eventually(t, "the late copies processed", func() bool { return strings.Contains(log.String(), "c-behind:processed") })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, k := range []string{"c-late", "c-behind"} {
		if at, _ := ran.Load(k); at.(time.Time).Before(due.Truncate(time.Millisecond)) {
			t.Errorf("%s ran at %v, before its retry_at %v", k, at, due)
		}
	}
	if l := log.String(); strings.Index(l, "c-late") > strings.Index(l, "c-behind") {
		t.Errorf("order of the tier's partition not kept: %s", l)
	}
	var topic string
	var offset int64
	if err := e.db.QueryRow("SELECT topic, kafka_offset FROM outbox_inbox WHERE event_key = 'c-late'").Scan(&topic, &offset); err != nil {
		t.Fatal(err)
	}
	if topic != e.topic || offset != 7 {
		t.Errorf("inbox row of a copy: %s@%d, want %s@7", topic, offset, e.topic)
	}
}

// Infrastructure errors never send a record to a tier: an outage far longer than the attempts'
// backoff, then every record processed once from the main topic, no copy, no dead letter.
func TestOutageNeverSendsToATier(t *testing.T) {
	e := newEnv(t, 1)
	px := newDBProxy(t, dbConfig("").Addr)
	db := e.proxied(t, px)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	s := e.settings()
	s.BackoffInitial, s.BackoffMax = 10*time.Millisecond, 20*time.Millisecond
	s.RetryTiers = []time.Duration{time.Millisecond}
	tier1 := e.topic + ".retry.1"
	deleteTopicsAtEnd(t, tier1)
	cfg := inbox.RunnerConfig{Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group}
	stop, done := startRunner(t, db, s, effectHandler(new(atomic.Int32), nil), cfg)
	produce(t, e.producer, e.topic, 0, 0, 2)
	eventually(t, "offset 2 committed", func() bool { return committed(t, adm, group, e.topic) == 2 })
	px.down()
	produce(t, e.producer, e.topic, 0, 2, 5)
	time.Sleep(2 * time.Second) // the outage: about 70 times the attempts' backoff
	px.up()
	eventually(t, "offset 5 committed", func() bool { return committed(t, adm, group, e.topic) == 5 })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	e.effectsOnce(t, 5)
	if n := endOffset(t, tier1, 0); n != 0 {
		t.Errorf("%d copies in tier 1, want none", n)
	}
	if n := e.dlqEnd(t, adm); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

func TestRetrySettings(t *testing.T) {
	db, p := &sql.DB{}, &kgo.Client{}
	base := inbox.Settings{Consumer: "c", DeadLetterTopic: "d"}
	in, err := inbox.New(db, p, base)
	if err != nil {
		t.Fatal(err)
	}
	if s := in.Settings(); len(s.RetryTiers) != 0 || s.RetryTopicFormat != "{topic}.retry.{n}" || len(in.RetryTopics("orders")) != 0 {
		t.Errorf("defaults: %+v", s)
	}
	s := base
	s.RetryTiers = []time.Duration{time.Minute, 5 * time.Minute, time.Hour}
	if in, err = inbox.New(db, p, s); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(in.RetryTopics("orders"), ","); got != "orders.retry.1,orders.retry.2,orders.retry.3" {
		t.Errorf("tier topics: %s", got)
	}
	s.RetryTopicFormat = "retry-{n}-of-{topic}"
	if in, err = inbox.New(db, p, s); err != nil || in.RetryTopic("orders", 2) != "retry-2-of-orders" {
		t.Errorf("custom format: %v", err)
	}
	s.RetryTopicFormat = "{topic}.retry"
	if _, err := inbox.New(db, p, s); err == nil {
		t.Error("a format without {n} was accepted")
	}
	s.RetryTopicFormat, s.RetryTiers = "", []time.Duration{-time.Second}
	if _, err := inbox.New(db, p, s); err == nil {
		t.Error("a negative tier was accepted")
	}
}

// A copy of a record whose effect committed (a crash after the commit, before the offset) is a
// duplicate; a parked record whose handler keeps failing goes to tier 1 and leaves the parked
// table, and its copy is applied from there.
func TestCopiesWithProcess(t *testing.T) {
	e := newEnv(t, 1)
	tier1 := e.topic + ".retry.1"
	newTopics(t, 1, tier1)
	var l settledLog
	s := e.parkedSettings(&l)
	s.RetryTiers = []time.Duration{time.Minute}
	in := e.newInbox(t, s)
	failP3 := true
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	handler := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		if err := h(ctx, tx, rec); err != nil {
			return err
		}
		if failP3 && hdr(rec, "event_key") == "P-v3" {
			return fmt.Errorf("P-v3 fails")
		}
		return nil
	}

	// A copy of an applied record: duplicate, the handler does not run.
	mustProcess(t, in, versioned(e, 0, "D", "D-v1", "1"), handler, inbox.Processed)
	cp := versioned(e, 0, "D", "D-v1", "1")
	cp.Topic = tier1
	cp.Headers = append(cp.Headers, kgo.RecordHeader{Key: "retry_count", Value: []byte("1")},
		kgo.RecordHeader{Key: "original_topic", Value: []byte(e.topic)},
		kgo.RecordHeader{Key: "original_partition", Value: []byte("0")},
		kgo.RecordHeader{Key: "original_offset", Value: []byte("0")})
	mustProcess(t, in, cp, handler, inbox.Duplicate)
	if e.effects(t, "D-v1") != 1 {
		t.Errorf("D-v1: %d effects", e.effects(t, "D-v1"))
	}

	// P-v3 parked, resumed after P-v2, fails: a copy to tier 1, the parked row deleted.
	mustProcess(t, in, versioned(e, 1, "P", "P-v1", "1"), handler, inbox.Processed)
	mustProcess(t, in, versioned(e, 2, "P", "P-v3", "3"), handler, inbox.Parked)
	mustProcess(t, in, versioned(e, 3, "P", "P-v2", "2"), handler, inbox.Processed)
	if n := e.parked(t); n != 0 {
		t.Errorf("parked rows after the retried resumption: %d", n)
	}
	c := readTopic(t, tier1, 1)[0]
	if hdr(c, "original_offset") != "2" || hdr(c, "retry_count") != "1" || hdr(c, "retry_error") != "P-v3 fails" {
		t.Errorf("copy of the parked record: %v", c.Headers)
	}
	failP3 = false
	mustProcess(t, in, c, handler, inbox.Processed)
	want := "D-v1:processed@0,D-v1:duplicate@0,P-v1:processed@1,P-v3:parked@2,P-v2:processed@3,P-v3:retried@2,P-v3:processed@0"
	if got := l.String(); got != want {
		t.Errorf("settled:\n got %s\nwant %s", got, want)
	}
	if v := e.storedVersion(t, "P"); v != 3 || e.effects(t, "P-v3") != 1 {
		t.Errorf("stored version %d, P-v3 effects %d", v, e.effects(t, "P-v3"))
	}
	if n := e.count(t, "SELECT kafka_offset FROM outbox_inbox WHERE event_key = 'P-v3'"); n != 2 {
		t.Errorf("inbox row of P-v3: offset %d, want the original 2", n)
	}
}

func TestRunnerRefusesATierTopicTheBrokerWillNotCreate(t *testing.T) {
	e := newEnv(t, 1)
	s := e.settings()
	s.RetryTiers = []time.Duration{time.Second}
	s.RetryTopicFormat = "{topic}/retry.{n}" // '/' is not allowed in a topic name
	_, err := inbox.NewRunner(e.db, s, effectHandler(&atomic.Int32{}, nil), inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}})
	if err == nil {
		t.Fatal("NewRunner accepted a tier topic the broker cannot create")
	}
	if !strings.Contains(err.Error(), e.topic+"/retry.1") || !strings.Contains(err.Error(), "kafka-topics.sh --create") ||
		!strings.Contains(err.Error(), "RetryTopicFormat") {
		t.Errorf("error does not name the topic and the fix: %v", err)
	}
}
