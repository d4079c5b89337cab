package inbox

// Batch mode (inbox/CONTRACT.md, "Batch mode"): a run of records settled in one database
// transaction, with the single path's outcomes, rows, hooks, metrics and spans.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
)

const (
	// maxBatchRecords is the largest Settings.BatchMaxRecords.
	maxBatchRecords = 10000
	// maxEventKeyBytes is the event_key column's length (VARBINARY(1020)).
	maxEventKeyBytes = 1020
	// maxDuplicateRedos bounds the immediate redos of a batch whose MySQL INSERT met a row
	// another transaction inserted after the SELECT ... FOR UPDATE (1062); past it the redo
	// waits like after an infrastructure error.
	maxDuplicateRedos = 5
)

// testHookAfterBatchSelect, set by tests only, runs between the MySQL duplicate-finding SELECT
// ... FOR UPDATE and the multi-row INSERT; on MariaDB (no SELECT) right before the INSERT
// IGNORE ... RETURNING, inside the batch's transaction.
var testHookAfterBatchSelect func()

// serverFlavor is the database server's kind, detected once per Inbox.
type serverFlavor int

const (
	flavorUnknown serverFlavor = iota
	flavorMySQL
	flavorMariaDB
)

// batchSQL are the fixed parts of the batch statements (the row lists are built per batch).
type batchSQL struct {
	insertIgnore, insert, selectKeys, selectVersions, upsertVersions, deleteKeys string
}

func newBatchSQL(it, vt string) batchSQL {
	cols := " (consumer, event_key, topic, kafka_partition, kafka_offset) VALUES "
	return batchSQL{
		insertIgnore:   "INSERT IGNORE INTO " + it + cols,
		insert:         "INSERT INTO " + it + cols,
		selectKeys:     "SELECT event_key FROM " + it + " WHERE consumer = ? AND event_key IN (",
		selectVersions: "SELECT aggregate_type, aggregate_id, version FROM " + vt + " WHERE consumer = ? AND (aggregate_type, aggregate_id) IN (",
		upsertVersions: "INSERT INTO " + vt + " (consumer, aggregate_type, aggregate_id, version) VALUES ",
		deleteKeys:     "DELETE FROM " + it + " WHERE consumer = ? AND event_key IN (",
	}
}

// placeholders returns n groups "(?, ?, ...)" of width w, comma-separated.
func placeholders(n, w int) string {
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", w), ", ") + ")"
	var b strings.Builder
	b.Grow(n * (len(one) + 2))
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(one)
	}
	return b.String()
}

// marks returns n "?" comma-separated.
func marks(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }

// mariaDB says whether the server is MariaDB (SELECT VERSION() contains "MariaDB"), asking it
// once per Inbox.
func (in *Inbox) mariaDB(ctx context.Context) (bool, error) {
	in.flavorMu.Lock()
	defer in.flavorMu.Unlock()
	if in.flavor == flavorUnknown {
		var v string
		if err := in.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
			if ctx.Err() == nil && !isServerError(err) {
				return false, &noConnectionError{err}
			}
			return false, err
		}
		in.flavor = flavorMySQL
		if strings.Contains(v, "MariaDB") {
			in.flavor = flavorMariaDB
		}
	}
	return in.flavor == flavorMariaDB, nil
}

func isServerError(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me)
}

// batchState is one ProcessBatch: the records, their results and their consumer spans (started
// when a record first enters a batch transaction, ended when it is settled).
type batchState struct {
	recs    []*kgo.Record
	results []Result
	ctxs    []context.Context
	spans   []trace.Span
	// failed: the handler's error at the position batchAttempts last returned (nil when the
	// batch fell back to single records for another reason).
	failed error
}

// span returns the context carrying record i's consumer span, starting it on first use.
func (in *Inbox) span(ctx context.Context, st *batchState, i int) context.Context {
	if st.spans[i] == nil {
		st.ctxs[i], st.spans[i] = in.startSpan(ctx, st.recs[i])
	}
	return st.ctxs[i]
}

// settle ends record i: metrics, AfterCommit, its span.
func (in *Inbox) settle(ctx context.Context, st *batchState, i int, res Result) {
	in.span(ctx, st, i)
	st.results[i], _ = in.settled(st.recs[i], res)
	endSpan(st.spans[i], res, nil)
	st.spans[i] = nil
}

