// Package inbox is the consumer side of the outbox pattern: it makes the duplicates of an
// at-least-once Kafka delivery harmless.
//
// For each record it records "consumer C processed event_key K" in the consumer's own
// MySQL/MariaDB database, in the same transaction as the business change and before it, so a
// second delivery of K finds the row and is acknowledged without running the handler again.
// Optionally it checks a per-aggregate version (stale records skipped; a record ahead of its
// aggregate's next version parked and applied by itself once its predecessor is), retries
// failed attempts with exponential backoff, optionally sends records whose attempts are used up
// to delayed retry tiers (copies on retry topics, Settings.RetryTiers) and sends records that
// keep failing to a dead-letter topic. The contract every helper of the project follows is inbox/CONTRACT.md;
// the tables are in migrations/0004_inbox.sql and 0006_inbox_parked.sql.
//
// Use [Inbox.Process] from your own poll loop, or [Runner] to have the package own a franz-go
// consumer loop (poll, process in partition order, commit processed offsets synchronously).
// Batch mode (Settings.BatchMaxRecords > 1, [Inbox.ProcessBatch]) settles a poll's records in
// one database transaction, with the same outcomes.
package inbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Outcome is how a record was settled. Its string form is the one of the scenario protocol.
type Outcome string

// The outcomes of [Inbox.Process].
const (
	// Processed: the handler ran and its transaction (with the inbox row) committed.
	Processed Outcome = "processed"
	// Duplicate: the inbox already had (consumer, event_key); the handler did not run.
	Duplicate Outcome = "duplicate"
	// Stale: the record's version is <= the stored version; the inbox row was committed, the
	// handler did not run.
	Stale Outcome = "stale"
	// Parked: a version gap under [GapPark]; the record is stored in the parked table (handler
	// not run) and applied by itself once the version before it has been ([Resumed]).
	Parked Outcome = "parked"
	// Resumed: a parked record applied by itself once the version before it was (the handler
	// ran with the record rebuilt from the parked row, and its transaction committed).
	Resumed Outcome = "resumed"
	// DeadLettered: the record went to the dead-letter topic (handler failed max_attempts
	// times, missing event_key header, invalid version, gap under [GapDeadLetter] or
	// [GapRetry], a parked record past its gap deadline).
	DeadLettered Outcome = "dead_lettered"
	// Retried: the record's attempts were used up and a copy of it was sent to the next
	// retry tier's topic (Settings.RetryTiers; acknowledged before the outcome is reported).
	Retried Outcome = "retried"
	// Compensated: a parked record past its gap deadline was handed to Hooks.OnGapExpired
	// (instead of the dead-letter topic), which returned nil; the parked row is deleted.
	Compensated Outcome = "compensated"
)

// GapPolicy says what to do with a record whose version is more than one past the stored one.
type GapPolicy string

const (
	// GapPark stores the record in the parked table (outcome [Parked]; its offset may be
	// committed) and applies it by itself once the version before it has been applied
	// (outcome [Resumed]); past Settings.GapDeadline the sweep dead-letters it (or hands it to
	// Hooks.OnGapExpired). The default.
	GapPark GapPolicy = "park"
	// GapDeadLetter dead-letters the record at once with reason "version gap: expected N, got
	// M" (outcome [DeadLettered]): what GapPark did before parked versions existed.
	GapDeadLetter GapPolicy = "dead_letter"
	// GapRetry counts the gap as a failed attempt and retries with backoff (an earlier version
	// may be applied meanwhile by another partition's consumer), then dead-letters.
	GapRetry GapPolicy = "retry"
)

// Handler does the business change of one record with tx, the inbox transaction. It must not
// commit or roll back tx. A non-nil error rolls the whole attempt back (inbox row included) and
// counts as a failed attempt; its text becomes the dlq_reason header if the record is
// dead-lettered. An error that is or wraps (%w) an infrastructure error ([IsInfrastructureError],
// e.g. the *mysql.MySQLError of a deadlock returned as is) is not an attempt: the record is
// redone, up to Settings.OutageBudget. Return an error that does not wrap it to make it count.
type Handler func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error

