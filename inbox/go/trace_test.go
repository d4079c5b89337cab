package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

// A W3C traceparent as a producer writes it: version 00, trace id, parent (span) id, sampled.
const (
	producerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpanID  = "00f067aa0ba902b7"
	traceparent     = "00-" + producerTraceID + "-" + producerSpanID + "-01"
)

// newTracing returns a tracer provider that records every span in memory (the SDK's test
// exporter, exported synchronously as each span ends).
func newTracing(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// spanNamed returns the one ended span with the given name.
func spanNamed(t *testing.T, exp *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1 (spans: %v)", len(found), name, exp.GetSpans())
	}
	return found[0]
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// tracedHandler is effectHandler that also starts a span "handler" with the ctx it is given
// (as an application's own instrumentation would).
func tracedHandler(tp trace.TracerProvider, fail error) inbox.Handler {
	var calls atomic.Int32
	h := effectHandler(&calls, nil)
	return func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		ctx, span := tp.Tracer("app").Start(ctx, "handler")
		defer span.End()
		if err := h(ctx, tx, rec); err != nil {
			return err
		}
		return fail
	}
}

func TestSpanContinuesTheRecordsTrace(t *testing.T) {
	e := newEnv(t, 1)
	tp, exp := newTracing(t)
	s := e.settings()
	s.TracerProvider = tp
	in := e.newInbox(t, s)
	rec := e.record(42, "order-7", "event_key", "e-7", "traceparent", traceparent, "tracestate", "vendor=abc")

	res, err := in.Process(context.Background(), rec, tracedHandler(tp, nil))
	if err != nil || res.Outcome != inbox.Processed {
		t.Fatalf("process: %v %v", res, err)
	}
	if n := e.effects(t, "e-7"); n != 1 {
		t.Fatalf("effects: %d", n)
	}
	span := spanNamed(t, exp, e.topic+" process")
	if got := span.SpanContext.TraceID().String(); got != producerTraceID {
		t.Errorf("trace id %s, want the record's %s", got, producerTraceID)
	}
	if got := span.Parent.SpanID().String(); got != producerSpanID || !span.Parent.IsRemote() {
		t.Errorf("parent %s (remote %v), want the record's %s", got, span.Parent.IsRemote(), producerSpanID)
	}
	if got := span.Parent.TraceState().Get("vendor"); got != "abc" {
		t.Errorf("tracestate vendor=%q, want abc", got)
	}
	if span.SpanKind != trace.SpanKindConsumer {
		t.Errorf("kind %v, want consumer", span.SpanKind)
	}
	if span.Status.Code != codes.Unset {
		t.Errorf("status %v", span.Status)
	}
	a := attrs(span)
	want := map[attribute.Key]attribute.Value{
		"messaging.system":                      attribute.StringValue("kafka"),
		"messaging.operation.type":              attribute.StringValue("process"),
		"messaging.destination.name":            attribute.StringValue(e.topic),
		"messaging.destination.partition.id":    attribute.StringValue("0"),
		"messaging.kafka.destination.partition": attribute.Int64Value(0),
		"messaging.kafka.offset":                attribute.Int64Value(42),
		"messaging.kafka.message.key":           attribute.StringValue("order-7"),
		"messaging.consumer.group.name":         attribute.StringValue("test-consumer"),
		"inbox.consumer":                        attribute.StringValue("test-consumer"),
		"inbox.event_key":                       attribute.StringValue("e-7"),
		"inbox.outcome":                         attribute.StringValue("processed"),
		"inbox.attempts":                        attribute.Int64Value(1),
	}
	for k, v := range want {
		if a[k] != v {
			t.Errorf("attribute %s = %v, want %v", k, a[k].String(), v.String())
		}
	}
	handler := spanNamed(t, exp, "handler")
	if handler.SpanContext.TraceID() != span.SpanContext.TraceID() || handler.Parent.SpanID() != span.SpanContext.SpanID() {
		t.Errorf("handler span %s/%s parent %s, want a child of the consumer span %s",
			handler.SpanContext.TraceID(), handler.SpanContext.SpanID(), handler.Parent.SpanID(), span.SpanContext.SpanID())
	}

	// The redelivery: its own span in the same trace, outcome duplicate, status unset.
	exp.Reset()
	res, err = in.Process(context.Background(), rec, tracedHandler(tp, nil))
	if err != nil || res.Outcome != inbox.Duplicate {
		t.Fatalf("redelivery: %v %v", res, err)
	}
	dup := spanNamed(t, exp, e.topic+" process")
	if dup.SpanContext.TraceID().String() != producerTraceID || attrs(dup)["inbox.outcome"].AsString() != "duplicate" || dup.Status.Code != codes.Unset {
		t.Errorf("duplicate span: trace %s attributes %v status %v", dup.SpanContext.TraceID(), dup.Attributes, dup.Status)
	}
	if len(exp.GetSpans()) != 1 {
		t.Errorf("the handler ran for a duplicate: spans %v", exp.GetSpans())
	}
}

