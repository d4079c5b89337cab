package inbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// RunnerConfig configures the Kafka side of a [Runner].
type RunnerConfig struct {
	// Brokers are the bootstrap servers, "host:port". Required.
	Brokers []string
	// Topics are the topics to subscribe to. Required.
	Topics []string
	// Group is the consumer group id. Default: Settings.Consumer.
	Group string
	// MaxPollRecords bounds the records processed between two offset commits (and while a
	// rebalance waits). Default 500. In batch mode Settings.BatchMaxRecords is used instead.
	MaxPollRecords int
	// Logger receives poll and offset-commit errors the runner survives. Default slog.Default().
	Logger *slog.Logger
	// Opts are extra franz-go options (TLS, SASL, client id, hooks, ...), applied last.
	// The runner sets: SeedBrokers, ConsumerGroup, ConsumeTopics, DisableAutoCommit,
	// BlockRebalanceOnPoll, ConsumeResetOffset (earliest), OnPartitionsRevoked/Lost,
	// UnknownTopicRetries(-1); with retry tiers also FetchMaxWait(1 s).
	Opts []kgo.Opt
}

// Runner owns a franz-go consumer loop around an [Inbox]: it polls, processes each record in
// partition order with [Inbox.Process], commits the processed offsets synchronously after each
// poll batch and when partitions are revoked, and produces dead letters (and retry copies) with
// the same client. With retry tiers (Settings.RetryTiers, or a topic's own in Settings.Topics)
// it also consumes the tier topics of its topics, each topic by its own tier count: a
// copy whose retry_at has not come pauses its partition (position back to the copy, nothing of
// it committed) until then, while the other partitions go on.
// In batch mode (Settings.BatchMaxRecords > 1) it polls up to BatchMaxRecords records (instead
// of MaxPollRecords), waiting up to Settings.BatchMaxWait for more once some arrived, and
// settles each run of ordinary records with [Inbox.ProcessBatch] (one transaction); retry
// copies go one at a time through [Inbox.Process]. The offsets are committed as in single mode.
// Rebalances are blocked while a batch is processed (kgo.BlockRebalanceOnPoll), so a batch must
// finish within the group's rebalance timeout (60 s by default): bound it with MaxPollRecords.
type Runner struct {
	cl      *kgo.Client
	in      *Inbox
	h       Handler
	maxPoll int
	log     *slog.Logger

	// Retry tiers: the partitions paused on a copy whose retry_at has not come, and when to
	// resume each (only the polling goroutine uses it).
	waiting map[topicPartition]time.Time

	mu      sync.Mutex
	pending map[topicPartition]*kgo.Record // last settled record per partition, not yet committed
}

// topicTimeout bounds NewRunner's check (or creation) of the dead-letter topic.
const topicTimeout = 30 * time.Second

type topicPartition struct {
	topic     string
	partition int32
}