// Hooks are called at fixed points of [Inbox.Process] (for metrics, tracing, and the scenario
// tests' crash points). Nil hooks are skipped.
type Hooks struct {
	// BeforeCommit runs after the handler succeeded, right before the database commit.
	BeforeCommit func(rec *kgo.Record)
	// AfterCommit runs once the record is settled (database transaction ended and, for
	// DeadLettered, the dead letter acknowledged), for every outcome, before the Kafka offset
	// may be committed; also for the records settled by themselves (Resumed parked records,
	// and a sweep's Stale, DeadLettered or Compensated ones: rec is then rebuilt from the
	// parked row, with the original topic, partition and offset).
	AfterCommit func(rec *kgo.Record, res Result)
	// OnGapExpired, when set, replaces the dead letter of a parked record whose gap deadline
	// passed (the compensation hook): it gets the record rebuilt from the parked row and when
	// it was parked. It runs outside any inbox transaction (the sweep holds the aggregate's
	// version row locked meanwhile, so do not write that row). nil: the parked row is deleted
	// (outcome [Compensated]); an error: the row stays and the next sweep calls it again.
	OnGapExpired func(rec *kgo.Record, parkedAt time.Time) error
}

// VersionFunc extracts the version of a record. ok=false means the record has no version (no
// version check); a non-nil error makes the record a poison record (dead-lettered at once with
// the error text as reason).
type VersionFunc func(rec *kgo.Record) (version int64, ok bool, err error)

// Settings configure an [Inbox]. Zero values take the documented defaults.
type Settings struct {
	// Consumer is this consumer's name: part of the inbox key, and the default Kafka group id
	// of a [Runner]. Required.
	Consumer string
	// InboxTable is the inbox table, "name" or "schema.name". Default "outbox_inbox".
	InboxTable string
	// VersionTable is the version table. Default "outbox_inbox_version".
	VersionTable string
	// ParkedTable is the table of parked records (migrations/0006_inbox_parked.sql). Default
	// "outbox_inbox_parked".
	ParkedTable string
	// EventKeyHeader is the header holding the event key. Default "event_key".
	EventKeyHeader string
	// VersionHeader turns the version check on: the header holding the version as decimal
	// text. Empty: no version check (unless VersionFunc is set). A record without the header
	// is processed without version check (the relay leaves the header out for a NULL
	// version); a value that is not an integer (empty included) dead-letters the record at once.
	VersionHeader string
	// VersionFunc, when set, gives the version instead of VersionHeader.
	VersionFunc VersionFunc
	// AggregateTypeHeader is the header holding the aggregate type for the version check.
	// Default "aggregate_type". The aggregate id is the record key.
	AggregateTypeHeader string
	// GapPolicy is GapPark (default), GapDeadLetter or GapRetry.
	GapPolicy GapPolicy
	// GapDeadline is how long a parked record may wait for the version before it; past it the
	// sweep dead-letters it (or calls Hooks.OnGapExpired). Default 1 h.
	GapDeadline time.Duration
	// ParkSweepInterval is how often a [Runner] sweeps the parked table ([Inbox.SweepParked]),
	// also once before the first poll: rows whose predecessor was applied are resumed, stale
	// ones removed, expired ones dead-lettered. Default 10 s.
	ParkSweepInterval time.Duration
	// MaxAttempts is the number of attempts before a record is dead-lettered (or sent to its
	// next retry tier). Default 5.
	MaxAttempts int
	// BackoffInitial is the wait after the first failed attempt; it doubles after each further
	// failure. Default 100 ms.
	BackoffInitial time.Duration
	// BackoffMax caps the wait between attempts. Default 10 s.
	BackoffMax time.Duration
	// OutageBudget is how long an infrastructure error (see [IsInfrastructureError]: the
	// database unreachable, a lost connection, a read-only server, a deadlock, ...) may last for
	// one record. Such errors are retried with the same backoff without counting as attempts;
	// once the record has failed only with them for longer than this, Process returns an
	// [*OutageError] and the record stays unsettled. Default 5 min.
	OutageBudget time.Duration
	// RetryTiers are the delays of the retry tiers (inbox/CONTRACT.md, "Retry tiers"): a record
	// whose MaxAttempts are used up by handler or data errors is not dead-lettered but copied
	// to the next tier's topic (outcome [Retried]) and processed again from there once the
	// tier's delay has passed; after the last tier it is dead-lettered. Per-key order is
	// broken while a record waits in a tier. Empty (the default): blocking retries only.
	// A topic may have its own (Topics).
	RetryTiers []time.Duration
	// RetryTopicFormat names the topic of tier n (1-based) of topic T: "{topic}" is replaced
	// by T and "{n}" by n. Default "{topic}.retry.{n}".
	RetryTopicFormat string
	// DeadLetterTopic receives records that are dead-lettered. Required.
	DeadLetterTopic string
	// DeadLetterTimeout bounds producing one dead letter (acks=all); past it Process returns
	// an error. Default 30 s.
	DeadLetterTimeout time.Duration
	// InboxRetention is how long inbox rows are kept: read by outbox-relay prune --inbox
	// (--older-than, --topic-retention), see [Inbox.InboxRetention]; the helper deletes
	// nothing itself. Default 7 days.
	InboxRetention time.Duration
	// Topics override, per topic, MaxAttempts, BackoffInitial, BackoffMax, RetryTiers,
	// GapPolicy, GapDeadline and InboxRetention (inbox/CONTRACT.md, "Per-topic settings"). The
	// settings of a record are those of its original_topic header when present (a retry
	// copy), else of its own topic; a topic not in the map uses the consumer-wide values.
	Topics map[string]TopicSettings
	// Registerer, when set, receives the inbox's Prometheus metrics (inbox/CONTRACT.md,
	// "Metrics"): outbox_inbox_records_total, outbox_inbox_parked_records,
	// outbox_inbox_parked_oldest_seconds and (with a [Runner]) outbox_inbox_consumer_lag.
	// nil (the default): no metrics (the global default registry is never used implicitly;
	// pass prometheus.DefaultRegisterer for it). Inboxes of different consumers may share a
	// registry.
	Registerer prometheus.Registerer
	// BatchMaxRecords turns batch mode on when > 1 (inbox/CONTRACT.md, "Batch mode"): a
	// [Runner] polls up to this many records (waiting up to BatchMaxWait for more once one
	// arrived) and settles each run of ordinary records with [Inbox.ProcessBatch], in one
	// database transaction; retry copies still go one at a time through [Inbox.Process].
	// Consumer-wide. 0 means the default 1 (batch mode off); allowed 1 ..= 10000.
	BatchMaxRecords int
	// BatchMaxWait is how long a [Runner] in batch mode waits for more records once a poll
	// returned fewer than BatchMaxRecords. 0 means the default 20 ms; must not be negative.
	BatchMaxWait time.Duration
	// Hooks are called at fixed points of the processing of each record.
	Hooks Hooks
	// TracerProvider gives the tracer of the consumer span of each record (inbox/CONTRACT.md,
	// "Trace context"). Default: otel.GetTracerProvider() at the time of each record, so a
	// provider installed with otel.SetTracerProvider is used; without one the span is a no-op.
	TracerProvider trace.TracerProvider
	// Propagator extracts the producer's trace context from the record's headers. Default:
	// propagation.TraceContext{} (W3C "traceparent"/"tracestate", what the relay writes).
	Propagator propagation.TextMapPropagator
}

