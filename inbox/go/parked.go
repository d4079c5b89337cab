package inbox

// Parked versions (inbox/CONTRACT.md, "Parked versions"): a record that arrives ahead of its
// aggregate's next version is stored in the parked table (migrations/0006_inbox_parked.sql)
// instead of being applied, and applied by itself once the version before it has been.

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// versionKey is an aggregate's version slot: the parked table's primary key after the consumer.
type versionKey struct {
	aggType, aggID string
	version        int64
}

// parkedSQL are the statements on the parked table.
type parkedSQL struct {
	insert, selectOne, selectDue, delete, lockOne, exists, stats string
}

// parkedColumns are read by scanParked; parked_at as RFC 3339 UTC text, and whether the row
// expired by the database's clock.
const parkedColumns = "aggregate_type, aggregate_id, version, topic, kafka_partition, kafka_offset, " +
	"record_key, record_value, record_headers, " +
	"DATE_FORMAT(CONVERT_TZ(parked_at, @@session.time_zone, '+00:00'), '%Y-%m-%dT%H:%i:%s.%fZ'), " +
	"expires_at < NOW(6)"

func newParkedSQL(t string) parkedSQL {
	where := " WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND version = ?"
	return parkedSQL{
		// IGNORE: a redelivered parked record meets its own row (the primary key).
		insert: "INSERT IGNORE INTO " + t + " (consumer, aggregate_type, aggregate_id, version, event_key, topic, " +
			"kafka_partition, kafka_offset, record_key, record_value, record_headers, reason, expires_at) " +
			"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, DATE_ADD(NOW(6), INTERVAL ? MICROSECOND))",
		selectOne: "SELECT " + parkedColumns + " FROM " + t + where,
		selectDue: "SELECT " + parkedColumns + " FROM " + t + " WHERE consumer = ? ORDER BY expires_at LIMIT 100",
		lockOne:   "SELECT " + parkedColumns + " FROM " + t + where + " FOR UPDATE",
		exists:    "SELECT 1 FROM " + t + where,
		delete:    "DELETE FROM " + t + where,
		stats:     "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(parked_at), NOW(6)) FROM " + t + " WHERE consumer = ?",
	}
}

// parkedRow is one parked row read back.
type parkedRow struct {
	key      versionKey
	rec      *kgo.Record // as received: topic, partition and offset of the original
	parkedAt string      // RFC 3339 UTC
	expired  bool
}

// encodeHeaders gives the headers as the parked table stores them: a JSON array of [name,
// base64 value or null] pairs, in order (the same text as the other helpers').
func encodeHeaders(hs []kgo.RecordHeader) string {
	pairs := make([][2]any, 0, len(hs))
	for _, h := range hs {
		var v any
		if h.Value != nil {
			v = base64.StdEncoding.EncodeToString(h.Value)
		}
		pairs = append(pairs, [2]any{h.Key, v})
	}
	b, _ := json.Marshal(pairs) // strings and nulls only: cannot fail
	return string(b)
}

// decodeHeaders is the inverse of encodeHeaders.
func decodeHeaders(text string) ([]kgo.RecordHeader, error) {
	var items []json.RawMessage
	if err := json.Unmarshal([]byte(text), &items); err != nil {
		return nil, fmt.Errorf("record_headers is not a JSON array: %w", err)
	}
	hs := make([]kgo.RecordHeader, 0, len(items))
	for _, item := range items {
		var pair []*string
		if err := json.Unmarshal(item, &pair); err != nil || len(pair) != 2 || pair[0] == nil {
			return nil, fmt.Errorf("record_headers holds an item that is not a [name, value] pair: %s", item)
		}
		h := kgo.RecordHeader{Key: *pair[0]}
		if pair[1] != nil {
			v, err := base64.StdEncoding.DecodeString(*pair[1])
			if err != nil {
				return nil, fmt.Errorf("record_headers: header %q: %w", h.Key, err)
			}
			h.Value = v
		}
		hs = append(hs, h)
	}
	return hs, nil
}

type scanner interface{ Scan(dest ...any) error }

func scanParked(r scanner) (parkedRow, error) {
	var (
		aggType, aggID, key, value []byte
		headers, parkedAt          string
		expired                    int64
		row                        parkedRow
		rec                        = &kgo.Record{}
	)
	if err := r.Scan(&aggType, &aggID, &row.key.version, &rec.Topic, &rec.Partition, &rec.Offset,
		&key, &value, &headers, &parkedAt, &expired); err != nil {
		return row, err
	}
	hs, err := decodeHeaders(headers)
	if err != nil {
		return row, &badParkedRowError{fmt.Errorf("parked row %s/%s@%d: %w", aggType, aggID, row.key.version, err)}
	}
	rec.Key, rec.Value, rec.Headers = key, value, hs
	row.key.aggType, row.key.aggID = string(aggType), string(aggID)
	row.rec, row.parkedAt, row.expired = rec, parkedAt, expired != 0
	return row, nil
}