// NewRunner creates the Kafka client (subscribing to cfg.Topics and their retry tier topics with
// auto.offset.reset earliest) and the [Inbox] for db and s, makes sure the dead-letter topic
// and the tier topics exist ([EnsureTopic]: created with the broker's defaults when missing),
// and returns a Runner that calls h for each record. It returns an error for invalid settings or
// client options, and when one of those topics is missing and the broker refuses to create it.
func NewRunner(db *sql.DB, s Settings, h Handler, cfg RunnerConfig) (*Runner, error) {
	if len(cfg.Brokers) == 0 || len(cfg.Topics) == 0 {
		return nil, errors.New("inbox: RunnerConfig.Brokers and Topics are required")
	}
	if h == nil {
		return nil, errors.New("inbox: handler is required")
	}
	if cfg.Group == "" {
		cfg.Group = s.Consumer
	}
	if cfg.MaxPollRecords <= 0 {
		cfg.MaxPollRecords = 500
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Runner{h: h, maxPoll: cfg.MaxPollRecords, log: cfg.Logger, pending: map[topicPartition]*kgo.Record{},
		waiting: map[topicPartition]time.Time{}}
	// The tier topics of the topics (retry tiers): subscribed to as well.
	var tierTopics []string
	probe, err := New(db, noProducer{}, s) // the settings checked, defaults filled in
	if err != nil {
		return nil, err
	}
	for _, t := range cfg.Topics {
		tierTopics = append(tierTopics, probe.RetryTopics(t)...)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(append(slices.Clone(cfg.Topics), tierTopics...)...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsRevoked(r.onRevoked),
		kgo.OnPartitionsLost(r.onLost),
		// A dead letter waits (up to Settings.DeadLetterTimeout) for a topic the broker does
		// not serve yet, instead of failing after kgo's default 4 metadata refreshes.
		kgo.UnknownTopicRetries(-1),
	}
	if len(tierTopics) > 0 {
		// A resumed partition is fetched once the broker's in-flight fetch ends: at most 1 s
		// after its copy's retry_at instead of kgo's default 5 s.
		opts = append(opts, kgo.FetchMaxWait(time.Second))
	}
	cl, err := kgo.NewClient(append(opts, cfg.Opts...)...)
	if err != nil {
		return nil, err
	}
	in, err := New(db, cl, s)
	if err != nil {
		cl.Close()
		return nil, err
	}
	in.log = cfg.Logger
	// The dead-letter topic exists, or is created now, or the runner refuses to start: never
	// a first dead letter that waits for a topic nobody asked the broker to create.
	ctx, cancel := context.WithTimeout(context.Background(), topicTimeout)
	defer cancel()
	if err := EnsureTopic(ctx, cl, in.Settings().DeadLetterTopic); err != nil {
		cl.Close()
		return nil, err
	}
	// Likewise the retry tiers' topics.
	for _, t := range tierTopics {
		if err := ensureTopic(ctx, cl, t, "retry tier topic", "set Settings.RetryTopicFormat so that it names existing topics"); err != nil {
			cl.Close()
			return nil, err
		}
	}
	in.group = cfg.Group
	r.cl, r.in = cl, in
	return r, nil
}

// noProducer stands in for the client before it exists (NewRunner's check of the settings).
type noProducer struct{}

func (noProducer) ProduceSync(context.Context, ...*kgo.Record) kgo.ProduceResults { return nil }

// Client returns the runner's Kafka client (for metrics or admin requests).
func (r *Runner) Client() *kgo.Client { return r.cl }

// Inbox returns the runner's Inbox.
func (r *Runner) Inbox() *Inbox { return r.in }

// Run consumes until ctx is done, then finishes the record in hand (retries included), commits
// the processed offsets, leaves the group and closes the client; it returns nil then. It returns
// an error (after committing what was settled before it and closing) when a record cannot be
// settled: a dead letter that cannot be produced, or a database outage longer than
// Settings.OutageBudget (an [*OutageError]); that record and the ones after it are not
// committed, so a new Runner of the group resumes with it. Run must be called once.
func (r *Runner) Run(ctx context.Context) error {
	defer r.cl.CloseAllowingRebalance()
	// Records are finished even when ctx ends meanwhile: a stop never interrupts a record.
	work := context.WithoutCancel(ctx)
	// Parked versions: swept before the first poll and every ParkSweepInterval (checked between
	// records too, so a busy partition does not starve the sweep; an idle poll wakes up for it).
	s := r.in.Settings()
	sweeps := (s.VersionHeader != "" || s.VersionFunc != nil) && r.in.anyGapPark()
	var lastSweep time.Time
	batch := s.BatchMaxRecords > 1
	pollMax := r.maxPoll
	if batch {
		pollMax = s.BatchMaxRecords
	}
	sweep := func() error {
		if !sweeps || (!lastSweep.IsZero() && time.Since(lastSweep) < s.ParkSweepInterval) {
			return nil
		}
		lastSweep = time.Now()
		sw, err := r.in.SweepParked(work, r.h)
		var re *SweepReadError
		if errors.As(err, &re) {
			r.log.Warn("inbox: parked sweep failed; next one later", "err", err)
			return nil
		}
		if err == nil && (sw.Resumed+sw.Stale+sw.DeadLettered+sw.Compensated > 0) {
			r.log.Debug("inbox: parked table swept", "resumed", sw.Resumed, "stale", sw.Stale,
				"dead_lettered", sw.DeadLettered, "compensated", sw.Compensated, "parked", sw.Parked)
		}
		return err
	}
	for ctx.Err() == nil {
		if err := sweep(); err != nil {
			return err
		}
		// Wake up for the next sweep, or the next paused partition to resume.
		var wake time.Time
		if sweeps {
			wake = lastSweep.Add(s.ParkSweepInterval)
		}
		if next, ok := r.resumeDue(); ok && (wake.IsZero() || next.Before(wake)) {
			wake = next
		}
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if !wake.IsZero() {
			pctx, cancel = context.WithTimeout(ctx, max(time.Until(wake), time.Millisecond))
		}
		fetches := r.cl.PollRecords(pctx, pollMax)
		cancel()
		if batch && ctx.Err() == nil {
			fetches = r.fill(ctx, fetches, pollMax, s.BatchMaxWait)
		}
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				r.log.Warn("inbox: fetch error", "topic", t, "partition", p, "err", err)
			}
		})
		r.recordLag(fetches)
		var procErr error
		// Batch mode: consecutive ordinary records are settled together (ProcessBatch); a
		// retry copy ends the run and goes alone through Process.
		var run []*kgo.Record
		flush := func() error {
			if len(run) == 0 {
				return nil
			}
			if err := sweep(); err != nil {
				return err
			}
			_, err := r.in.ProcessBatch(work, run, r.h)
			if err == nil {
				r.mu.Lock()
				for _, rec := range run {
					r.pending[topicPartition{rec.Topic, rec.Partition}] = rec
				}
				r.mu.Unlock()
			}
			run = run[:0]
			return err
		}
		iter := fetches.RecordIter()
		for !iter.Done() && ctx.Err() == nil {
			rec := iter.Next()
			tp := topicPartition{rec.Topic, rec.Partition}
			if _, ok := r.waiting[tp]; ok {
				continue // paused on an earlier copy of this batch: fetched again once resumed
			}
			if batch && RetryTier(rec) == 0 {
				run = append(run, rec)
				continue
			}
			if procErr = flush(); procErr != nil {
				break
			}
			if procErr = sweep(); procErr != nil {
				break
			}
			if at, ok := RetryAt(rec); ok && time.Now().Before(at) {
				r.wait(tp, rec, at)
				continue
			}
			if _, err := r.in.Process(work, rec, r.h); err != nil {
				procErr = err
				break
			}
			r.mu.Lock()
			r.pending[topicPartition{rec.Topic, rec.Partition}] = rec
			r.mu.Unlock()
		}
		if procErr == nil {
			procErr = flush()
		}
		r.commit(work)
		r.cl.AllowRebalance()
		if procErr != nil {
			return procErr
		}
	}
	return nil
}