// Result says how a record was settled.
type Result struct {
	// Outcome is how the record was settled.
	Outcome Outcome
	// Attempts is the number of attempts counted (database transactions that reached a result
	// or failed for the record or the handler; those ended by an infrastructure error are not
	// counted); 0 for a record dead-lettered before any attempt (missing event_key, invalid
	// version).
	Attempts int
	// Reason is the dlq_reason of a DeadLettered record, the last error (retry_error) of a
	// Retried one, the gap of a Parked one ("version
	// gap: expected N, got M"; "...; parked since T" for an expired one), else empty.
	Reason string
}

// Producer produces records synchronously; *kgo.Client implements it. The dead letters are
// produced with it, so the client must use acks=all (kgo's default).
type Producer interface {
	ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults
}

// Inbox processes records exactly once per (consumer, event_key) against one database.
// It is safe for concurrent use, as long as the records of one partition are processed one at
// a time in offset order.
type Inbox struct {
	db       *sql.DB
	producer Producer
	s        Settings
	defaults topicSettings            // the consumer-wide per-topic settings
	topics   map[string]topicSettings // the topics that override them, resolved
	metrics  *metrics                 // nil: no Registerer
	group    string                   // messaging.consumer.group.name of the spans: Consumer, or the Runner's group
	log      *slog.Logger
	insert   string
	selVer   string
	stored   string
	upsert   string
	pk       parkedSQL
	bsql     batchSQL

	flavorMu sync.Mutex
	flavor   serverFlavor // detected once (batch mode), then cached
}

