package inbox_test

// Parked versions (inbox/CONTRACT.md, "Parked versions") against the real server.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

// settledLog records the AfterCommit hook's calls: "event_key:outcome@offset".
type settledLog struct {
	mu   sync.Mutex
	seen []string
	recs []*kgo.Record
}

func (l *settledLog) hook(rec *kgo.Record, res inbox.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, fmt.Sprintf("%s:%s@%d", hdr(rec, "event_key"), res.Outcome, rec.Offset))
	l.recs = append(l.recs, rec)
}

func (l *settledLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.seen, ",")
}

func (e *env) parkedSettings(l *settledLog) inbox.Settings {
	s := e.settings()
	s.VersionHeader = "version"
	s.Hooks.AfterCommit = l.hook
	return s
}

func (e *env) parked(t *testing.T) int {
	return e.count(t, "SELECT COUNT(*) FROM outbox_inbox_parked WHERE consumer = 'test-consumer'")
}

func (e *env) storedVersion(t *testing.T, agg string) int {
	return e.count(t, "SELECT version FROM outbox_inbox_version WHERE consumer = 'test-consumer' AND aggregate_type = 'order' AND aggregate_id = ?", agg)
}

// dlqEmpty says whether the dead-letter topic has no record.
func (e *env) dlqEmpty(t *testing.T) bool {
	t.Helper()
	adm := kadm.NewClient(newClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, e.dlq)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := ends.Lookup(e.dlq, 0)
	return ok && o.Err == nil && o.Offset == 0
}

func mustProcess(t *testing.T, in *inbox.Inbox, rec *kgo.Record, h inbox.Handler, want inbox.Outcome) inbox.Result {
	t.Helper()
	res, err := in.Process(context.Background(), rec, h)
	if err != nil || res.Outcome != want {
		t.Fatalf("%s: %+v, %v; want %s", hdr(rec, "event_key"), res, err, want)
	}
	return res
}

func TestParkedVersionsResumeInVersionOrder(t *testing.T) {
	e := newEnv(t, 1)
	var l settledLog
	var before atomic.Int32
	s := e.parkedSettings(&l)
	s.Hooks.BeforeCommit = func(*kgo.Record) { before.Add(1) }
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)

	mustProcess(t, in, versioned(e, 0, "P", "P-v1", "1"), h, inbox.Processed)
	mustProcess(t, in, versioned(e, 1, "P", "P-v2", "2"), h, inbox.Processed)
	// v4 carries a binary header, a header without value and a null value: all kept.
	v4 := versioned(e, 2, "P", "P-v4", "4")
	v4.Headers = append(v4.Headers, kgo.RecordHeader{Key: "bin", Value: []byte{0, 255, 10}}, kgo.RecordHeader{Key: "none"})
	v4.Value = []byte(`{"n":4}`)
	res := mustProcess(t, in, v4, h, inbox.Parked)
	if res.Reason != "version gap: expected 3, got 4" || res.Attempts != 1 {
		t.Errorf("parked result: %+v", res)
	}
	mustProcess(t, in, versioned(e, 3, "P", "P-v5", "5"), h, inbox.Parked)
	if calls.Load() != 2 || e.parked(t) != 2 || e.effects(t, "P-v4") != 0 {
		t.Fatalf("after parking: %d handler calls, %d parked rows, %d effects of P-v4", calls.Load(), e.parked(t), e.effects(t, "P-v4"))
	}
	// Parked records left no inbox row.
	if n := e.count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE event_key IN ('P-v4', 'P-v5')"); n != 0 {
		t.Errorf("inbox rows of parked records: %d", n)
	}

	// v3 closes the gap: processed, then 4 and 5 resume by themselves, in order.
	mustProcess(t, in, versioned(e, 4, "P", "P-v3", "3"), h, inbox.Processed)
	want := "P-v1:processed@0,P-v2:processed@1,P-v4:parked@2,P-v5:parked@3,P-v3:processed@4,P-v4:resumed@2,P-v5:resumed@3"
	if got := l.String(); got != want {
		t.Errorf("settled:\n got %s\nwant %s", got, want)
	}
	if before.Load() != 5 {
		t.Errorf("BeforeCommit ran %d times, want 5", before.Load())
	}
	rows, err := e.db.Query("SELECT event_key FROM effects ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		order = append(order, k)
	}
	if got := strings.Join(order, ","); got != "P-v1,P-v2,P-v3,P-v4,P-v5" {
		t.Errorf("effects in order %s", got)
	}
	if v := e.storedVersion(t, "P"); v != 5 {
		t.Errorf("stored version %d, want 5", v)
	}
	if n := e.parked(t); n != 0 {
		t.Errorf("parked rows left: %d", n)
	}
	// The resumed record is the one received, rebuilt from the parked row.
	l.mu.Lock()
	got := l.recs[5]
	l.mu.Unlock()
	if got.Topic != e.topic || got.Partition != 0 || got.Offset != 2 || string(got.Key) != "P" || string(got.Value) != `{"n":4}` ||
		len(got.Headers) != len(v4.Headers) || hdr(got, "bin") != "\x00\xff\n" || hdr(got, "none") != "" || got.Headers[4].Value != nil ||
		!bytes.Equal(got.Headers[0].Value, []byte("P-v4")) {
		t.Errorf("rebuilt record: %+v", got)
	}
	// Its inbox row names the original record: a redelivery is a duplicate.
	if n := e.count(t, "SELECT kafka_offset FROM outbox_inbox WHERE event_key = 'P-v4'"); n != 2 {
		t.Errorf("inbox row of P-v4: offset %d, want 2", n)
	}
	mustProcess(t, in, versioned(e, 2, "P", "P-v4", "4"), h, inbox.Duplicate)
}