// ProcessBatch settles recs (in order; normally one poll's run of records of one or more
// partitions, each partition's in offset order) in one database transaction where it can
// (inbox/CONTRACT.md, "Batch mode"), and returns one [Result] per record, in input order: the
// same outcomes [Inbox.Process] gives each record by itself (Processed, Duplicate, Stale,
// Parked, DeadLettered, Retried), with the same inbox, version and parked rows, hooks, metrics
// and consumer spans. h runs for each record with the batch's transaction.
//
//   - Records without event_key, with an invalid version or with an event_key longer than
//     1020 bytes go through [Inbox.Process] first; a second record with the same event_key
//     (compared byte for byte) is a Duplicate of the first and is not inserted.
//   - A handler error (not an infrastructure error) at record i rolls the batch back; records
//     before i are processed again as a batch, record i alone with [Inbox.Process] (its
//     attempts, retry tiers, dead letter; the failed batch attempt is not counted), the records
//     after it as a new batch. A version gap under GapDeadLetter or GapRetry is treated the
//     same way.
//   - An infrastructure error ([IsInfrastructureError]) in a statement, a handler or the
//     commit rolls the batch back and redoes it after the backoff, within Settings.OutageBudget
//     counted from the batch's first such error.
//   - After the commit, the parked successors of the aggregates whose version moved are
//     applied (outcome Resumed, through the hooks), before ProcessBatch returns.
//
// A non-nil error means the batch is not settled: commit no offset of recs. It is an
// [*OutageError] naming the first record of the batch in hand when the outage budget ran out,
// or what [Inbox.Process] returns for a record that went through it (a dead letter that could
// not be produced, ...), or ctx's error. Records settled before the error were settled (a
// redelivery of them is a duplicate).
func (in *Inbox) ProcessBatch(ctx context.Context, recs []*kgo.Record, h Handler) ([]Result, error) {
	st := &batchState{
		recs:    recs,
		results: make([]Result, len(recs)),
		ctxs:    make([]context.Context, len(recs)),
		spans:   make([]trace.Span, len(recs)),
	}
	err := in.processBatch(ctx, st, h)
	for _, sp := range st.spans {
		if sp != nil { // not settled
			endSpan(sp, Result{}, err)
		}
	}
	return st.results, err
}

func (in *Inbox) processBatch(ctx context.Context, st *batchState, h Handler) error {
	// Step 1: what the single path settles before any transaction; duplicates within the batch.
	idx := make([]int, 0, len(st.recs))
	var dups []int
	first := make(map[string]struct{}, len(st.recs))
	for i, rec := range st.recs {
		key, _ := header(rec, in.s.EventKeyHeader)
		_, _, verr := in.version(rec)
		if key == "" || verr != nil || len(key) > maxEventKeyBytes {
			res, err := in.Process(ctx, rec, h)
			if err != nil {
				return err
			}
			st.results[i] = res
			continue
		}
		if _, seen := first[key]; seen {
			dups = append(dups, i)
			continue
		}
		first[key] = struct{}{}
		idx = append(idx, i)
	}
	if err := in.batch(ctx, st, idx, h); err != nil {
		return err
	}
	for _, i := range dups {
		in.settle(ctx, st, i, Result{Outcome: Duplicate, Attempts: 1})
	}
	return nil
}

// batch settles the records idx of st (step 2-5), splitting at a handler error.
func (in *Inbox) batch(ctx context.Context, st *batchState, idx []int, h Handler) error {
	for len(idx) > 0 {
		failAt, err := in.batchAttempts(ctx, st, idx, h)
		if err != nil {
			return err
		}
		if failAt < 0 {
			return nil
		}
		failed := st.failed
		st.failed = nil
		// Before it: again as a batch; it: alone through the single path, the failed batch run
		// counting as its first attempt; after it: a new batch.
		if err := in.batch(ctx, st, idx[:failAt], h); err != nil {
			return err
		}
		if err := in.single(ctx, st, idx[failAt], h, failed); err != nil {
			return err
		}
		idx = idx[failAt+1:]
	}
	return nil
}