var identRE = regexp.MustCompile(`^[A-Za-z0-9_$]+(\.[A-Za-z0-9_$]+)?$`)

func quoteTable(name string) (string, error) {
	if !identRE.MatchString(name) {
		return "", fmt.Errorf("inbox: invalid table name %q", name)
	}
	return "`" + strings.ReplaceAll(name, ".", "`.`") + "`", nil
}

// New checks the settings, fills in the defaults and returns an Inbox that uses db (the
// consumer's database, holding the inbox tables) and produces dead letters with producer.
// It returns an error if Consumer or DeadLetterTopic is empty, a table name is not a plain
// identifier, or a setting is out of range.
func New(db *sql.DB, producer Producer, s Settings) (*Inbox, error) {
	if s.Consumer == "" {
		return nil, errors.New("inbox: Settings.Consumer is required")
	}
	if s.DeadLetterTopic == "" {
		return nil, errors.New("inbox: Settings.DeadLetterTopic is required")
	}
	if db == nil || producer == nil {
		return nil, errors.New("inbox: db and producer are required")
	}
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&s.InboxTable, "outbox_inbox")
	def(&s.VersionTable, "outbox_inbox_version")
	def(&s.EventKeyHeader, "event_key")
	def(&s.AggregateTypeHeader, "aggregate_type")
	if s.GapPolicy == "" {
		s.GapPolicy = GapPark
	}
	if s.GapPolicy != GapPark && s.GapPolicy != GapDeadLetter && s.GapPolicy != GapRetry {
		return nil, fmt.Errorf("inbox: invalid GapPolicy %q (park, dead_letter or retry)", s.GapPolicy)
	}
	def(&s.ParkedTable, "outbox_inbox_parked")
	def(&s.RetryTopicFormat, "{topic}.retry.{n}")
	for _, d := range s.RetryTiers {
		if d < 0 {
			return nil, errors.New("inbox: RetryTiers must not be negative")
		}
	}
	s.RetryTiers = slices.Clone(s.RetryTiers)
	if s.InboxRetention == 0 {
		s.InboxRetention = 7 * 24 * time.Hour
	}
	if s.InboxRetention < 0 {
		return nil, errors.New("inbox: InboxRetention must not be negative")
	}
	if s.GapDeadline == 0 {
		s.GapDeadline = time.Hour
	}
	if s.ParkSweepInterval == 0 {
		s.ParkSweepInterval = 10 * time.Second
	}
	if s.GapDeadline < 0 || s.ParkSweepInterval < 0 {
		return nil, errors.New("inbox: GapDeadline and ParkSweepInterval must not be negative")
	}
	if s.MaxAttempts == 0 {
		s.MaxAttempts = 5
	}
	if s.BackoffInitial == 0 {
		s.BackoffInitial = 100 * time.Millisecond
	}
	if s.BackoffMax == 0 {
		s.BackoffMax = 10 * time.Second
	}
	if s.DeadLetterTimeout == 0 {
		s.DeadLetterTimeout = 30 * time.Second
	}
	if s.OutageBudget == 0 {
		s.OutageBudget = 5 * time.Minute
	}
	if s.BatchMaxRecords == 0 {
		s.BatchMaxRecords = 1
	}
	if s.BatchMaxRecords < 1 || s.BatchMaxRecords > maxBatchRecords {
		return nil, fmt.Errorf("inbox: Settings.BatchMaxRecords = %d is out of range (allowed 1 ..= %d; 1: batch mode off)",
			s.BatchMaxRecords, maxBatchRecords)
	}
	if s.BatchMaxWait == 0 {
		s.BatchMaxWait = 20 * time.Millisecond
	}
	if s.BatchMaxWait < 0 {
		return nil, fmt.Errorf("inbox: Settings.BatchMaxWait = %s must not be negative", s.BatchMaxWait)
	}
	if s.MaxAttempts < 1 || s.BackoffInitial < 0 || s.BackoffMax < s.BackoffInitial || s.DeadLetterTimeout < 0 || s.OutageBudget < 0 {
		return nil, errors.New("inbox: MaxAttempts must be >= 1, 0 <= BackoffInitial <= BackoffMax and OutageBudget >= 0")
	}
	defaults, topics, err := resolveTopics(s)
	if err != nil {
		return nil, err
	}
	tiers := len(s.RetryTiers) > 0
	for _, ts := range topics {
		tiers = tiers || len(ts.retryTiers) > 0
	}
	if tiers && !strings.Contains(s.RetryTopicFormat, "{n}") {
		return nil, fmt.Errorf("inbox: RetryTopicFormat %q lacks {n}", s.RetryTopicFormat)
	}
	s.Topics = maps.Clone(s.Topics)
	m, err := newMetrics(s.Registerer)
	if err != nil {
		return nil, err
	}
	it, err := quoteTable(s.InboxTable)
	if err != nil {
		return nil, err
	}
	vt, err := quoteTable(s.VersionTable)
	if err != nil {
		return nil, err
	}
	pt, err := quoteTable(s.ParkedTable)
	if err != nil {
		return nil, err
	}
	return &Inbox{
		db:       db,
		producer: producer,
		s:        s,
		defaults: defaults,
		topics:   topics,
		metrics:  m,
		group:    s.Consumer,
		log:      slog.Default(),
		insert:   "INSERT INTO " + it + " (consumer, event_key, topic, kafka_partition, kafka_offset) VALUES (?, ?, ?, ?, ?)",
		selVer:   "SELECT version FROM " + vt + " WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? FOR UPDATE",
		stored:   "SELECT version FROM " + vt + " WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ?",
		pk:       newParkedSQL(pt),
		bsql:     newBatchSQL(it, vt),
		upsert: "INSERT INTO " + vt + " (consumer, aggregate_type, aggregate_id, version) VALUES (?, ?, ?, ?)" +
			" ON DUPLICATE KEY UPDATE version = VALUES(version)",
	}, nil
}

