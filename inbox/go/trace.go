package inbox

import (
	"context"
	"strconv"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationName names the tracer of this package (the instrumentation scope).
const instrumentationName = "github.com/outbox-relay/outbox-relay/inbox/go"

// The span attributes of inbox/CONTRACT.md, "Trace context" (OpenTelemetry messaging semantic
// conventions, plus the inbox's own).
const (
	attrMessagingSystem   = attribute.Key("messaging.system")
	attrOperationType     = attribute.Key("messaging.operation.type")
	attrDestinationName   = attribute.Key("messaging.destination.name")
	attrPartitionID       = attribute.Key("messaging.destination.partition.id")
	attrKafkaPartition    = attribute.Key("messaging.kafka.destination.partition")
	attrKafkaOffset       = attribute.Key("messaging.kafka.offset")
	attrKafkaMessageKey   = attribute.Key("messaging.kafka.message.key")
	attrConsumerGroupName = attribute.Key("messaging.consumer.group.name")
	attrInboxConsumer     = attribute.Key("inbox.consumer")
	attrInboxEventKey     = attribute.Key("inbox.event_key")
	attrInboxOutcome      = attribute.Key("inbox.outcome")
	attrInboxAttempts     = attribute.Key("inbox.attempts")
	attrInboxAttempt      = attribute.Key("inbox.attempt")
	attrInboxOutage       = attribute.Key("inbox.outage")
	outcomeUnsettled      = "unsettled"
)

// headerCarrier reads the headers of a record for a [propagation.TextMapPropagator] (W3C:
// "traceparent", "tracestate"). Header names are compared exactly (the relay writes them in
// lower case); of repeated headers the last wins, as for the inbox's own headers.
type headerCarrier struct{ rec *kgo.Record }

// Get returns the value of the last header named key, or "".
func (c headerCarrier) Get(key string) string {
	v, _ := header(c.rec, key)
	return v
}

// Set is not used (the inbox only extracts); it appends a header.
func (c headerCarrier) Set(key, value string) {
	c.rec.Headers = append(c.rec.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

// Keys returns the header names.
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c.rec.Headers))
	for _, h := range c.rec.Headers {
		keys = append(keys, h.Key)
	}
	return keys
}

// startSpan extracts the record's trace context and starts the consumer span "<topic> process"
// as its child (a new trace when the record has none). The returned context carries the span.
func (in *Inbox) startSpan(ctx context.Context, rec *kgo.Record) (context.Context, trace.Span) {
	tp := in.s.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := in.s.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	ctx = prop.Extract(ctx, headerCarrier{rec})
	tracer := tp.Tracer(instrumentationName)
	ctx, span := tracer.Start(ctx, rec.Topic+" process", trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		return ctx, span
	}
	attrs := []attribute.KeyValue{
		attrMessagingSystem.String("kafka"),
		attrOperationType.String("process"),
		attrDestinationName.String(rec.Topic),
		attrPartitionID.String(strconv.FormatInt(int64(rec.Partition), 10)),
		attrKafkaPartition.Int64(int64(rec.Partition)),
		attrKafkaOffset.Int64(rec.Offset),
		attrConsumerGroupName.String(in.group),
		attrInboxConsumer.String(in.s.Consumer),
	}
	if len(rec.Key) > 0 && utf8.Valid(rec.Key) {
		attrs = append(attrs, attrKafkaMessageKey.String(string(rec.Key)))
	}
	if key, _ := header(rec, in.s.EventKeyHeader); key != "" {
		attrs = append(attrs, attrInboxEventKey.String(key))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// endSpan records how the record was settled and ends the span: status error for a
// dead-lettered record (description: the dlq_reason) and for a record not settled (err).
func endSpan(span trace.Span, res Result, err error) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	switch {
	case err != nil:
		span.SetAttributes(attrInboxOutcome.String(outcomeUnsettled), attrInboxAttempts.Int(res.Attempts))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	default:
		span.SetAttributes(attrInboxOutcome.String(string(res.Outcome)), attrInboxAttempts.Int(res.Attempts))
		if res.Outcome == DeadLettered { // a parked record is waiting, not failed
			span.SetStatus(codes.Error, res.Reason)
		}
	}
}
