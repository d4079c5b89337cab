package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

func TestTopicSettingsDefaultsAndValidation(t *testing.T) {
	db, p := &sql.DB{}, &kgo.Client{}
	base := inbox.Settings{Consumer: "c", DeadLetterTopic: "d", RetryTiers: []time.Duration{time.Minute}}
	base.Topics = map[string]inbox.TopicSettings{
		"orders":        {MaxAttempts: 8, RetryTiers: []time.Duration{time.Second, time.Minute}, InboxRetention: 24 * time.Hour, GapPolicy: inbox.GapDeadLetter},
		"notifications": {RetryTiers: []time.Duration{}, GapDeadline: time.Minute},
	}
	in, err := inbox.New(db, p, base)
	if err != nil {
		t.Fatal(err)
	}
	if r := in.InboxRetention("other"); r != 7*24*time.Hour {
		t.Errorf("default retention %s", r)
	}
	if r := in.InboxRetention("orders"); r != 24*time.Hour {
		t.Errorf("orders retention %s", r)
	}
	if in.MaxAttemptsOf("orders") != 8 || in.MaxAttemptsOf("notifications") != 5 || in.MaxAttemptsOf("other") != 5 {
		t.Errorf("max attempts: %d %d %d", in.MaxAttemptsOf("orders"), in.MaxAttemptsOf("notifications"), in.MaxAttemptsOf("other"))
	}
	if in.GapPolicyOf("orders") != inbox.GapDeadLetter || in.GapPolicyOf("other") != inbox.GapPark {
		t.Errorf("gap policies: %s %s", in.GapPolicyOf("orders"), in.GapPolicyOf("other"))
	}
	if in.GapDeadlineOf("notifications") != time.Minute || in.GapDeadlineOf("orders") != time.Hour {
		t.Errorf("gap deadlines: %s %s", in.GapDeadlineOf("notifications"), in.GapDeadlineOf("orders"))
	}
	for topic, want := range map[string]string{
		"orders":        "orders.retry.1,orders.retry.2",
		"notifications": "",
		"other":         "other.retry.1",
	} {
		if got := strings.Join(in.RetryTopics(topic), ","); got != want {
			t.Errorf("tier topics of %s: %q, want %q", topic, got, want)
		}
	}

	for _, c := range []struct {
		ts   inbox.TopicSettings
		want string
	}{
		{inbox.TopicSettings{MaxAttempts: -1}, `Settings.Topics["t"].MaxAttempts`},
		{inbox.TopicSettings{BackoffInitial: -time.Second}, `Settings.Topics["t"].BackoffInitial`},
		{inbox.TopicSettings{BackoffMax: -time.Second}, `Settings.Topics["t"].BackoffMax`},
		{inbox.TopicSettings{BackoffInitial: time.Minute}, `Settings.Topics["t"].BackoffInitial (1m0s) must not exceed BackoffMax (10s)`},
		{inbox.TopicSettings{BackoffInitial: time.Second, BackoffMax: 500 * time.Millisecond}, `Settings.Topics["t"].BackoffInitial`},
		{inbox.TopicSettings{RetryTiers: []time.Duration{time.Second, -time.Second}}, `Settings.Topics["t"].RetryTiers`},
		{inbox.TopicSettings{GapPolicy: "later"}, `Settings.Topics["t"].GapPolicy`},
		{inbox.TopicSettings{GapDeadline: -time.Second}, `Settings.Topics["t"].GapDeadline`},
		{inbox.TopicSettings{InboxRetention: -time.Hour}, `Settings.Topics["t"].InboxRetention`},
	} {
		s := inbox.Settings{Consumer: "c", DeadLetterTopic: "d", Topics: map[string]inbox.TopicSettings{"t": c.ts}}
		_, err := inbox.New(db, p, s)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.ts, err, c.want)
		}
	}
	// A topic's tiers need {n} in the format even without consumer-wide tiers.
	s := inbox.Settings{Consumer: "c", DeadLetterTopic: "d", RetryTopicFormat: "{topic}.retry",
		Topics: map[string]inbox.TopicSettings{"t": {RetryTiers: []time.Duration{time.Second}}}}
	if _, err := inbox.New(db, p, s); err == nil {
		t.Error("a format without {n} was accepted for a topic's tiers")
	}
}