// Settings returns the settings in use, defaults filled in.
func (in *Inbox) Settings() Settings { return in.s }

// header returns the value of the last header named name.
func header(rec *kgo.Record, name string) (string, bool) {
	for i := len(rec.Headers) - 1; i >= 0; i-- {
		if rec.Headers[i].Key == name {
			return string(rec.Headers[i].Value), true
		}
	}
	return "", false
}

func (in *Inbox) version(rec *kgo.Record) (int64, bool, error) {
	if in.s.VersionFunc != nil {
		return in.s.VersionFunc(rec)
	}
	if in.s.VersionHeader == "" {
		return 0, false, nil
	}
	v, ok := header(rec, in.s.VersionHeader)
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("invalid version header: %s", v)
	}
	return n, true, nil
}

// gapError is a version gap (kept apart from other failures for the park policy).
type gapError struct {
	expected, got  int64
	aggType, aggID string
}

func (e *gapError) Error() string {
	return fmt.Sprintf("version gap: expected %d, got %d", e.expected, e.got)
}

// Process settles one record: it runs h in a transaction together with the inbox row (and the
// version check when configured), retries failed attempts with backoff, and dead-letters the
// record when it cannot be processed. It returns how the record was settled; the caller may then
// commit the record's offset + 1 to Kafka. A record ahead of its aggregate's next version is
// parked under GapPark (outcome Parked); after a record Processed with a version, Process
// applies the aggregate's parked successors (outcome Resumed, through the hooks) before it
// returns (an error from them is returned with the record's own Result).
//
// Handler errors and data errors (a version gap under GapRetry) count toward MaxAttempts; when
// they are used up the record goes to its next retry tier (Settings.RetryTiers: a copy on the
// tier's topic, outcome Retried) or, after the last one, to the dead-letter topic;
// infrastructure errors ([IsInfrastructureError]) are retried with the same backoff without
// counting, up to Settings.OutageBudget. Process does not wait for a retry copy's retry_at:
// the [Runner] does (with your own poll loop, pause the partition until [RetryAt]).
//
// A non-nil error means the record is NOT settled and its offset must not be committed: the
// dead letter could not be produced, the database stayed unreachable longer than the outage
// budget (an [*OutageError]; the consumer should stop), or ctx ended first.
//
// The record is processed inside a consumer span "<topic> process" whose parent is the trace
// context of the record's headers (W3C traceparent/tracestate; a new trace without them): h
// gets a ctx carrying that span, so the spans it starts join the producer's trace
// (inbox/CONTRACT.md, "Trace context"; Settings.TracerProvider).
func (in *Inbox) Process(ctx context.Context, rec *kgo.Record, h Handler) (Result, error) {
	res, err := in.processOne(ctx, rec, h, nil)
	if err == nil && res.Outcome == Processed {
		// Parked versions: the aggregate's parked successors, in version order, before the
		// next record of the partition.
		if key, ok := in.versionKey(rec); ok {
			if _, err := in.resumeAfter(ctx, key, h); err != nil {
				return res, err
			}
		}
	}
	return res, err
}