// fill polls again, up to maxWait, while a batch-mode poll returned some but fewer than n
// records, and returns all of them.
func (r *Runner) fill(ctx context.Context, fetches kgo.Fetches, n int, maxWait time.Duration) kgo.Fetches {
	got := fetches.NumRecords()
	if got == 0 || got >= n || maxWait <= 0 {
		return fetches
	}
	deadline := time.Now().Add(maxWait)
	for got < n && time.Now().Before(deadline) {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		more := r.cl.PollRecords(wctx, n-got)
		cancel()
		fetches = append(fetches, more...)
		if more.IsClientClosed() || ctx.Err() != nil {
			break
		}
		got += more.NumRecords()
	}
	return fetches
}

// recordLag sets outbox_inbox_consumer_lag of the partitions the poll returned records for: the
// partition's high watermark minus the consumer's position (the offset after the last record
// returned).
func (r *Runner) recordLag(fetches kgo.Fetches) {
	if r.in.metrics == nil {
		return
	}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		pos := p.Records[len(p.Records)-1].Offset + 1
		r.in.metrics.setLag(r.in.s.Consumer, p.Topic, p.Partition, p.HighWatermark-pos)
	})
}

// wait pauses the partition of a retry copy whose retry_at has not come, moves its position
// back to the copy (so it is fetched again) and remembers when to resume it.
func (r *Runner) wait(tp topicPartition, rec *kgo.Record, at time.Time) {
	r.cl.PauseFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
	r.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{
		tp.topic: {tp.partition: {Epoch: rec.LeaderEpoch, Offset: rec.Offset}},
	})
	r.waiting[tp] = at
	r.log.Debug("inbox: partition paused until its retry copy is due", "topic", tp.topic,
		"partition", tp.partition, "offset", rec.Offset, "retry_at", at)
}

// resumeDue resumes the paused partitions whose retry_at has come and returns when the next one
// is due (ok=false: none is waiting).
func (r *Runner) resumeDue() (next time.Time, ok bool) {
	now := time.Now()
	for tp, at := range r.waiting {
		if !now.Before(at) {
			r.cl.ResumeFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
			delete(r.waiting, tp)
			continue
		}
		if !ok || at.Before(next) {
			next, ok = at, true
		}
	}
	return next, ok
}

// commit commits the offsets of the settled records synchronously.
func (r *Runner) commit(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pending) == 0 {
		return
	}
	recs := make([]*kgo.Record, 0, len(r.pending))
	for _, rec := range r.pending {
		recs = append(recs, rec)
	}
	if err := r.cl.CommitRecords(ctx, recs...); err != nil {
		// The records are settled: a redelivery is a duplicate, acknowledged without effect.
		r.log.Warn("inbox: offset commit failed", "err", err)
	}
	clear(r.pending)
}

func (r *Runner) onRevoked(ctx context.Context, _ *kgo.Client, _ map[string][]int32) {
	r.commit(ctx)
}

func (r *Runner) onLost(context.Context, *kgo.Client, map[string][]int32) {
	r.mu.Lock()
	clear(r.pending)
	r.mu.Unlock()
}
