package dev.outboxrelay.inbox;

import java.time.Duration;
import java.util.List;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

/**
 * The dead-letter topic exists before the first dead letter needs it ({@code inbox/CONTRACT.md},
 * "Dead letters"): {@link InboxRunner.Builder#build()} calls {@link #ensure} for the inbox's
 * dead-letter topic; call it yourself with your own poll loop.
 */
public final class DeadLetterTopics {
  private DeadLetterTopics() {}

  /**
   * Makes sure {@code topic} exists: describes it and, when the broker does not know it, creates it
   * with the broker's defaults (partitions, replication) through the admin CreateTopics request; a
   * topic another client created meanwhile counts as there.
   *
   * @param kafka the client properties ({@code bootstrap.servers} at least; only admin client
   *     settings are used)
   * @param topic the dead-letter topic
   * @param timeout the longest each admin request may take
   * @throws InboxException the topic is missing and the broker refused to create it (an invalid
   *     name, a creation policy, no CREATE permission) or could not be asked; the message names the
   *     topic and the fix
   */
  public static void ensure(Properties kafka, String topic, Duration timeout) {
    ensure(kafka, topic, timeout, false);
  }

  /**
   * Makes sure the retry tier topics of {@code topics} exist, each topic by its own tier count
   * ({@link InboxSettings#retryTiers(String)}, {@link InboxSettings#retryTopic}), as {@link
   * #ensure} does the dead-letter topic; {@link InboxRunner#run} calls it before subscribing.
   *
   * @param kafka the client properties
   * @param settings the inbox settings
   * @param topics the consumer's topics
   * @param timeout the longest each admin request may take
   * @return the tier topics of {@code topics}, tier 1 first for each
   * @throws InboxException a tier topic is missing and the broker refused to create it
   */
  public static java.util.List<String> ensureRetryTopics(
      Properties kafka,
      InboxSettings settings,
      java.util.Collection<String> topics,
      Duration timeout) {
    java.util.List<String> tierTopics = new java.util.ArrayList<>();
    for (String topic : topics) {
      int tiers = settings.retryTiers(topic).size();
      for (int n = 1; n <= tiers; n++) {
        String tierTopic = settings.retryTopic(topic, n);
        ensure(kafka, tierTopic, timeout, true);
        tierTopics.add(tierTopic);
      }
    }
    return tierTopics;
  }

  private static void ensure(Properties kafka, String topic, Duration timeout, boolean tier) {
    Properties p = new Properties();
    p.putAll(kafka);
    p.keySet().removeIf(k -> !AdminClientConfig.configNames().contains(k.toString()));
    long ms = timeout.toMillis();
    try (Admin admin = Admin.create(p)) {
      try {
        admin.describeTopics(List.of(topic)).allTopicNames().get(ms, TimeUnit.MILLISECONDS);
        return;
      } catch (ExecutionException e) {
        if (!(e.getCause() instanceof UnknownTopicOrPartitionException)) {
          throw refused(topic, e.getCause(), tier);
        }
      }
      try {
        admin
            .createTopics(List.of(new NewTopic(topic, Optional.empty(), Optional.empty())))
            .all()
            .get(ms, TimeUnit.MILLISECONDS);
      } catch (ExecutionException e) {
        if (!(e.getCause() instanceof TopicExistsException)) {
          throw refused(topic, e.getCause(), tier);
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw refused(topic, e, tier);
    } catch (TimeoutException | RuntimeException e) {
      if (e instanceof InboxException ie) {
        throw ie;
      }
      throw refused(topic, e, tier);
    }
  }

  private static InboxException refused(String topic, Throwable cause, boolean tier) {
    if (tier) {
      return new InboxException(
          "retry tier topic \""
              + topic
              + "\" does not exist and the broker refused to create it: "
              + cause
              + "; create it (kafka-topics.sh --create --topic "
              + topic
              + "), grant this client CREATE on it, or set retryTopicFormat to name existing"
              + " topics (a valid name: at most 249 of [a-zA-Z0-9._-])",
          cause);
    }
    return new InboxException(
        "dead-letter topic \""
            + topic
            + "\" does not exist and the broker refused to create it: "
            + cause
            + "; create it (kafka-topics.sh --create --topic "
            + topic
            + "), grant this client CREATE on it, or set deadLetterTopic to an existing topic (a"
            + " valid name: at most 249 of [a-zA-Z0-9._-])",
        cause);
  }
}