// processOne is one record (or, with parked, a parked row's record) in its consumer span.
func (in *Inbox) processOne(ctx context.Context, rec *kgo.Record, h Handler, parked *versionKey) (Result, error) {
	ctx, span := in.startSpan(ctx, rec)
	res, err := in.process(ctx, rec, h, parked)
	endSpan(span, res, err)
	return res, err
}

// settled runs the AfterCommit hook and returns res.
func (in *Inbox) settled(rec *kgo.Record, res Result) (Result, error) {
	in.metrics.settled(in.s.Consumer, settingsTopic(rec), res.Outcome)
	if f := in.s.Hooks.AfterCommit; f != nil {
		f(rec, res)
	}
	return res, nil
}

// process is Process inside the consumer span (carried by ctx). parked: the record is a parked
// row's (its slot in the parked table), applied by itself.
func (in *Inbox) process(ctx context.Context, rec *kgo.Record, h Handler, parked *versionKey) (Result, error) {
	return in.processAfter(ctx, rec, h, parked, nil)
}

// processAfter is process after an attempt already made elsewhere: failed, the error of a batch
// run that failed at this record (inbox/CONTRACT.md, "Batch mode" 5), is its first attempt, and
// the loop goes on from there (the backoff, attempt 2, or at once the tier or dead letter when
// it was the last). nil: none.
func (in *Inbox) processAfter(ctx context.Context, rec *kgo.Record, h Handler, parked *versionKey, failed error) (Result, error) {
	key, _ := header(rec, in.s.EventKeyHeader)
	if key == "" {
		return in.deadLetterParked(ctx, rec, Result{Outcome: DeadLettered, Reason: "missing " + in.s.EventKeyHeader + " header"}, parked)
	}
	version, hasVersion, err := in.version(rec)
	if err != nil {
		return in.deadLetterParked(ctx, rec, Result{Outcome: DeadLettered, Reason: err.Error()}, parked)
	}

	ts := in.settingsOf(rec) // the record's topic's (its original topic's for a copy)
	attempts := 0            // attempts that count: not those ended by an infrastructure error
	retries := ts.backoff()
	var outageRetries *backoff.ExponentialBackOff
	var outageSince time.Time
	for {
		var out Outcome
		var err error
		if failed != nil {
			err, failed = failed, nil
		} else {
			out, err = in.attempt(ctx, rec, key, version, hasVersion, h, parked)
		}
		if err == nil && out == Duplicate && parked != nil {
			// Applied before (a redelivery of it was processed): not parked any more.
			err = in.deleteParked(ctx, *parked)
		}
		if err == nil {
			attempts++
			if out == Processed && parked != nil {
				out = Resumed
			}
			return in.settled(rec, Result{Outcome: out, Attempts: attempts})
		}
		var gap *gapError
		if errors.As(err, &gap) {
			switch {
			case parked != nil:
				// Still ahead (a sweep read an older state): it stays parked.
				return in.settled(rec, Result{Outcome: Parked, Attempts: attempts + 1, Reason: err.Error()})
			case ts.gapPolicy == GapDeadLetter:
				return in.deadLetter(ctx, rec, Result{Outcome: DeadLettered, Attempts: attempts + 1, Reason: err.Error()})
			case ts.gapPolicy == GapPark:
				ok, perr := in.park(ctx, rec, key, versionKey{gap.aggType, gap.aggID, gap.got}, err.Error(), ts.gapDeadline)
				if perr == nil && ok {
					return in.settled(rec, Result{Outcome: Parked, Attempts: attempts + 1, Reason: err.Error()})
				}
				if perr == nil {
					continue // the gap closed meanwhile: the attempt is redone at once
				}
				err, gap = perr, nil
			}
		}
		var wait time.Duration
		if gap == nil && IsInfrastructureError(err) {
			// Not an attempt: the record is redone once the database answers again.
			trace.SpanFromContext(ctx).RecordError(err, trace.WithAttributes(
				attrInboxAttempt.Int(attempts+1), attrInboxOutage.Bool(true)))
			if outageRetries == nil {
				outageRetries, outageSince = ts.backoff(), time.Now()
			}
			down := time.Since(outageSince)
			if down >= in.s.OutageBudget {
				return Result{Attempts: attempts}, &OutageError{
					Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
					Lasted: down, Budget: in.s.OutageBudget, Err: err,
				}
			}
			wait = min(outageRetries.NextBackOff(), in.s.OutageBudget-down)
		} else {
			// A failed attempt: an exception event on the consumer span.
			attempts++
			outageRetries = nil
			trace.SpanFromContext(ctx).RecordError(err, trace.WithAttributes(attrInboxAttempt.Int(attempts)))
			if attempts >= ts.maxAttempts {
				return in.exhausted(ctx, rec, Result{Outcome: DeadLettered, Attempts: attempts, Reason: err.Error()}, parked)
			}
			wait = retries.NextBackOff()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return Result{Attempts: attempts}, fmt.Errorf("inbox: record %s/%d@%d not settled: %w", rec.Topic, rec.Partition, rec.Offset, ctx.Err())
		case <-t.C:
		}
	}
}

