package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// EnsureTopic makes sure topic exists before the first dead letter needs it: it asks the
// brokers for the topic's metadata and, when it does not exist, creates it with the broker's
// defaults (partitions, replication) through the admin CreateTopics request. A topic another
// client created meanwhile counts as there. It returns an error naming the topic and the fix
// when the broker refuses (an invalid name, a creation policy, missing CREATE permission) or
// cannot be asked before ctx is done. [NewRunner] calls it for Settings.DeadLetterTopic.
func EnsureTopic(ctx context.Context, cl *kgo.Client, topic string) error {
	return ensureTopic(ctx, cl, topic, "dead-letter topic", "set Settings.DeadLetterTopic to an existing topic")
}

// ensureTopic is EnsureTopic for a topic of the given role; fix is the settings' way out.
func ensureTopic(ctx context.Context, cl *kgo.Client, topic, role, fix string) error {
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("inbox: %s %q: reading its metadata: %w", role, topic, err)
	}
	d, ok := td[topic]
	if ok && d.Err == nil {
		return nil
	}
	if ok && !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return refused(topic, role, fix, d.Err)
	}
	res, err := adm.CreateTopic(ctx, -1, -1, nil, topic)
	if err == nil {
		err = res.Err
	}
	if err == nil || errors.Is(err, kerr.TopicAlreadyExists) {
		return nil
	}
	return refused(topic, role, fix, err)
}

func refused(topic, role, fix string, err error) error {
	return fmt.Errorf("inbox: %s %q does not exist and the broker refused to create it: %w; "+
		"create it (kafka-topics.sh --create --topic %s), grant this client CREATE on it, or %s "+
		"(a valid name: at most 249 of [a-zA-Z0-9._-])",
		role, topic, err, topic, fix)
}
