package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The headers of a retry copy (inbox/CONTRACT.md, "Retry tiers").
const (
	HeaderRetryCount        = "retry_count"
	HeaderRetryAt           = "retry_at"
	HeaderOriginalTopic     = "original_topic"
	HeaderOriginalPartition = "original_partition"
	HeaderOriginalOffset    = "original_offset"
	HeaderRetryError        = "retry_error"
	HeaderRetryHistory      = "retry_history"
)

// location is a record's place in Kafka.
type location struct {
	topic     string
	partition int32
	offset    int64
}

// originOf is where the first record of a retry copy was (its original_* headers), or rec's
// own place when it is not a copy (or the headers are not readable).
func originOf(rec *kgo.Record) location {
	at := location{rec.Topic, rec.Partition, rec.Offset}
	t, ok1 := header(rec, HeaderOriginalTopic)
	p, ok2 := header(rec, HeaderOriginalPartition)
	o, ok3 := header(rec, HeaderOriginalOffset)
	if !ok1 || !ok2 || !ok3 || t == "" {
		return at
	}
	pn, err1 := strconv.ParseInt(p, 10, 32)
	on, err2 := strconv.ParseInt(o, 10, 64)
	if err1 != nil || err2 != nil {
		return at
	}
	return location{t, int32(pn), on}
}

// Origin is where the first record of a retry copy was (its original_topic,
// original_partition, original_offset headers), or rec's own topic, partition and offset when it
// is not a copy.
func Origin(rec *kgo.Record) (topic string, partition int32, offset int64) {
	at := originOf(rec)
	return at.topic, at.partition, at.offset
}

// RetryTier is the retry tier a record is in: its retry_count header, 0 when absent (not a
// copy) or not an integer.
func RetryTier(rec *kgo.Record) int {
	v, ok := header(rec, HeaderRetryCount)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// RetryAt is when a retry copy may be processed (its retry_at header); ok=false for a record
// without a readable one.
func RetryAt(rec *kgo.Record) (time.Time, bool) {
	if RetryTier(rec) == 0 {
		return time.Time{}, false
	}
	v, ok := header(rec, HeaderRetryAt)
	if !ok {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// RetryTiersOf returns the retry tiers of topic (the original topic of a copy):
// Settings.Topics[topic].RetryTiers when set, else Settings.RetryTiers.
func (in *Inbox) RetryTiersOf(topic string) []time.Duration {
	return in.topicSettings(topic).retryTiers
}

// RetryTopic is the topic of tier n (1-based) of topic: Settings.RetryTopicFormat with
// {topic} and {n} replaced.
func (in *Inbox) RetryTopic(topic string, n int) string {
	return strings.NewReplacer("{topic}", topic, "{n}", strconv.Itoa(n)).Replace(in.s.RetryTopicFormat)
}

// RetryTopics returns the tier topics of topic, tier 1 first (none without tiers).
func (in *Inbox) RetryTopics(topic string) []string {
	tiers := in.RetryTiersOf(topic)
	out := make([]string, 0, len(tiers))
	for n := 1; n <= len(tiers); n++ {
		out = append(out, in.RetryTopic(topic, n))
	}
	return out
}

// historyEntry is one object of the retry_history header.
type historyEntry struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Attempts  int    `json:"attempts"`
	Error     string `json:"error"`
	FailedAt  int64  `json:"failed_at"`
}

// exhausted settles a record whose attempts are used up: a copy to the next retry tier of its
// original topic when one is left (outcome Retried), else the dead letter. A parked record's
// row is deleted once the copy or dead letter is acknowledged.
func (in *Inbox) exhausted(ctx context.Context, rec *kgo.Record, res Result, parked *versionKey) (Result, error) {
	at := originOf(rec)
	tiers := in.RetryTiersOf(at.topic)
	n := RetryTier(rec) + 1
	if n > len(tiers) {
		return in.deadLetterParked(ctx, rec, res, parked)
	}
	now := time.Now()
	hist := []json.RawMessage{}
	if v, ok := header(rec, HeaderRetryHistory); ok {
		var old []json.RawMessage
		if json.Unmarshal([]byte(v), &old) == nil && old != nil {
			hist = old
		}
	}
	entry, err := json.Marshal(historyEntry{
		Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Attempts: res.Attempts, Error: res.Reason, FailedAt: now.UnixMilli(),
	})
	if err != nil {
		return Result{}, err
	}
	histJSON, err := json.Marshal(append(hist, entry))
	if err != nil {
		return Result{}, err
	}
	set := map[string]string{
		HeaderRetryCount:        strconv.Itoa(n),
		HeaderRetryAt:           strconv.FormatInt(now.Add(tiers[n-1]).UnixMilli(), 10),
		HeaderOriginalTopic:     at.topic,
		HeaderOriginalPartition: strconv.FormatInt(int64(at.partition), 10),
		HeaderOriginalOffset:    strconv.FormatInt(at.offset, 10),
		HeaderRetryError:        res.Reason,
		HeaderRetryHistory:      string(histJSON),
	}
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers)+len(set))
	for _, h := range rec.Headers {
		if _, replaced := set[h.Key]; !replaced {
			hs = append(hs, h)
		}
	}
	for _, k := range []string{HeaderRetryCount, HeaderRetryAt, HeaderOriginalTopic, HeaderOriginalPartition,
		HeaderOriginalOffset, HeaderRetryError, HeaderRetryHistory} {
		hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(set[k])})
	}
	topic := in.RetryTopic(at.topic, n)
	cp := &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: hs}
	pctx, cancel := context.WithTimeout(ctx, in.s.DeadLetterTimeout)
	defer cancel()
	if err := in.producer.ProduceSync(pctx, cp).FirstErr(); err != nil {
		return Result{}, fmt.Errorf("inbox: retry copy of %s/%d@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, topic, err)
	}
	if parked != nil {
		if err := in.deleteParked(ctx, *parked); err != nil {
			in.log.Warn("inbox: a retried parked row could not be removed", "consumer", in.s.Consumer, "err", err)
		}
	}
	res.Outcome = Retried
	return in.settled(rec, res)
}