// backoff is the wait schedule between attempts: BackoffInitial doubling up to BackoffMax (the
// topic's), no jitter (the same schedule in every helper).
func (ts topicSettings) backoff() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval: ts.backoffInitial,
		Multiplier:      2,
		MaxInterval:     ts.backoffMax,
	}
	b.Reset()
	return b
}

// OutageError is returned by [Inbox.Process] (and so [Runner.Run]) when a record failed only
// with infrastructure errors (see [IsInfrastructureError]) for longer than
// Settings.OutageBudget. The record is not settled: its offset, and those after it, must not be
// committed; a restarted consumer resumes with it.
type OutageError struct {
	// Topic, Partition and Offset locate the record in hand.
	Topic     string
	Partition int32
	Offset    int64
	// Lasted is how long the record failed with infrastructure errors; Budget the setting.
	Lasted, Budget time.Duration
	// Err is the last infrastructure error.
	Err error
}

func (e *OutageError) Error() string {
	return fmt.Sprintf("inbox: database outage longer than the outage budget (%s) at record %s/%d@%d, not settled: %v",
		e.Budget, e.Topic, e.Partition, e.Offset, e.Err)
}

// Unwrap returns the last infrastructure error.
func (e *OutageError) Unwrap() error { return e.Err }

// Server errors that are the infrastructure's, not the record's (inbox/CONTRACT.md, "Attempts
// and outages"): lock wait timeout, deadlock (both roll the transaction back), read-only server
// (failover), server shutdown, connection killed, client disconnected; and the client's own
// connection errors (CR_* codes) when a proxy or server reports them.
var infrastructureCodes = map[uint16]bool{
	1205: true, 1213: true, 1290: true, 1836: true, 1053: true, 1077: true, 1927: true, 4031: true,
	2002: true, 2003: true, 2006: true, 2013: true, 2055: true,
}

// noConnectionError: BeginTx failed (no connection could be had), an infrastructure error
// whatever its cause.
type noConnectionError struct{ err error }

func (e *noConnectionError) Error() string { return "cannot begin a transaction: " + e.err.Error() }
func (e *noConnectionError) Unwrap() error { return e.err }

// IsInfrastructureError reports whether err (or an error it wraps, handler errors included)
// means the database could not do the work rather than the record being wrong: a connection
// that cannot be made or was lost (net errors, io.EOF, driver.ErrBadConn, mysql.ErrInvalidConn,
// sql.ErrConnDone), or a server error 1205, 1213, 1290, 1836, 1053, 1077, 1927, 4031, 2002,
// 2003, 2006, 2013, 2055; and a transaction that could not begin at all. Such errors are retried
// without counting as attempts.
func IsInfrastructureError(err error) bool {
	var nc *noConnectionError
	if errors.As(err, &nc) {
		return true
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return infrastructureCodes[me.Number]
	}
	var ne net.Error
	return errors.As(err, &ne) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, sql.ErrConnDone) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// attempt is one database transaction (contract step 2.1-2.6). With parked, the parked row