// One topic dead-letters after 1 attempt, another after the consumer-wide 3; a topic with
// tiers sends a copy, one without dead-letters; the copy (on the tier topic, not in Topics)
// uses its original topic's max_attempts and tiers.
func TestTopicOverridesMaxAttemptsAndTiers(t *testing.T) {
	e := newEnv(t, 1)
	quick := e.topic + "-quick"
	tier1 := quick + ".retry.1"
	newTopics(t, 1, quick, tier1)
	var l settledLog
	s := e.settings() // MaxAttempts 3, no consumer-wide tiers
	s.Hooks.AfterCommit = l.hook
	s.Topics = map[string]inbox.TopicSettings{quick: {MaxAttempts: 1, RetryTiers: []time.Duration{time.Minute}}}
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, func(int32) error { return errors.New("boom") })
	ctx := context.Background()

	rq := e.record(0, "k", "event_key", "q-1")
	rq.Topic = quick
	if res, err := in.Process(ctx, rq, h); err != nil || res.Outcome != inbox.Retried || res.Attempts != 1 {
		t.Fatalf("quick: %+v, %v; want retried after 1 attempt", res, err)
	}
	if res, err := in.Process(ctx, e.record(0, "k", "event_key", "p-1"), h); err != nil || res.Outcome != inbox.DeadLettered || res.Attempts != 3 {
		t.Fatalf("plain: %+v, %v; want dead-lettered after 3 attempts", res, err)
	}
	cp := readTopic(t, tier1, 1)[0]
	if hdr(cp, "original_topic") != quick || hdr(cp, "retry_count") != "1" {
		t.Fatalf("copy: %v", cp.Headers)
	}
	// The copy: 1 attempt (quick's), then the dead letter (quick has 1 tier).
	if res, err := in.Process(ctx, cp, h); err != nil || res.Outcome != inbox.DeadLettered || res.Attempts != 1 {
		t.Fatalf("copy: %+v, %v; want dead-lettered after 1 attempt", res, err)
	}
	if calls.Load() != 5 {
		t.Errorf("handler calls %d, want 1 + 3 + 1", calls.Load())
	}
	dls := e.readDLQ(t, 2)
	if hdr(dls[0], "event_key") != "p-1" || hdr(dls[0], "dlq_attempts") != "3" ||
		hdr(dls[1], "event_key") != "q-1" || hdr(dls[1], "dlq_attempts") != "1" || hdr(dls[1], "dlq_topic") != quick {
		t.Errorf("dead letters: %v / %v", dls[0].Headers, dls[1].Headers)
	}
}

// gap_policy per topic: one topic parks a gap, the other dead-letters it.
func TestTopicOverridesGapPolicy(t *testing.T) {
	e := newEnv(t, 1)
	strict := e.topic + "-strict"
	var l settledLog
	s := e.parkedSettings(&l) // consumer-wide GapPark
	s.Topics = map[string]inbox.TopicSettings{strict: {GapPolicy: inbox.GapDeadLetter}}
	in := e.newInbox(t, s)
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	mustProcess(t, in, versioned(e, 0, "A", "A-v1", "1"), h, inbox.Processed)
	mustProcess(t, in, versioned(e, 1, "A", "A-v3", "3"), h, inbox.Parked)
	b1, b3 := versioned(e, 0, "B", "B-v1", "1"), versioned(e, 1, "B", "B-v3", "3")
	b1.Topic, b3.Topic = strict, strict
	mustProcess(t, in, b1, h, inbox.Processed)
	res := mustProcess(t, in, b3, h, inbox.DeadLettered)
	if res.Reason != "version gap: expected 2, got 3" {
		t.Errorf("B-v3: %+v", res)
	}
	if n := e.parked(t); n != 1 {
		t.Errorf("parked rows %d, want 1 (A-v3)", n)
	}
	if dl := e.readDLQ(t, 1)[0]; hdr(dl, "event_key") != "B-v3" || hdr(dl, "dlq_topic") != strict {
		t.Errorf("dead letter: %v", dl.Headers)
	}
}

// The runner creates and subscribes to the tier topics of each topic by its own tier count: a
// topic with 2 tiers of its own, one with none, one with the consumer-wide 1.
func TestRunnerTierTopicsPerTopic(t *testing.T) {
	e := newEnv(t, 1)
	twice, never := e.topic+"-twice", e.topic+"-never"
	newTopics(t, 1, twice, never)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	deleteTopicsAtEnd(t, e.topic+".retry.1", twice+".retry.1", twice+".retry.2")
	var l settledLog
	s := e.settings()
	s.Hooks.AfterCommit = l.hook
	s.RetryTiers = []time.Duration{time.Hour}
	s.Topics = map[string]inbox.TopicSettings{
		twice: {RetryTiers: []time.Duration{100 * time.Millisecond, 100 * time.Millisecond}, MaxAttempts: 1},
		never: {RetryTiers: []time.Duration{}},
	}
	produce(t, e.producer, twice, 0, 0, 1)
	produce(t, e.producer, never, 0, 1, 2)
	h := tierFailing(func(rec *kgo.Record) int {
		if hdr(rec, "event_key") == "e-0" {
			return 2
		}
		return 99
	}, nil)
	stop, done := startRunner(t, e.db, s, h, inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic, twice, never}, Group: group})
	eventually(t, "e-0 processed from tier 2, e-1 dead-lettered", func() bool {
		got := l.String()
		return strings.Contains(got, "e-0:processed") && strings.Contains(got, "e-1:dead_lettered")
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if got := l.String(); strings.Count(got, "e-0:retried") != 2 || strings.Count(got, "e-1:") != 1 {
		t.Errorf("settled: %s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string]bool{
		e.topic + ".retry.1": true, e.topic + ".retry.2": false,
		twice + ".retry.1": true, twice + ".retry.2": true, twice + ".retry.3": false,
		never + ".retry.1": false,
	} {
		if td.Has(topic) != want {
			t.Errorf("tier topic %s exists: %v, want %v", topic, td.Has(topic), want)
		}
	}
}