func TestRedeliveredParkedRecordIsIgnored(t *testing.T) {
	e := newEnv(t, 1)
	var l settledLog
	in := e.newInbox(t, e.parkedSettings(&l))
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	mustProcess(t, in, versioned(e, 0, "Q", "Q-v1", "1"), h, inbox.Processed)
	mustProcess(t, in, versioned(e, 1, "Q", "Q-v3", "3"), h, inbox.Parked)
	// The same record again (a crash before the offset commit): parked again, nothing written.
	mustProcess(t, in, versioned(e, 1, "Q", "Q-v3", "3"), h, inbox.Parked)
	if n := e.parked(t); n != 1 {
		t.Errorf("parked rows: %d, want 1", n)
	}
	if n := e.count(t, "SELECT kafka_offset FROM outbox_inbox_parked WHERE event_key = 'Q-v3'"); n != 1 {
		t.Errorf("parked row offset %d, want 1", n)
	}
	mustProcess(t, in, versioned(e, 2, "Q", "Q-v2", "2"), h, inbox.Processed)
	if e.effects(t, "Q-v3") != 1 || e.parked(t) != 0 || calls.Load() != 3 {
		t.Errorf("Q-v3 effects %d, parked %d, calls %d: want 1, 0, 3", e.effects(t, "Q-v3"), e.parked(t), calls.Load())
	}
	if got := l.String(); got != "Q-v1:processed@0,Q-v3:parked@1,Q-v3:parked@1,Q-v2:processed@2,Q-v3:resumed@1" {
		t.Errorf("settled: %s", got)
	}
	if !e.dlqEmpty(t) {
		t.Error("a dead letter was written")
	}
}