// leaves the table in the transaction that applies it (or finds it stale).
func (in *Inbox) attempt(ctx context.Context, rec *kgo.Record, key string, version int64, hasVersion bool, h Handler, parked *versionKey) (Outcome, error) {
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		if ctx.Err() == nil {
			// No connection at all: the infrastructure's, whatever the error.
			return "", &noConnectionError{err}
		}
		return "", err
	}
	defer func() { _ = tx.Rollback() }() // no-op after a commit

	at := originOf(rec)
	if _, err := tx.ExecContext(ctx, in.insert, in.s.Consumer, key, at.topic, at.partition, at.offset); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1062 {
			return Duplicate, nil
		}
		return "", err
	}
	unpark := func() error {
		if parked == nil {
			return nil
		}
		_, err := tx.ExecContext(ctx, in.pk.delete, in.s.Consumer, parked.aggType, parked.aggID, parked.version)
		return err
	}
	if hasVersion {
		aggType, _ := header(rec, in.s.AggregateTypeHeader)
		aggID := string(rec.Key)
		var stored int64
		err := tx.QueryRowContext(ctx, in.selVer, in.s.Consumer, aggType, aggID).Scan(&stored)
		switch {
		case errors.Is(err, sql.ErrNoRows) || (err == nil && version == stored+1):
			if _, err := tx.ExecContext(ctx, in.upsert, in.s.Consumer, aggType, aggID, version); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case version <= stored:
			// The inbox row stays: a redelivery of this stale event is a duplicate.
			if err := unpark(); err != nil {
				return "", err
			}
			if err := tx.Commit(); err != nil {
				return "", err
			}
			return Stale, nil
		default:
			return "", &gapError{expected: stored + 1, got: version, aggType: aggType, aggID: aggID}
		}
	}
	if err := h(ctx, tx, rec); err != nil {
		return "", err
	}
	if err := unpark(); err != nil {
		return "", err
	}
	if f := in.s.Hooks.BeforeCommit; f != nil {
		f(rec)
	}
	if err := tx.Commit(); err != nil {
		return "", err
	}
	return Processed, nil
}

// deadLetter produces rec to the dead-letter topic with the dlq_* headers and waits for the
// acknowledgement, then runs the AfterCommit hook.
func (in *Inbox) deadLetter(ctx context.Context, rec *kgo.Record, res Result) (Result, error) {
	if err := in.produceDeadLetter(ctx, rec, res); err != nil {
		return Result{}, err
	}
	return in.settled(rec, res)
}

// deadLetterParked is deadLetter; a parked record's row is deleted once the dead letter is
// acknowledged, before the AfterCommit hook.
func (in *Inbox) deadLetterParked(ctx context.Context, rec *kgo.Record, res Result, parked *versionKey) (Result, error) {
	if err := in.produceDeadLetter(ctx, rec, res); err != nil {
		return Result{}, err
	}
	if parked != nil {
		if err := in.deleteParked(ctx, *parked); err != nil {
			// The dead letter is out; the row stays until a sweep finds it applied or expired
			// again (a second dead letter at worst, never a loss).
			in.log.Warn("inbox: a dead-lettered parked row could not be removed", "consumer", in.s.Consumer, "err", err)
		}
	}
	return in.settled(rec, res)
}

// produceDeadLetter produces rec to the dead-letter topic with the dlq_* headers and waits for
// the acknowledgement.
func (in *Inbox) produceDeadLetter(ctx context.Context, rec *kgo.Record, res Result) error {
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers)+6)
	hs = append(hs, rec.Headers...)
	add := func(k, v string) { hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	// A retry copy's dead letter names the original record (its original_* headers).
	at := originOf(rec)
	add("dlq_reason", res.Reason)
	add("dlq_topic", at.topic)
	add("dlq_partition", strconv.FormatInt(int64(at.partition), 10))
	add("dlq_offset", strconv.FormatInt(at.offset, 10))
	add("dlq_consumer", in.s.Consumer)
	add("dlq_attempts", strconv.Itoa(res.Attempts))
	dl := &kgo.Record{Topic: in.s.DeadLetterTopic, Key: rec.Key, Value: rec.Value, Headers: hs}
	pctx, cancel := context.WithTimeout(ctx, in.s.DeadLetterTimeout)
	defer cancel()
	if err := in.producer.ProduceSync(pctx, dl).FirstErr(); err != nil {
		return fmt.Errorf("inbox: dead letter of %s/%d@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, in.s.DeadLetterTopic, err)
	}
	return nil
}