// badParkedRowError: a parked row that does not decode (left in the table, named).
type badParkedRowError struct{ err error }

func (e *badParkedRowError) Error() string { return e.err.Error() }
func (e *badParkedRowError) Unwrap() error { return e.err }

// versionKey returns the record's aggregate and version, when versions are checked and it has
// a valid one.
func (in *Inbox) versionKey(rec *kgo.Record) (versionKey, bool) {
	v, ok, err := in.version(rec)
	if err != nil || !ok {
		return versionKey{}, false
	}
	aggType, _ := header(rec, in.s.AggregateTypeHeader)
	return versionKey{aggType: aggType, aggID: string(rec.Key), version: v}, true
}

// park stores rec in the parked table: under the version row's lock, still a gap: stored
// (true); the gap closed meanwhile: false (redo the attempt).
func (in *Inbox) park(ctx context.Context, rec *kgo.Record, eventKey string, key versionKey, reason string, deadline time.Duration) (bool, error) {
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		if ctx.Err() == nil {
			return false, &noConnectionError{err}
		}
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	var stored int64
	err = tx.QueryRowContext(ctx, in.selVer, in.s.Consumer, key.aggType, key.aggID).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && key.version <= stored+1) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
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
	if _, err := tx.ExecContext(ctx, in.pk.insert, in.s.Consumer, key.aggType, key.aggID, key.version, eventKey,
		rec.Topic, rec.Partition, rec.Offset, recKey, recValue, encodeHeaders(rec.Headers), reason,
		deadline.Microseconds()); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

func (in *Inbox) deleteParked(ctx context.Context, key versionKey) error {
	_, err := in.db.ExecContext(ctx, in.pk.delete, in.s.Consumer, key.aggType, key.aggID, key.version)
	return err
}

// resumeAfter applies the parked successors of applied (the version just committed), one at a
// time, in version order, until one is missing; it returns how many were resumed. A parked row
// that cannot be read is left for the sweep.
func (in *Inbox) resumeAfter(ctx context.Context, applied versionKey, h Handler) (int, error) {
	n := 0
	for {
		row, err := scanParked(in.db.QueryRowContext(ctx, in.pk.selectOne, in.s.Consumer, applied.aggType, applied.aggID, applied.version+1))
		if errors.Is(err, sql.ErrNoRows) {
			return n, nil
		}
		if err != nil {
			in.log.Warn("inbox: parked successors not read; the sweep will resume them", "consumer", in.s.Consumer, "err", err)
			return n, nil
		}
		res, err := in.processOne(ctx, row.rec, h, &row.key)
		if err != nil {
			return n, err
		}
		if res.Outcome != Resumed {
			return n, nil
		}
		n++
		applied = row.key
	}
}

// ParkedSweep says what one [Inbox.SweepParked] did.
type ParkedSweep struct {
	// Resumed counts the parked rows applied (their predecessor had been applied), successors
	// included.
	Resumed int
	// Stale counts the rows no newer than the applied version (or applied before), removed.
	Stale int
	// DeadLettered counts the rows past their deadline (or failing when applied),
	// dead-lettered and removed.
	DeadLettered int
	// Compensated counts the rows past their deadline handed to Hooks.OnGapExpired.
	Compensated int
	// Parked is the number of rows still parked after the sweep, Oldest the age of the oldest
	// of them (0: none).
	Parked int
	Oldest time.Duration
}

// SweepReadError is returned by [Inbox.SweepParked] when the tables could not be read or
// written (nothing was settled by that statement): sweep again later. A [Runner] logs it and
// goes on.
type SweepReadError struct{ Err error }

func (e *SweepReadError) Error() string { return "inbox: parked sweep: " + e.Err.Error() }

// Unwrap returns the database error.
func (e *SweepReadError) Unwrap() error { return e.Err }