func TestSweepRemovesStaleRowsAndResumesApplicableOnes(t *testing.T) {
	e := newEnv(t, 1)
	var l settledLog
	in := e.newInbox(t, e.parkedSettings(&l))
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	ctx := context.Background()
	mustProcess(t, in, versioned(e, 0, "S", "S-v1", "1"), h, inbox.Processed)
	mustProcess(t, in, versioned(e, 1, "S", "S-v3", "3"), h, inbox.Parked)
	mustProcess(t, in, versioned(e, 2, "R", "R-v1", "1"), h, inbox.Processed)
	mustProcess(t, in, versioned(e, 3, "R", "R-v3", "3"), h, inbox.Parked)
	mustProcess(t, in, versioned(e, 4, "R", "R-v4", "4"), h, inbox.Parked)
	// Another process applied S up to 5 (S-v3 is stale now) and R's version 2 (R-v3 and R-v4
	// are next, and no one resumed them: a crash came between).
	if _, err := e.db.Exec("UPDATE outbox_inbox_version SET version = CASE aggregate_id WHEN 'S' THEN 5 ELSE 2 END WHERE consumer = 'test-consumer'"); err != nil {
		t.Fatal(err)
	}
	l.seen, l.recs = nil, nil
	sw, err := in.SweepParked(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if sw != (inbox.ParkedSweep{Resumed: 2, Stale: 1}) {
		t.Errorf("sweep: %+v", sw)
	}
	got := l.String()
	if got != "S-v3:stale@1,R-v3:resumed@3,R-v4:resumed@4" {
		t.Errorf("settled: %s", got)
	}
	if e.effects(t, "S-v3") != 0 || e.effects(t, "R-v3") != 1 || e.effects(t, "R-v4") != 1 {
		t.Errorf("effects S-v3 %d, R-v3 %d, R-v4 %d: want 0, 1, 1", e.effects(t, "S-v3"), e.effects(t, "R-v3"), e.effects(t, "R-v4"))
	}
	if n := e.parked(t); n != 0 {
		t.Errorf("parked rows left: %d", n)
	}
	if v := e.storedVersion(t, "S"); v != 5 {
		t.Errorf("stored version of S %d, want 5", v)
	}
	if v := e.storedVersion(t, "R"); v != 4 {
		t.Errorf("stored version of R %d, want 4", v)
	}
	// Nothing left: an empty sweep.
	if sw, err := in.SweepParked(ctx, h); err != nil || sw != (inbox.ParkedSweep{}) {
		t.Errorf("second sweep: %+v, %v", sw, err)
	}
}

func TestExpiredParkedRecordIsDeadLettered(t *testing.T) {
	e := newEnv(t, 1)
	var l settledLog
	s := e.parkedSettings(&l)
	s.GapDeadline = 300 * time.Millisecond
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	ctx := context.Background()
	mustProcess(t, in, versioned(e, 0, "G", "G-v1", "1"), h, inbox.Processed)
	rec := versioned(e, 7, "G", "G-v3", "3")
	mustProcess(t, in, rec, h, inbox.Parked)
	// Before the deadline: it stays.
	sw, err := in.SweepParked(ctx, h)
	if err != nil || sw.DeadLettered != 0 || sw.Parked != 1 || sw.Oldest <= 0 {
		t.Fatalf("sweep before the deadline: %+v, %v", sw, err)
	}
	time.Sleep(400 * time.Millisecond)
	sw, err = in.SweepParked(ctx, h)
	if err != nil || sw != (inbox.ParkedSweep{DeadLettered: 1}) {
		t.Fatalf("sweep after the deadline: %+v, %v", sw, err)
	}
	dl := e.readDLQ(t, 1)[0]
	reason := hdr(dl, "dlq_reason")
	if !strings.HasPrefix(reason, "version gap: expected 2, got 3; parked since ") {
		t.Errorf("dlq_reason %q", reason)
	}
	since := strings.TrimPrefix(reason, "version gap: expected 2, got 3; parked since ")
	if at, err := time.Parse(time.RFC3339Nano, since); err != nil || !strings.HasSuffix(since, "Z") || time.Since(at) > time.Minute || time.Since(at) < 0 {
		t.Errorf("parked since %q: %v", since, err)
	}
	want := map[string]string{
		"dlq_attempts": "0", "dlq_topic": e.topic, "dlq_partition": "0", "dlq_offset": "7",
		"dlq_consumer": "test-consumer", "event_key": "G-v3", "version": "3", "aggregate_type": "order",
	}
	for k, v := range want {
		if got := hdr(dl, k); got != v {
			t.Errorf("dead letter header %s = %q, want %q", k, got, v)
		}
	}
	if string(dl.Key) != "G" || string(dl.Value) != string(rec.Value) {
		t.Errorf("dead letter key/value: %q %q", dl.Key, dl.Value)
	}
	if got := l.String(); got != "G-v1:processed@0,G-v3:parked@7,G-v3:dead_lettered@7" {
		t.Errorf("settled: %s", got)
	}
	if e.parked(t) != 0 || e.effects(t, "G-v3") != 0 || e.storedVersion(t, "G") != 1 {
		t.Errorf("parked %d, effects %d, version %d: want 0, 0, 1", e.parked(t), e.effects(t, "G-v3"), e.storedVersion(t, "G"))
	}
}

func TestOnGapExpiredCompensatesInsteadOfTheDeadLetter(t *testing.T) {
	e := newEnv(t, 1)
	var l settledLog
	s := e.parkedSettings(&l)
	s.GapDeadline = time.Millisecond
	var hookCalls atomic.Int32
	var gotAt time.Time
	var gotRec *kgo.Record
	s.Hooks.OnGapExpired = func(rec *kgo.Record, parkedAt time.Time) error {
		if hookCalls.Add(1) == 1 {
			return errors.New("compensation service down")
		}
		gotRec, gotAt = rec, parkedAt
		return nil
	}
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	ctx := context.Background()
	mustProcess(t, in, versioned(e, 0, "C", "C-v1", "1"), h, inbox.Processed)
	start := time.Now()
	mustProcess(t, in, versioned(e, 1, "C", "C-v3", "3"), h, inbox.Parked)
	time.Sleep(50 * time.Millisecond)
	// The hook fails: the row stays for the next sweep.
	sw, err := in.SweepParked(ctx, h)
	if err != nil || sw.Compensated != 0 || sw.Parked != 1 {
		t.Fatalf("first sweep: %+v, %v", sw, err)
	}
	sw, err = in.SweepParked(ctx, h)
	if err != nil || sw != (inbox.ParkedSweep{Compensated: 1}) {
		t.Fatalf("second sweep: %+v, %v", sw, err)
	}
	if hookCalls.Load() != 2 || gotRec == nil || hdr(gotRec, "event_key") != "C-v3" || gotRec.Offset != 1 ||
		gotAt.Before(start.Add(-5*time.Second)) || gotAt.After(time.Now()) {
		t.Errorf("hook: %d calls, record %+v, parked at %v", hookCalls.Load(), gotRec, gotAt)
	}
	if got := l.String(); got != "C-v1:processed@0,C-v3:parked@1,C-v3:compensated@1" {
		t.Errorf("settled: %s", got)
	}
	if e.parked(t) != 0 || e.effects(t, "C-v3") != 0 {
		t.Errorf("parked %d, effects %d: want 0, 0", e.parked(t), e.effects(t, "C-v3"))
	}
	if !e.dlqEmpty(t) {
		t.Error("a dead letter was written despite the compensation")
	}
}

func TestRunnerSweepsExpiredParkedRecords(t *testing.T) {
	e := newEnv(t, 1)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	ctx := context.Background()
	recs := []*kgo.Record{
		{Topic: e.topic, Key: []byte("G"), Value: []byte("{}"), Headers: []kgo.RecordHeader{
			{Key: "event_key", Value: []byte("G-v1")}, {Key: "aggregate_type", Value: []byte("order")}, {Key: "version", Value: []byte("1")}}},
		{Topic: e.topic, Key: []byte("G"), Value: []byte("{}"), Headers: []kgo.RecordHeader{
			{Key: "event_key", Value: []byte("G-v3")}, {Key: "aggregate_type", Value: []byte("order")}, {Key: "version", Value: []byte("3")}}},
	}
	if err := e.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var l settledLog
	s := e.parkedSettings(&l)
	s.GapDeadline = 500 * time.Millisecond
	s.ParkSweepInterval = 100 * time.Millisecond
	r, err := inbox.NewRunner(e.db, s, effectHandler(&atomic.Int32{}, nil), inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	// The poll stays idle after the two records: the sweep still runs.
	dl := e.readDLQ(t, 1)[0]
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(hdr(dl, "dlq_reason"), "version gap: expected 2, got 3; parked since ") || hdr(dl, "dlq_attempts") != "0" {
		t.Errorf("dead letter: %v", dl.Headers)
	}
	if got := l.String(); got != "G-v1:processed@0,G-v3:parked@1,G-v3:dead_lettered@1" {
		t.Errorf("settled: %s", got)
	}
	if c := committed(t, adm, group, e.topic); c != 2 {
		t.Errorf("committed offset %d, want 2", c)
	}
	if n := e.parked(t); n != 0 {
		t.Errorf("parked rows left: %d", n)
	}
}