// single is Process for record i, in the consumer span its batch attempt started. failed: the
// error of its failed batch run, which counts as its first attempt (nil: none).
func (in *Inbox) single(ctx context.Context, st *batchState, i int, h Handler, failed error) error {
	rec := st.recs[i]
	sctx := in.span(ctx, st, i)
	res, err := in.processAfter(sctx, rec, h, nil, failed)
	endSpan(st.spans[i], res, err)
	st.spans[i] = nil
	if err != nil {
		return err
	}
	st.results[i] = res
	if res.Outcome == Processed {
		if key, ok := in.versionKey(rec); ok {
			if _, err := in.resumeAfter(ctx, key, h); err != nil {
				return err
			}
		}
	}
	return nil
}

// handlerFailure: the handler (or a version gap under GapDeadLetter/GapRetry) failed at
// position at of the batch, not an infrastructure error.
type handlerFailure struct {
	at  int
	err error
}

func (e *handlerFailure) Error() string { return e.err.Error() }

// raceError: the MySQL INSERT met a row inserted by another transaction after the SELECT.
type raceError struct{ err error }

func (e *raceError) Error() string { return "inbox: batch insert raced: " + e.err.Error() }
func (e *raceError) Unwrap() error { return e.err }

// batchAttempts runs the transaction of the batch idx until it commits (it returns -1) or a
// handler fails (it returns the position in idx), redoing it after infrastructure errors
// within the outage budget.
func (in *Inbox) batchAttempts(ctx context.Context, st *batchState, idx []int, h Handler) (int, error) {
	for _, i := range idx {
		in.span(ctx, st, i)
	}
	firstRec := st.recs[idx[0]]
	ts := in.settingsOf(firstRec)
	var outageRetries *backoff.ExponentialBackOff
	var outageSince time.Time
	races := 0
	for {
		moved, err := in.batchAttempt(ctx, st, idx, h)
		if err == nil {
			// Resumption of the parked successors, in version order, aggregate by aggregate.
			for _, key := range moved {
				if _, err := in.resumeAfter(ctx, key, h); err != nil {
					return -1, err
				}
			}
			return -1, nil
		}
		var hf *handlerFailure
		if errors.As(err, &hf) {
			// A handler's error is the record's attempt 1; a version gap (dead_letter or
			// retry policy) is not: the single path finds it again as its own attempt 1.
			var gap *gapError
			if !errors.As(hf.err, &gap) {
				st.failed = hf.err
			}
			return hf.at, nil
		}
		var race *raceError
		if errors.As(err, &race) && races < maxDuplicateRedos {
			races++ // the redo finds the row: no wait, not an attempt
			continue
		}
		if race == nil && !IsInfrastructureError(err) {
			if ctx.Err() != nil {
				return -1, fmt.Errorf("inbox: batch from %s/%d@%d not settled: %w", firstRec.Topic, firstRec.Partition, firstRec.Offset, ctx.Err())
			}
			// A statement of the batch failed for another reason (none is expected): the
			// records go through the single path one by one, which counts attempts.
			in.log.Warn("inbox: batch statement failed; its records go one at a time", "consumer", in.s.Consumer, "err", err)
			return 0, nil
		}
		// Not an attempt: the batch is redone once the database answers again.
		for _, i := range idx {
			trace.SpanFromContext(st.ctxs[i]).RecordError(err, trace.WithAttributes(
				attrInboxAttempt.Int(1), attrInboxOutage.Bool(true)))
		}
		if outageRetries == nil {
			outageRetries, outageSince = ts.backoff(), time.Now()
		}
		down := time.Since(outageSince)
		if down >= in.s.OutageBudget {
			return -1, &OutageError{
				Topic: firstRec.Topic, Partition: firstRec.Partition, Offset: firstRec.Offset,
				Lasted: down, Budget: in.s.OutageBudget, Err: err,
			}
		}
		t := time.NewTimer(min(outageRetries.NextBackOff(), in.s.OutageBudget-down))
		select {
		case <-ctx.Done():
			t.Stop()
			return -1, fmt.Errorf("inbox: batch from %s/%d@%d not settled: %w", firstRec.Topic, firstRec.Partition, firstRec.Offset, ctx.Err())
		case <-t.C:
		}
		races = 0
	}
}

// aggregate is a version row's key.
type aggregate struct{ aggType, aggID string }