func TestSpanOfAFailingHandlerIsAnError(t *testing.T) {
	e := newEnv(t, 1)
	tp, exp := newTracing(t)
	s := e.settings() // MaxAttempts 3
	s.TracerProvider = tp
	in := e.newInbox(t, s)
	rec := e.record(3, "order-p", "event_key", "e-p", "traceparent", traceparent)

	res, err := in.Process(context.Background(), rec, tracedHandler(tp, errors.New("poison record")))
	if err != nil || res.Outcome != inbox.DeadLettered {
		t.Fatalf("process: %v %v", res, err)
	}
	if dls := e.readDLQ(t, 1); hdr(dls[0], "dlq_reason") != "poison record" {
		t.Errorf("dead letter: %v", dls[0].Headers)
	}
	span := spanNamed(t, exp, e.topic+" process")
	if span.Status.Code != codes.Error || span.Status.Description != "poison record" {
		t.Errorf("status %v, want error \"poison record\"", span.Status)
	}
	if a := attrs(span); a["inbox.outcome"].AsString() != "dead_lettered" || a["inbox.attempts"].AsInt64() != 3 {
		t.Errorf("attributes %v", span.Attributes)
	}
	if span.SpanContext.TraceID().String() != producerTraceID || span.Parent.SpanID().String() != producerSpanID {
		t.Errorf("span %s parent %s: not in the record's trace", span.SpanContext.TraceID(), span.Parent.SpanID())
	}
	exceptions := 0
	for _, ev := range span.Events {
		if ev.Name == "exception" {
			exceptions++
		}
	}
	if exceptions != 3 {
		t.Errorf("%d exception events, want one per failed attempt (3): %v", exceptions, span.Events)
	}
}

func TestSpanOfARecordWithoutTraceparentIsARoot(t *testing.T) {
	e := newEnv(t, 1)
	tp, exp := newTracing(t)
	s := e.settings()
	s.TracerProvider = tp
	in := e.newInbox(t, s)

	res, err := in.Process(context.Background(), e.record(0, "order-1", "event_key", "e-1"), tracedHandler(tp, nil))
	if err != nil || res.Outcome != inbox.Processed {
		t.Fatalf("process: %v %v", res, err)
	}
	span := spanNamed(t, exp, e.topic+" process")
	if span.Parent.IsValid() || !span.SpanContext.TraceID().IsValid() {
		t.Errorf("span parent %v trace %s: want a root span of a new trace", span.Parent, span.SpanContext.TraceID())
	}
	handler := spanNamed(t, exp, "handler")
	if handler.Parent.SpanID() != span.SpanContext.SpanID() {
		t.Errorf("handler parent %s, want %s", handler.Parent.SpanID(), span.SpanContext.SpanID())
	}

	// A record without event_key is dead-lettered inside its span: status error.
	exp.Reset()
	if res, err := in.Process(context.Background(), e.record(1, "order-x"), tracedHandler(tp, nil)); err != nil || res.Outcome != inbox.DeadLettered {
		t.Fatalf("process: %v %v", res, err)
	}
	span = spanNamed(t, exp, e.topic+" process")
	if span.Status.Code != codes.Error || attrs(span)["inbox.outcome"].AsString() != "dead_lettered" {
		t.Errorf("span of a record without event_key: status %v attributes %v", span.Status, span.Attributes)
	}
}

