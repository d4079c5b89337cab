// Command scenario-consumer runs the inbox library with the fixed business handler of
// inbox/CONTRACT.md ("The scenario consumer"), configured by INBOX_* environment variables.
// It prints READY, one OUTCOME line per settled record and, with INBOX_EXIT_AFTER, a BENCH line
// on stdout; logs go to stderr. Exit status: 0 after SIGTERM/SIGINT or INBOX_EXIT_AFTER records,
// 137 at the configured crash point, 1 on an error.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kgo"

	inbox "github.com/outbox-relay/outbox-relay/inbox/go"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scenario-consumer:", err)
		os.Exit(1)
	}
}

type config struct {
	bootstrap, topic, group, consumer, dlq string
	maxAttempts                            int
	backoff                                time.Duration
	outageBudget                           time.Duration
	versionHeader                          string
	gapPolicy                              inbox.GapPolicy
	gapDeadline, parkSweep                 time.Duration
	retryTiers                             []time.Duration
	crashPoint, crashKey, crashMarker      string
	mode                                   string
	exitAfter                              int
	batch                                  int
	batchWait                              time.Duration
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return n, nil
}

func loadConfig() (config, error) {
	c := config{
		bootstrap:     env("INBOX_BOOTSTRAP", "127.0.0.1:9092"),
		topic:         os.Getenv("INBOX_TOPIC"),
		consumer:      os.Getenv("INBOX_CONSUMER"),
		dlq:           os.Getenv("INBOX_DLQ_TOPIC"),
		versionHeader: os.Getenv("INBOX_VERSION_HEADER"),
		gapPolicy:     inbox.GapPolicy(env("INBOX_GAP_POLICY", "park")),
		crashPoint:    os.Getenv("INBOX_CRASH_POINT"),
		crashKey:      os.Getenv("INBOX_CRASH_EVENT_KEY"),
		crashMarker:   os.Getenv("INBOX_CRASH_MARKER"),
		mode:          env("INBOX_MODE", "inbox"),
	}
	c.group = env("INBOX_GROUP", c.consumer)
	var err error
	if c.maxAttempts, err = envInt("INBOX_MAX_ATTEMPTS", 3); err != nil {
		return c, err
	}
	ms, err := envInt("INBOX_BACKOFF_MS", 50)
	if err != nil {
		return c, err
	}
	c.backoff = time.Duration(ms) * time.Millisecond
	budget, err := envInt("INBOX_OUTAGE_BUDGET_MS", 300000)
	if err != nil {
		return c, err
	}
	c.outageBudget = time.Duration(budget) * time.Millisecond
	deadline, err := envInt("INBOX_GAP_DEADLINE_MS", 3600000)
	if err != nil {
		return c, err
	}
	c.gapDeadline = time.Duration(deadline) * time.Millisecond
	sweep, err := envInt("INBOX_PARK_SWEEP_MS", 10000)
	if err != nil {
		return c, err
	}
	c.parkSweep = time.Duration(sweep) * time.Millisecond
	// INBOX_RETRY_TIERS_MS: comma-separated delays in ms (absent or empty: no tiers).
	for _, f := range strings.Split(os.Getenv("INBOX_RETRY_TIERS_MS"), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		ms, err := strconv.Atoi(f)
		if err != nil || ms < 0 {
			return c, fmt.Errorf("INBOX_RETRY_TIERS_MS: %q is not a delay in ms", f)
		}
		c.retryTiers = append(c.retryTiers, time.Duration(ms)*time.Millisecond)
	}
	if c.exitAfter, err = envInt("INBOX_EXIT_AFTER", 0); err != nil {
		return c, err
	}
	// Batch mode (inbox mode only; plain stays per-record autocommit).
	if c.batch, err = envInt("INBOX_BATCH", 1); err != nil {
		return c, err
	}
	wait, err := envInt("INBOX_BATCH_WAIT_MS", 20)
	if err != nil {
		return c, err
	}
	c.batchWait = time.Duration(wait) * time.Millisecond
	switch {
	case c.topic == "" || c.consumer == "":
		return c, errors.New("INBOX_TOPIC and INBOX_CONSUMER are required")
	case c.mode != "inbox" && c.mode != "plain":
		return c, fmt.Errorf("INBOX_MODE: %q is neither inbox nor plain", c.mode)
	case c.crashPoint != "" && c.crashPoint != "after_handler" && c.crashPoint != "after_db_commit" &&
		c.crashPoint != "after_retry_copy":
		return c, fmt.Errorf("INBOX_CRASH_POINT: unknown %q", c.crashPoint)
	}
	return c, nil
}