// batchAttempt is one transaction of the batch idx (contract "Batch mode" 2-4). On success the
// records are settled (in batch order) and it returns the aggregates whose version moved, with
// their new version, in order of first appearance.
func (in *Inbox) batchAttempt(ctx context.Context, st *batchState, idx []int, h Handler) ([]versionKey, error) {
	maria, err := in.mariaDB(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		if ctx.Err() == nil {
			return nil, &noConnectionError{err}
		}
		return nil, err
	}
	defer func() { _ = tx.Rollback() }() // no-op after a commit

	n := len(idx)
	keys := make([]string, n)
	for j, i := range idx {
		keys[j], _ = header(st.recs[i], in.s.EventKeyHeader)
	}
	rowArgs := func(js []int) []any {
		args := make([]any, 0, 5*len(js))
		for _, j := range js {
			at := originOf(st.recs[idx[j]])
			args = append(args, in.s.Consumer, keys[j], at.topic, at.partition, at.offset)
		}
		return args
	}
	all := make([]int, n)
	for j := range all {
		all[j] = j
	}
	// Step 2: the inbox rows; dup[j]: already processed.
	dup := make([]bool, n)
	if maria {
		if f := testHookAfterBatchSelect; f != nil {
			f()
		}
		rows, err := tx.QueryContext(ctx, in.bsql.insertIgnore+placeholders(n, 5)+" RETURNING event_key", rowArgs(all)...)
		if err != nil {
			return nil, err
		}
		fresh, err := scanKeys(rows)
		if err != nil {
			return nil, err
		}
		for j := range keys {
			_, ok := fresh[keys[j]]
			dup[j] = !ok
		}
	} else {
		args := make([]any, 0, n+1)
		args = append(args, in.s.Consumer)
		for _, k := range keys {
			args = append(args, k)
		}
		rows, err := tx.QueryContext(ctx, in.bsql.selectKeys+marks(n)+") FOR UPDATE", args...)
		if err != nil {
			return nil, err
		}
		found, err := scanKeys(rows)
		if err != nil {
			return nil, err
		}
		for j := range keys {
			_, dup[j] = found[keys[j]]
		}
		if f := testHookAfterBatchSelect; f != nil {
			f()
		}
	}

	// Step 3: versions, in memory under the version rows' locks.
	outcomes := make([]Outcome, n)
	reasons := make([]string, n)
	versions := make([]int64, n)
	hasVersion := make([]bool, n)
	aggs := make([]aggregate, n)
	var order []aggregate // distinct, in order of first appearance
	seen := map[aggregate]struct{}{}
	for j := range idx {
		if dup[j] {
			outcomes[j] = Duplicate
			continue
		}
		outcomes[j] = Processed
		rec := st.recs[idx[j]]
		v, ok, _ := in.version(rec) // checked in step 1
		if !ok {
			continue
		}
		aggType, _ := header(rec, in.s.AggregateTypeHeader)
		a := aggregate{aggType, string(rec.Key)}
		versions[j], hasVersion[j], aggs[j] = v, true, a
		if _, ok := seen[a]; !ok {
			seen[a] = struct{}{}
			order = append(order, a)
		}
	}
	type stored struct {
		version int64
		exists  bool
	}
	cur := make(map[aggregate]*stored, len(order))
	for _, a := range order {
		cur[a] = &stored{}
	}
	if len(order) > 0 {
		args := make([]any, 0, 1+2*len(order))
		args = append(args, in.s.Consumer)
		for _, a := range order {
			args = append(args, a.aggType, a.aggID)
		}
		rows, err := tx.QueryContext(ctx, in.bsql.selectVersions+placeholders(len(order), 2)+") FOR UPDATE", args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var t, id []byte
			var v int64
			if err := rows.Scan(&t, &id, &v); err != nil {
				_ = rows.Close()
				return nil, err
			}
			if s, ok := cur[aggregate{string(t), string(id)}]; ok {
				s.version, s.exists = v, true
			}
		}
		if err := rows.Close(); err != nil {
			return nil, err
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	movedSet := map[aggregate]bool{}
	var parkedKeys []int
	for j := range idx {
		if outcomes[j] != Processed || !hasVersion[j] {
			continue
		}
		s, v, rec := cur[aggs[j]], versions[j], st.recs[idx[j]]
		switch {
		case !s.exists || v == s.version+1:
			s.version, s.exists = v, true
			movedSet[aggs[j]] = true
		case v <= s.version:
			outcomes[j] = Stale // the inbox row stays: a redelivery is a duplicate
		default:
			gap := &gapError{expected: s.version + 1, got: v, aggType: aggs[j].aggType, aggID: aggs[j].aggID}
			ts := in.settingsOf(rec)
			if ts.gapPolicy != GapPark {
				return nil, &handlerFailure{at: j, err: gap}
			}
			if err := in.parkIn(ctx, tx, rec, keys[j], versionKey{gap.aggType, gap.aggID, v}, gap.Error(), ts.gapDeadline); err != nil {
				return nil, err
			}
			outcomes[j], reasons[j] = Parked, gap.Error()
			parkedKeys = append(parkedKeys, j)
		}
	}
	if maria {
		if len(parkedKeys) > 0 {
			// A parked record has no inbox row (the single path rolls its insert back).
			args := []any{in.s.Consumer}
			for _, j := range parkedKeys {
				args = append(args, keys[j])
			}
			if _, err := tx.ExecContext(ctx, in.bsql.deleteKeys+marks(len(parkedKeys))+")", args...); err != nil {
				return nil, err
			}
		}
	} else {
		var ins []int
		for j := range idx {
			if outcomes[j] == Processed || outcomes[j] == Stale {
				ins = append(ins, j)
			}
		}
		if len(ins) > 0 {
			if _, err := tx.ExecContext(ctx, in.bsql.insert+placeholders(len(ins), 5), rowArgs(ins)...); err != nil {
				var me *mysql.MySQLError
				if errors.As(err, &me) && me.Number == 1062 {
					return nil, &raceError{err}
				}
				return nil, err
			}
		}
	}

	// Step 4: the handlers, in batch order, with the batch's transaction.
	for j, i := range idx {
		if outcomes[j] != Processed {
			continue
		}
		if err := h(st.ctxs[i], tx, st.recs[i]); err != nil {
			if IsInfrastructureError(err) {
				return nil, err
			}
			return nil, &handlerFailure{at: j, err: err}
		}
	}
	var moved []versionKey
	for _, a := range order {
		if movedSet[a] {
			moved = append(moved, versionKey{a.aggType, a.aggID, cur[a].version})
		}
	}
	if len(moved) > 0 {
		args := make([]any, 0, 4*len(moved))
		for _, k := range moved {
			args = append(args, in.s.Consumer, k.aggType, k.aggID, k.version)
		}
		if _, err := tx.ExecContext(ctx, in.bsql.upsertVersions+placeholders(len(moved), 4)+
			" ON DUPLICATE KEY UPDATE version = VALUES(version)", args...); err != nil {
			return nil, err
		}
	}
	if f := in.s.Hooks.BeforeCommit; f != nil {
		for j, i := range idx {
			if outcomes[j] == Processed {
				f(st.recs[i])
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	for j, i := range idx {
		in.settle(ctx, st, i, Result{Outcome: outcomes[j], Attempts: 1, Reason: reasons[j]})
	}
	return moved, nil
}

// scanKeys reads a one-column result of event keys into a set (closing rows).
func scanKeys(rows *sql.Rows) (map[string]struct{}, error) {
	defer func() { _ = rows.Close() }()
	set := map[string]struct{}{}
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		set[string(k)] = struct{}{}
	}
	return set, rows.Err()
}

// parkIn inserts the parked row of rec in tx (the version row is locked by the caller), as
// park does.
func (in *Inbox) parkIn(ctx context.Context, tx *sql.Tx, rec *kgo.Record, eventKey string, key versionKey, reason string, deadline time.Duration) error {
	if len(reason) > 512 {
		reason = reason[:512]
	}
	var recKey, recValue any // a null key or value stays NULL
	if rec.Key != nil {
		recKey = rec.Key
	}
	if rec.Value != nil {
		recValue = rec.Value
	}
	_, err := tx.ExecContext(ctx, in.pk.insert, in.s.Consumer, key.aggType, key.aggID, key.version, eventKey,
		rec.Topic, rec.Partition, rec.Offset, recKey, recValue, encodeHeaders(rec.Headers), reason,
		deadline.Microseconds())
	return err
}