// The Runner: a record produced to Kafka with a traceparent header is processed in the
// producer's trace, with the runner's group as messaging.consumer.group.name.
func TestRunnerSpanContinuesTheRecordsTrace(t *testing.T) {
	e := newEnv(t, 1)
	tp, exp := newTracing(t)
	group := "inbox-go-group-" + randSuffix()
	adm := kadm.NewClient(newClient(t))
	t.Cleanup(func() { _, _ = adm.DeleteGroups(context.Background(), group) })
	ctx := context.Background()
	if err := e.producer.ProduceSync(ctx, &kgo.Record{Topic: e.topic, Key: []byte("order-1"), Value: []byte("{}"),
		Headers: []kgo.RecordHeader{{Key: "event_key", Value: []byte("e-1")}, {Key: "traceparent", Value: []byte(traceparent)}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s := e.settings()
	s.TracerProvider = tp
	r, err := inbox.NewRunner(e.db, s, tracedHandler(tp, nil), inbox.RunnerConfig{
		Brokers: strings.Split(bootstrap, ","), Topics: []string{e.topic}, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	eventually(t, "the consumer span", func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == e.topic+" process" {
				return true
			}
		}
		return false
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	span := spanNamed(t, exp, e.topic+" process")
	a := attrs(span)
	if span.SpanContext.TraceID().String() != producerTraceID || span.Parent.SpanID().String() != producerSpanID ||
		a["messaging.consumer.group.name"].AsString() != group || a["messaging.kafka.offset"].AsInt64() != 0 ||
		a["inbox.outcome"].AsString() != "processed" {
		t.Errorf("span %s parent %s attributes %v", span.SpanContext.TraceID(), span.Parent.SpanID(), span.Attributes)
	}
	if e.effects(t, "e-1") != 1 {
		t.Error("the record was not processed")
	}
}

// Batch mode: one consumer span per record, as the single path makes it: the record's trace,
// the handler's spans its children, outcome and attempts; a record whose handler fails in the
// batch keeps its one span through the single path (exception events of its own attempts only).
func TestBatchSpansAreTheSinglePaths(t *testing.T) {
	e := newEnv(t, 1)
	tp, exp := newTracing(t)
	s := e.settings()
	s.TracerProvider = tp
	s.MaxAttempts = 2
	in := e.newInbox(t, s)
	recs := []*kgo.Record{
		e.record(0, "order-0", "event_key", "e-0", "traceparent", traceparent),
		e.record(1, "order-1", "event_key", "e-1"),
		e.record(2, "order-2", "event_key", "e-0"), // a duplicate within the batch
	}
	var calls atomic.Int32
	base := tracedHandler(tp, nil)
	h := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		if err := base(ctx, tx, rec); err != nil {
			return err
		}
		if hdr(rec, "event_key") == "e-1" {
			calls.Add(1)
			return errors.New("poison record")
		}
		return nil
	}
	res, err := in.ProcessBatch(context.Background(), recs, h)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != inbox.Processed || res[1].Outcome != inbox.DeadLettered || res[2].Outcome != inbox.Duplicate {
		t.Fatalf("results %+v", res)
	}
	var consumer []tracetest.SpanStub
	for _, sp := range exp.GetSpans() {
		if sp.Name == e.topic+" process" {
			consumer = append(consumer, sp)
		}
	}
	if len(consumer) != 3 {
		t.Fatalf("%d consumer spans, want 3: %v", len(consumer), consumer)
	}
	byOffset := map[int64]tracetest.SpanStub{}
	for _, sp := range consumer {
		byOffset[attrs(sp)["messaging.kafka.offset"].AsInt64()] = sp
	}
	first := byOffset[0]
	if first.SpanContext.TraceID().String() != producerTraceID || attrs(first)["inbox.outcome"].AsString() != "processed" ||
		attrs(first)["inbox.attempts"].AsInt64() != 1 || first.Status.Code != codes.Unset {
		t.Errorf("e-0's span: trace %s attributes %v", first.SpanContext.TraceID(), first.Attributes)
	}
	failed := byOffset[1]
	if attrs(failed)["inbox.outcome"].AsString() != "dead_lettered" || attrs(failed)["inbox.attempts"].AsInt64() != 2 ||
		failed.Status.Code != codes.Error || len(failed.Events) != 2 {
		t.Errorf("e-1's span: attributes %v status %v events %v", failed.Attributes, failed.Status, failed.Events)
	}
	if dup := byOffset[2]; attrs(dup)["inbox.outcome"].AsString() != "duplicate" || attrs(dup)["inbox.attempts"].AsInt64() != 1 {
		t.Errorf("the duplicate's span: attributes %v", dup.Attributes)
	}
	// Every handler span is a child of its record's consumer span.
	ids := map[trace.SpanID]bool{}
	for _, sp := range consumer {
		ids[sp.SpanContext.SpanID()] = true
	}
	for _, sp := range exp.GetSpans() {
		if sp.Name == "handler" && !ids[sp.Parent.SpanID()] {
			t.Errorf("a handler span's parent %s is no consumer span", sp.Parent.SpanID())
		}
	}
}
