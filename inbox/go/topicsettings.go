package inbox

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TopicSettings override, for one topic, the consumer-wide settings of the same names
// (inbox/CONTRACT.md, "Per-topic settings"). A zero field inherits the consumer-wide value;
// RetryTiers: nil inherits, a non-nil empty slice means no tiers for that topic. The topic
// whose settings apply to a record is its original_topic header when present (a retry copy),
// else its own topic.
type TopicSettings struct {
	// MaxAttempts overrides Settings.MaxAttempts.
	MaxAttempts int
	// BackoffInitial and BackoffMax override Settings.BackoffInitial and Settings.BackoffMax.
	BackoffInitial, BackoffMax time.Duration
	// RetryTiers overrides Settings.RetryTiers (nil: inherit; []time.Duration{}: none).
	RetryTiers []time.Duration
	// GapPolicy overrides Settings.GapPolicy ("": inherit).
	GapPolicy GapPolicy
	// GapDeadline overrides Settings.GapDeadline.
	GapDeadline time.Duration
	// InboxRetention overrides Settings.InboxRetention (read by outbox-relay prune --inbox
	// --topic-retention; the helper itself deletes nothing).
	InboxRetention time.Duration
}

// topicSettings is the settings that apply to one topic, every field resolved.
type topicSettings struct {
	maxAttempts                int
	backoffInitial, backoffMax time.Duration
	retryTiers                 []time.Duration
	gapPolicy                  GapPolicy
	gapDeadline                time.Duration
	inboxRetention             time.Duration
}

// resolveTopics checks s.Topics (s's defaults already filled in) and returns the consumer-wide
// settings and each overridden topic's, resolved.
func resolveTopics(s Settings) (topicSettings, map[string]topicSettings, error) {
	def := topicSettings{
		maxAttempts: s.MaxAttempts, backoffInitial: s.BackoffInitial, backoffMax: s.BackoffMax,
		retryTiers: s.RetryTiers, gapPolicy: s.GapPolicy, gapDeadline: s.GapDeadline,
		inboxRetention: s.InboxRetention,
	}
	names := make([]string, 0, len(s.Topics))
	for name := range s.Topics {
		names = append(names, name)
	}
	sort.Strings(names) // the first error is always the same one
	out := make(map[string]topicSettings, len(names))
	for _, name := range names {
		o := s.Topics[name]
		bad := func(field, rule string) error {
			return fmt.Errorf("inbox: Settings.Topics[%q].%s %s", name, field, rule)
		}
		if name == "" {
			return def, nil, errors.New("inbox: Settings.Topics has an empty topic name")
		}
		ts := def
		if o.MaxAttempts < 0 {
			return def, nil, bad("MaxAttempts", "must be >= 1")
		}
		if o.MaxAttempts != 0 {
			ts.maxAttempts = o.MaxAttempts
		}
		if o.BackoffInitial < 0 {
			return def, nil, bad("BackoffInitial", "must not be negative")
		}
		if o.BackoffMax < 0 {
			return def, nil, bad("BackoffMax", "must not be negative")
		}
		if o.BackoffInitial != 0 {
			ts.backoffInitial = o.BackoffInitial
		}
		if o.BackoffMax != 0 {
			ts.backoffMax = o.BackoffMax
		}
		if ts.backoffMax < ts.backoffInitial {
			return def, nil, bad("BackoffInitial", fmt.Sprintf("(%s) must not exceed BackoffMax (%s)", ts.backoffInitial, ts.backoffMax))
		}
		if o.RetryTiers != nil {
			for _, d := range o.RetryTiers {
				if d < 0 {
					return def, nil, bad("RetryTiers", "must not be negative")
				}
			}
			ts.retryTiers = slices.Clone(o.RetryTiers)
			if ts.retryTiers == nil {
				ts.retryTiers = []time.Duration{}
			}
		}
		switch o.GapPolicy {
		case "":
		case GapPark, GapDeadLetter, GapRetry:
			ts.gapPolicy = o.GapPolicy
		default:
			return def, nil, bad("GapPolicy", fmt.Sprintf("%q is not park, dead_letter or retry", o.GapPolicy))
		}
		if o.GapDeadline < 0 {
			return def, nil, bad("GapDeadline", "must not be negative")
		}
		if o.GapDeadline != 0 {
			ts.gapDeadline = o.GapDeadline
		}
		if o.InboxRetention < 0 {
			return def, nil, bad("InboxRetention", "must not be negative")
		}
		if o.InboxRetention != 0 {
			ts.inboxRetention = o.InboxRetention
		}
		out[name] = ts
	}
	return def, out, nil
}

// topicSettings is the one lookup of the per-topic settings: topic's override, else the
// consumer-wide values.
func (in *Inbox) topicSettings(topic string) topicSettings {
	if ts, ok := in.topics[topic]; ok {
		return ts
	}
	return in.defaults
}

// settingsTopic is the topic whose settings apply to rec: its original_topic header when
// present (a retry copy), else its own topic.
func settingsTopic(rec *kgo.Record) string {
	if t, ok := header(rec, HeaderOriginalTopic); ok && t != "" {
		return t
	}
	return rec.Topic
}

// settingsOf is the settings that apply to rec (those of settingsTopic(rec)).
func (in *Inbox) settingsOf(rec *kgo.Record) topicSettings {
	return in.topicSettings(settingsTopic(rec))
}

// InboxRetention is how long the inbox rows of topic (an original topic) are kept:
// Settings.Topics[topic].InboxRetention, else Settings.InboxRetention. The helper deletes
// nothing itself: outbox-relay prune --inbox does (--older-than, --topic-retention).
func (in *Inbox) InboxRetention(topic string) time.Duration {
	return in.topicSettings(topic).inboxRetention
}

// MaxAttemptsOf is the max_attempts of topic (an original topic).
func (in *Inbox) MaxAttemptsOf(topic string) int { return in.topicSettings(topic).maxAttempts }

// GapPolicyOf is the gap_policy of topic (an original topic).
func (in *Inbox) GapPolicyOf(topic string) GapPolicy { return in.topicSettings(topic).gapPolicy }

// GapDeadlineOf is the gap_deadline of topic (an original topic).
func (in *Inbox) GapDeadlineOf(topic string) time.Duration {
	return in.topicSettings(topic).gapDeadline
}

// anyGapPark says whether some topic (or the consumer-wide default) parks version gaps.
func (in *Inbox) anyGapPark() bool {
	if in.defaults.gapPolicy == GapPark {
		return true
	}
	for _, ts := range in.topics {
		if ts.gapPolicy == GapPark {
			return true
		}
	}
	return false
}
