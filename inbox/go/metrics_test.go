package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

// gauge reads one series of a gauge from reg (-1: not there).
func gauge(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
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
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// A small run (processed, a duplicate, a stale, a parked then resumed, a dead-lettered record,
// a retry copy counted under its original topic) read back from the registry; a second inbox of
// another consumer on the same registry; no registry, no metrics.
func TestMetricsCountSettledRecords(t *testing.T) {
	e := newEnv(t, 1)
	tier1 := e.topic + ".retry.1"
	newTopics(t, 1, tier1)
	reg := prometheus.NewRegistry()
	var l settledLog
	s := e.parkedSettings(&l)
	s.Registerer = reg
	s.RetryTiers = []time.Duration{time.Minute}
	s.MaxAttempts = 1
	in := e.newInbox(t, s)
	var calls atomic.Int32
	ok := effectHandler(&calls, nil)
	h := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		if strings.HasPrefix(hdr(rec, "event_key"), "bad") {
			return errors.New("bad")
		}
		return ok(ctx, tx, rec)
	}
	mustProcess(t, in, versioned(e, 0, "A", "A-v1", "1"), h, inbox.Processed)
	mustProcess(t, in, versioned(e, 1, "A", "A-v1", "1"), h, inbox.Duplicate)
	mustProcess(t, in, versioned(e, 2, "A", "A-v1-late", "1"), h, inbox.Stale)
	mustProcess(t, in, versioned(e, 3, "A", "A-v3", "3"), h, inbox.Parked)
	mustProcess(t, in, versioned(e, 4, "A", "A-v2", "2"), h, inbox.Processed) // A-v3 resumed
	mustProcess(t, in, e.record(5, "B", "event_key", "bad-1"), h, inbox.Retried)
	cp := readTopic(t, tier1, 1)[0]
	mustProcess(t, in, cp, h, inbox.DeadLettered) // counted under the original topic
	mustProcess(t, in, e.record(6, "B"), h, inbox.DeadLettered)

	// Another consumer on the same registry: its own series.
	s2 := e.settings()
	s2.Consumer, s2.Registerer = "other-consumer", reg
	in2 := e.newInbox(t, s2)
	mustProcess(t, in2, e.record(0, "C", "event_key", "C-1"), h, inbox.Processed)
	// No registerer: nothing recorded anywhere.
	mustProcess(t, e.newInbox(t, e.settings()), e.record(0, "C", "event_key", "C-2"), h, inbox.Processed)

	want := fmt.Sprintf(`
# HELP outbox_inbox_records_total Records settled by the inbox, by consumer, original topic and outcome.
# TYPE outbox_inbox_records_total counter
outbox_inbox_records_total{consumer="other-consumer",outcome="processed",topic="%[1]s"} 1
outbox_inbox_records_total{consumer="test-consumer",outcome="dead_lettered",topic="%[1]s"} 2
outbox_inbox_records_total{consumer="test-consumer",outcome="duplicate",topic="%[1]s"} 1
outbox_inbox_records_total{consumer="test-consumer",outcome="parked",topic="%[1]s"} 1
outbox_inbox_records_total{consumer="test-consumer",outcome="processed",topic="%[1]s"} 2
outbox_inbox_records_total{consumer="test-consumer",outcome="resumed",topic="%[1]s"} 1
outbox_inbox_records_total{consumer="test-consumer",outcome="retried",topic="%[1]s"} 1
outbox_inbox_records_total{consumer="test-consumer",outcome="stale",topic="%[1]s"} 1
`, e.topic)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "outbox_inbox_records_total"); err != nil {
		t.Error(err)
	}
}

// The parked gauges after each sweep: one row parked (and its age), then none.
func TestMetricsParkedGaugesAfterASweep(t *testing.T) {
	e := newEnv(t, 1)
	reg := prometheus.NewRegistry()
	var l settledLog
	s := e.parkedSettings(&l)
	s.Registerer = reg
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	ctx := context.Background()
	consumer := map[string]string{"consumer": "test-consumer"}
	if g := gauge(t, reg, "outbox_inbox_parked_records", consumer); g != -1 {
		t.Errorf("parked gauge before any sweep: %v", g)
	}
	mustProcess(t, in, versioned(e, 0, "A", "A-v1", "1"), h, inbox.Processed)
	mustProcess(t, in, versioned(e, 1, "A", "A-v3", "3"), h, inbox.Parked)
	time.Sleep(200 * time.Millisecond)
	if _, err := in.SweepParked(ctx, h); err != nil {
		t.Fatal(err)
	}
	if g := gauge(t, reg, "outbox_inbox_parked_records", consumer); g != 1 {
		t.Errorf("parked rows gauge %v, want 1", g)
	}
	if g := gauge(t, reg, "outbox_inbox_parked_oldest_seconds", consumer); g < 0.15 || g > 60 {
		t.Errorf("oldest parked gauge %v, want about 0.2 s", g)
	}
	mustProcess(t, in, versioned(e, 2, "A", "A-v2", "2"), h, inbox.Processed)
	if _, err := in.SweepParked(ctx, h); err != nil {
		t.Fatal(err)
	}
	if g := gauge(t, reg, "outbox_inbox_parked_records", consumer); g != 0 {
		t.Errorf("parked rows gauge %v, want 0", g)
	}
	if g := gauge(t, reg, "outbox_inbox_parked_oldest_seconds", consumer); g != 0 {
		t.Errorf("oldest parked gauge %v, want 0", g)
	}
}

// The lag gauge after each poll: 10 records, one per poll; while the first is in hand the lag
// is 9, once all are processed 0.
func TestMetricsConsumerLagAfterPolls(t *testing.T) {
	e := newEnv(t, 1)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	produce(t, e.producer, e.topic, 0, 0, 10)
	reg := prometheus.NewRegistry()
	s := e.settings()
	s.Registerer = reg
	release := make(chan struct{})
	var calls atomic.Int32
	ok := effectHandler(&calls, nil)
	h := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		if rec.Offset == 0 {
			<-release
		}
		return ok(ctx, tx, rec)
	}
	stop, done := startRunner(t, e.db, s, h, inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group, MaxPollRecords: 1})
	labels := map[string]string{"consumer": "test-consumer", "topic": e.topic, "partition": "0"}
	eventually(t, "lag 9 while the first record is in hand", func() bool {
		return gauge(t, reg, "outbox_inbox_consumer_lag", labels) == 9
	})
	close(release)
	eventually(t, "lag 0 once all are processed", func() bool {
		return gauge(t, reg, "outbox_inbox_consumer_lag", labels) == 0 && calls.Load() == 10
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