func openDB() (*sql.DB, error) {
	mc := mysql.NewConfig()
	mc.User = env("INBOX_DB_USER", "root")
	mc.Passwd = os.Getenv("INBOX_DB_PASSWORD")
	mc.Net = "tcp"
	mc.Addr = net.JoinHostPort(env("INBOX_DB_HOST", "127.0.0.1"), env("INBOX_DB_PORT", "3306"))
	mc.DBName = os.Getenv("INBOX_DB_NAME")
	// One round trip per statement instead of prepare/execute/close: the driver interpolates
	// the arguments itself, escaping them for the connection's utf8mb4 character set (and
	// refusing to when the connection's charset is not one it can escape safely).
	mc.InterpolateParams = true
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	return db, nil
}

// out writes the protocol lines to stdout, one flushed line each.
var (
	outMu sync.Mutex
	out   = bufio.NewWriter(os.Stdout)
)

func say(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(out, format+"\n", args...)
	_ = out.Flush()
}

func headerValue(rec *kgo.Record, name string) (string, bool) {
	for i := len(rec.Headers) - 1; i >= 0; i-- {
		if rec.Headers[i].Key == name {
			return string(rec.Headers[i].Value), true
		}
	}
	return "", false
}

// execer is what the handler writes with: the inbox transaction, or the pool in plain mode.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// business is the fixed handler of the contract; failures counts fail_times per event_key.
type business struct {
	consumer string
	mu       sync.Mutex
	failures map[string]int
}

func (b *business) handle(ctx context.Context, db execer, rec *kgo.Record) error {
	var payload struct {
		Poison        bool  `json:"poison"`
		FailTimes     int64 `json:"fail_times"`
		FailUntilTier int64 `json:"fail_until_tier"`
	}
	if err := json.Unmarshal(rec.Value, &payload); err != nil {
		return fmt.Errorf("payload is not a JSON object: %w", err)
	}
	eventKey, _ := headerValue(rec, "event_key")
	var version any // NULL unless the header is an integer
	if v, ok := headerValue(rec, "version"); ok {
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			version = n
		}
	}
	if _, err := db.ExecContext(ctx,
		"INSERT INTO coupons (consumer, order_id, event_key, version) VALUES (?, ?, ?, ?)",
		b.consumer, string(rec.Key), eventKey, version); err != nil {
		return err
	}
	if payload.Poison {
		return errors.New("poison record")
	}
	if payload.FailUntilTier > 0 && int64(inbox.RetryTier(rec)) < payload.FailUntilTier {
		return fmt.Errorf("failing until tier %d", payload.FailUntilTier)
	}
	if payload.FailTimes > 0 {
		b.mu.Lock()
		defer b.mu.Unlock()
		if int64(b.failures[eventKey]) < payload.FailTimes {
			b.failures[eventKey]++
			return fmt.Errorf("transient failure %d of %d", b.failures[eventKey], payload.FailTimes)
		}
	}
	return nil
}

// crash ends the process with status 137 and no cleanup, once per marker file.
func (c *config) crash(point string, rec *kgo.Record) {
	if c.crashPoint != point {
		return
	}
	if k, _ := headerValue(rec, "event_key"); k != c.crashKey {
		return
	}
	if c.crashMarker != "" {
		if _, err := os.Stat(c.crashMarker); err == nil {
			return
		}
		if f, err := os.Create(c.crashMarker); err == nil {
			_ = f.Close()
		}
	}
	fmt.Fprintf(os.Stderr, "scenario-consumer: crash at %s for %s\n", point, c.crashKey)
	os.Exit(137)
}

// bench measures, per record, the time from the poll that returned it until it was settled.
type bench struct {
	mu        sync.Mutex
	polled    map[*kgo.Record]time.Time
	first     time.Time
	latencies []time.Duration
	last      time.Time
	count     int
}