// SweepParked is one sweep of the parked table (inbox/CONTRACT.md, "Parked versions", the
// sweep): of the consumer's 100 rows that expire first, a row whose predecessor has been
// applied is applied (outcome [Resumed], with its successors), one no newer than the applied
// version is removed (outcome [Stale]), and one past its deadline is dead-lettered (reason
// "version gap: expected N, got M; parked since T", dlq_attempts 0) or handed to
// Hooks.OnGapExpired (outcome [Compensated]), then removed. Each outcome goes through the
// AfterCommit hook. A [Runner] calls it before the first poll and every
// Settings.ParkSweepInterval; call it likewise with your own poll loop (with versions checked
// and GapPark).
//
// Errors: a [*SweepReadError] when the tables could not be read (sweep again later); else what
// [Inbox.Process] returns (a dead letter that could not be produced, an [*OutageError]). A
// row that does not decode is logged and left.
func (in *Inbox) SweepParked(ctx context.Context, h Handler) (ParkedSweep, error) {
	var sw ParkedSweep
	rows, err := in.db.QueryContext(ctx, in.pk.selectDue, in.s.Consumer)
	if err != nil {
		return sw, &SweepReadError{err}
	}
	var due []parkedRow
	for rows.Next() {
		row, err := scanParked(rows)
		var bad *badParkedRowError
		if errors.As(err, &bad) {
			in.log.Error("inbox: a parked row does not decode; left in the table", "consumer", in.s.Consumer, "err", err)
			continue
		}
		if err != nil {
			_ = rows.Close()
			return sw, &SweepReadError{err}
		}
		due = append(due, row)
	}
	if err := rows.Err(); err != nil {
		return sw, &SweepReadError{err}
	}
	_ = rows.Close()
	for _, row := range due {
		// Still there? (An earlier row's successors were resumed in this sweep.)
		var one int
		err := in.db.QueryRowContext(ctx, in.pk.exists, in.s.Consumer, row.key.aggType, row.key.aggID, row.key.version).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return sw, &SweepReadError{err}
		}
		var stored int64
		err = in.db.QueryRowContext(ctx, in.stored, in.s.Consumer, row.key.aggType, row.key.aggID).Scan(&stored)
		none := errors.Is(err, sql.ErrNoRows)
		if err != nil && !none {
			return sw, &SweepReadError{err}
		}
		switch {
		case none || row.key.version <= stored+1:
			// Its predecessor was applied (a crash came between), or it is stale: the attempt
			// decides under the version row's lock.
			res, err := in.processOne(ctx, row.rec, h, &row.key)
			if err != nil {
				return sw, err
			}
			switch res.Outcome {
			case Resumed:
				n, err := in.resumeAfter(ctx, row.key, h)
				sw.Resumed += 1 + n
				if err != nil {
					return sw, err
				}
			case Stale, Duplicate:
				sw.Stale++
			case DeadLettered:
				sw.DeadLettered++
			}
		case row.expired:
			out, err := in.expire(ctx, row)
			if err != nil {
				return sw, err
			}
			switch out {
			case DeadLettered:
				sw.DeadLettered++
			case Compensated:
				sw.Compensated++
			}
		}
	}
	var oldest sql.NullInt64
	if err := in.db.QueryRowContext(ctx, in.pk.stats, in.s.Consumer).Scan(&sw.Parked, &oldest); err != nil {
		return sw, &SweepReadError{err}
	}
	sw.Oldest = time.Duration(oldest.Int64) * time.Microsecond
	in.metrics.swept(in.s.Consumer, sw.Parked, sw.Oldest)
	return sw, nil
}

// expire dead-letters (or compensates) an expired parked row under its version row's lock,
// after checking that it is still parked and still ahead; it returns the outcome, "" when the
// row was left (gone meanwhile, no longer ahead, or the compensation hook failed).
func (in *Inbox) expire(ctx context.Context, row parkedRow) (Outcome, error) {
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		return "", &SweepReadError{err}
	}
	defer func() { _ = tx.Rollback() }()
	var stored int64
	err = tx.QueryRowContext(ctx, in.selVer, in.s.Consumer, row.key.aggType, row.key.aggID).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && row.key.version <= stored+1) {
		return "", nil // the next sweep applies or removes it
	}
	if err != nil {
		return "", &SweepReadError{err}
	}
	locked, err := scanParked(tx.QueryRowContext(ctx, in.pk.lockOne, in.s.Consumer, row.key.aggType, row.key.aggID, row.key.version))
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil // resumed or expired by another process meanwhile
	}
	if err != nil {
		return "", &SweepReadError{err}
	}
	reason := fmt.Sprintf("version gap: expected %d, got %d; parked since %s", stored+1, row.key.version, locked.parkedAt)
	res := Result{Outcome: DeadLettered, Reason: reason}
	if f := in.s.Hooks.OnGapExpired; f != nil {
		parkedAt, _ := time.Parse(time.RFC3339Nano, locked.parkedAt)
		if err := f(locked.rec, parkedAt); err != nil {
			in.log.Warn("inbox: OnGapExpired failed; the parked row stays for the next sweep",
				"consumer", in.s.Consumer, "topic", locked.rec.Topic, "partition", locked.rec.Partition,
				"offset", locked.rec.Offset, "err", err)
			return "", nil
		}
		res.Outcome = Compensated
	} else if err := in.produceDeadLetter(ctx, locked.rec, res); err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, in.pk.delete, in.s.Consumer, row.key.aggType, row.key.aggID, row.key.version); err != nil {
		return "", &SweepReadError{err}
	}
	if err := tx.Commit(); err != nil {
		return "", &SweepReadError{err}
	}
	_, _ = in.settled(locked.rec, res)
	return res.Outcome, nil
}