func (b *bench) OnFetchRecordUnbuffered(rec *kgo.Record, polled bool) {
	if !polled {
		return
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.first.IsZero() {
		b.first = now
	}
	b.polled[rec] = now
}

// settled records a settled record and returns how many were settled so far.
func (b *bench) settled(rec *kgo.Record) int {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.polled[rec]; ok {
		b.latencies = append(b.latencies, now.Sub(t))
		delete(b.polled, rec)
	}
	b.last = now
	b.count++
	return b.count
}

func (b *bench) report() {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := slices.Clone(b.latencies)
	slices.Sort(l)
	pct := func(p float64) float64 {
		if len(l) == 0 {
			return 0
		}
		i := int(math.Ceil(p*float64(len(l)))) - 1
		return float64(l[max(i, 0)].Microseconds()) / 1000
	}
	say("BENCH records=%d seconds=%.3f p50_ms=%.3f p99_ms=%.3f", b.count, b.last.Sub(b.first).Seconds(), pct(0.50), pct(0.99))
}

func run() error {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	c, err := loadConfig()
	if err != nil {
		return err
	}
	db, err := openDB()
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, finish := context.WithCancel(ctx)
	defer finish()

	biz := &business{consumer: c.consumer, failures: map[string]int{}}
	bm := &bench{polled: map[*kgo.Record]time.Time{}}
	onSettled := func(rec *kgo.Record, outcome inbox.Outcome, attempts int) {
		// A retry copy is reported at the original record's partition and offset.
		_, partition, offset := inbox.Origin(rec)
		say("OUTCOME %s %s %d %d %d", outcome, eventKeyOf(rec), partition, offset, attempts)
		if n := bm.settled(rec); c.exitAfter > 0 && n >= c.exitAfter {
			finish()
		}
	}
	brokers := strings.Split(c.bootstrap, ",")

	if c.mode == "plain" {
		err = runPlain(ctx, c, db, brokers, biz, bm, onSettled)
	} else {
		err = runInbox(ctx, c, db, brokers, biz, bm, onSettled)
	}
	if err != nil {
		return err
	}
	if c.exitAfter > 0 {
		bm.report()
	}
	return nil
}

func eventKeyOf(rec *kgo.Record) string {
	k, _ := headerValue(rec, "event_key")
	if k == "" {
		return "-"
	}
	return k
}

func runInbox(ctx context.Context, c config, db *sql.DB, brokers []string, biz *business, bm *bench,
	onSettled func(*kgo.Record, inbox.Outcome, int)) error {
	s := inbox.Settings{
		Consumer:          c.consumer,
		VersionHeader:     c.versionHeader,
		GapPolicy:         c.gapPolicy,
		GapDeadline:       c.gapDeadline,
		ParkSweepInterval: c.parkSweep,
		MaxAttempts:       c.maxAttempts,
		BackoffInitial:    c.backoff,
		BackoffMax:        max(time.Second, c.backoff),
		OutageBudget:      c.outageBudget,
		DeadLetterTopic:   c.dlq,
		RetryTiers:        c.retryTiers,
		BatchMaxRecords:   c.batch,
		BatchMaxWait:      c.batchWait,
		Hooks: inbox.Hooks{
			BeforeCommit: func(rec *kgo.Record) { c.crash("after_handler", rec) },
			// Every settled record passes here once: those the runner polled, and those settled
			// later by themselves (resumed parked versions, a sweep's dead letters).
			AfterCommit: func(rec *kgo.Record, res inbox.Result) {
				switch res.Outcome {
				case inbox.Processed:
					c.crash("after_db_commit", rec)
				case inbox.Retried:
					// The copy is on its tier, the record's offset not committed.
					c.crash("after_retry_copy", rec)
				}
				onSettled(rec, res.Outcome, res.Attempts)
			},
		},
	}
	handler := func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error { return biz.handle(ctx, tx, rec) }
	r, err := inbox.NewRunner(db, s, handler, inbox.RunnerConfig{
		Brokers: brokers,
		Topics:  []string{c.topic},
		Group:   c.group,
		Opts:    append(scenarioOpts(), kgo.WithHooks(bm)),
	})
	if err != nil {
		return err
	}
	say("READY")
	return r.Run(ctx)
}

// scenarioOpts shorten the group session (default 45 s) so that a consumer restarted after a
// scenario crash gets its partitions back within seconds: the crashed member never left.
func scenarioOpts() []kgo.Opt {
	return []kgo.Opt{kgo.SessionTimeout(10 * time.Second), kgo.HeartbeatInterval(time.Second)}
}

// runPlain is the bench baseline: the same handler in autocommit, no inbox, and the runner's
// way of committing offsets (synchronously after each poll batch and on revocation).
func runPlain(ctx context.Context, c config, db *sql.DB, brokers []string, biz *business, bm *bench,
	onSettled func(*kgo.Record, inbox.Outcome, int)) error {
	var mu sync.Mutex
	var done []*kgo.Record
	commit := func(ctx context.Context, cl *kgo.Client) {
		mu.Lock()
		defer mu.Unlock()
		if len(done) > 0 {
			if err := cl.CommitRecords(ctx, done...); err != nil {
				slog.Warn("offset commit failed", "err", err)
			}
			done = done[:0]
		}
	}
	cl, err := kgo.NewClient(append(scenarioOpts(),
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup(c.group),
		kgo.ConsumeTopics(c.topic),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, _ map[string][]int32) { commit(ctx, cl) }),
		kgo.WithHooks(bm),
	)...)
	if err != nil {
		return err
	}
	defer cl.CloseAllowingRebalance()
	say("READY")
	work := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		fetches := cl.PollRecords(ctx, 500)
		if fetches.IsClientClosed() {
			return nil
		}
		var herr error
		for iter := fetches.RecordIter(); !iter.Done() && ctx.Err() == nil; {
			rec := iter.Next()
			if herr = biz.handle(work, db, rec); herr != nil {
				break
			}
			onSettled(rec, inbox.Processed, 1)
			mu.Lock()
			done = append(done, rec)
			mu.Unlock()
		}
		commit(work, cl)
		cl.AllowRebalance()
		if herr != nil {
			return herr
		}
	}
	return nil
}
