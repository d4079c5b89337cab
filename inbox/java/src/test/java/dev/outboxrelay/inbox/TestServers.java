package dev.outboxrelay.inbox;

import static org.junit.jupiter.api.Assertions.fail;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.mariadb.jdbc.MariaDbPoolDataSource;

/**
 * The real MariaDB/MySQL and Kafka the tests run against: {@code INBOX_TEST_DB_HOST} (127.0.0.1),
 * {@code INBOX_TEST_DB_PORT} (3306), {@code INBOX_TEST_DB_USER} (root), {@code
 * INBOX_TEST_DB_PASSWORD} (empty), {@code INBOX_TEST_BOOTSTRAP} (127.0.0.1:9092). Each instance
 * owns a fresh database {@code inbox_java_*} (with the inbox migration and the coupons table) and
 * drops it, and the topics it made, on close.
 */
final class TestServers {
  static final String BOOTSTRAP = env("INBOX_TEST_BOOTSTRAP", "127.0.0.1:9092");
  private static final String HOST = env("INBOX_TEST_DB_HOST", "127.0.0.1");
  private static final String PORT = env("INBOX_TEST_DB_PORT", "3306");
  private static final String MYSQL_PORT = env("INBOX_TEST_MYSQL_PORT", "3326");
  private static final String USER = env("INBOX_TEST_DB_USER", "root");
  private static final String PASSWORD = System.getenv().getOrDefault("INBOX_TEST_DB_PASSWORD", "");

  final String database = "inbox_java_" + UUID.randomUUID().toString().replace("-", "");
  final MariaDbPoolDataSource dataSource;
  private final Admin admin;
  private final KafkaProducer<byte[], byte[]> producer;
  private final List<String> topics = new ArrayList<>();
  private final List<String> groups = new ArrayList<>();
  private final String port;

  /** The server in the name ({@code mariadb}, {@code mysql}) and the one of INBOX_TEST_DB_PORT. */
  final String server;

  TestServers() throws Exception {
    this("mariadb");
  }

  /**
   * @param server {@code mariadb} (INBOX_TEST_DB_PORT) or {@code mysql} (MySQL 8.0 at
   *     INBOX_TEST_MYSQL_PORT, default 3326; same host, user and password)
   */
  TestServers(String server) throws Exception {
    this.server = server;
    this.port = server.equals("mysql") ? MYSQL_PORT : PORT;
    try (Connection c = DriverManager.getConnection(url(""));
        Statement s = c.createStatement()) {
      s.execute("CREATE DATABASE " + database);
    } catch (java.sql.SQLException e) {
      throw new IllegalStateException(
          "cannot connect to the "
              + server
              + " test server at "
              + HOST
              + ":"
              + port
              + " as "
              + USER
              + (server.equals("mysql")
                  ? " (set INBOX_TEST_MYSQL_PORT to a MySQL 8.0 server's port)"
                  : " (set INBOX_TEST_DB_PORT to a MariaDB server's port)")
              + ": "
              + e.getMessage(),
          e);
    }
    try (Connection c = DriverManager.getConnection(url(database) + "&allowMultiQueries=true");
        Statement s = c.createStatement()) {
      for (String file : new String[] {"0004_inbox.sql", "0006_inbox_parked.sql"}) {
        s.execute(Files.readString(Path.of("../../migrations", file), StandardCharsets.UTF_8));
      }
      s.execute(
          "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(191),"
              + " order_id VARCHAR(255), event_key VARCHAR(255), version BIGINT NULL)");
    }
    dataSource = new MariaDbPoolDataSource(url(database) + "&maxPoolSize=4&minPoolSize=1");
    admin = Admin.create(kafka());
    producer = new KafkaProducer<>(InboxRunner.deadLetterProducerConfig(kafka()));
  }

  private static String env(String name, String fallback) {
    String value = System.getenv(name);
    return value == null || value.isEmpty() ? fallback : value;
  }

  static Properties kafka() {
    Properties p = new Properties();
    p.put("bootstrap.servers", BOOTSTRAP);
    return p;
  }

  private String url(String db) {
    return "jdbc:mariadb://"
        + HOST
        + ":"
        + port
        + "/"
        + db
        + "?user="
        + USER
        + "&password="
        + PASSWORD
        + "&allowPublicKeyRetrieval=true";
  }

  /** A dead-letter producer (acks=all) the test closes with this object. */
  KafkaProducer<byte[], byte[]> producer() {
    return producer;
  }

  /** Creates a topic {@code inbox-java-<name>-<random>} and returns its name. */
  String topic(String name, int partitions) throws Exception {
    String topic = "inbox-java-" + name + "-" + UUID.randomUUID().toString().substring(0, 8);
    admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
    topics.add(topic);
    return topic;
  }

  /** A topic name {@code inbox-java-<name>-<random>} that is not created, deleted on close. */
  String freshTopicName(String name) {
    String topic = "inbox-java-" + name + "-" + UUID.randomUUID().toString().substring(0, 8);
    topics.add(topic);
    return topic;
  }

  /** Deletes {@code topic} on close (e.g. a tier topic the runner created). */
  void track(String topic) {
    if (!topics.contains(topic)) {
      topics.add(topic);
    }
  }

  /** The group's committed offset of one partition of a topic, or {@code null}. */
  Long committed(String group, String topic, int partition) throws Exception {
    OffsetAndMetadata om =
        admin
            .listConsumerGroupOffsets(group)
            .partitionsToOffsetAndMetadata()
            .get()
            .get(new TopicPartition(topic, partition));
    return om == null ? null : om.offset();
  }

  /** A consumer group id {@code inbox-java-<name>-<random>}, deleted on close. */
  String group(String name) {
    String group = "inbox-java-" + name + "-" + UUID.randomUUID().toString().substring(0, 8);
    groups.add(group);
    return group;
  }

  /** Produces a record like the relay's (headers event_key, aggregate_type=order, version). */
  void produce(String topic, Integer partition, String key, String eventKey, String value)
      throws Exception {
    produce(topic, partition, key, eventKey, value, null);
  }

  /** As above, with a {@code version} header when {@code version} is set. */
  void produce(
      String topic, Integer partition, String key, String eventKey, String value, Long version)
      throws Exception {
    ProducerRecord<byte[], byte[]> r =
        new ProducerRecord<>(topic, partition, bytes(key), bytes(value));
    if (eventKey != null) {
      r.headers().add("event_key", bytes(eventKey));
    }
    r.headers().add("aggregate_type", bytes("order"));
    if (version != null) {
      r.headers().add("version", bytes(version.toString()));
    }
    producer.send(r).get();
  }

  /** As {@link #produce} without waiting for the acknowledgement (flush the producer after). */
  void produceAsync(String topic, Integer partition, String key, String eventKey, String value) {
    ProducerRecord<byte[], byte[]> r =
        new ProducerRecord<>(topic, partition, bytes(key), bytes(value));
    r.headers().add("event_key", bytes(eventKey));
    r.headers().add("aggregate_type", bytes("order"));
    producer.send(r);
  }

  /** Reads every record of a topic from its beginning to its current end. */
  List<ConsumerRecord<byte[], byte[]>> readAll(String topic, int expectAtLeast) throws Exception {
    Properties p = kafka();
    p.put("key.deserializer", ByteArrayDeserializer.class.getName());
    p.put("value.deserializer", ByteArrayDeserializer.class.getName());
    List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
    try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
      List<TopicPartition> tps = new ArrayList<>();
      c.partitionsFor(topic).forEach(i -> tps.add(new TopicPartition(topic, i.partition())));
      c.assign(tps);
      c.seekToBeginning(tps);
      long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
      Map<TopicPartition, Long> end = c.endOffsets(tps);
      while (out.size() < expectAtLeast
          || tps.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
        if (System.nanoTime() > deadline) {
          fail("read " + out.size() + " records of " + topic + ", expected " + expectAtLeast);
        }
        c.poll(Duration.ofMillis(200)).forEach(out::add);
        if (out.size() < expectAtLeast) {
          end.putAll(c.endOffsets(tps));
        }
      }
    }
    return out;
  }

  /** The group's committed offsets of a topic (partition -> offset, absent when none). */
  Map<Integer, Long> committed(String group) throws Exception {
    Map<Integer, Long> out = new HashMap<>();
    Map<TopicPartition, OffsetAndMetadata> offsets =
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
    offsets.forEach((tp, om) -> out.put(tp.partition(), om == null ? null : om.offset()));
    return out;
  }

  /** End offsets of a topic's partitions. */
  Map<Integer, Long> endOffsets(String topic) throws Exception {
    Map<Integer, Long> out = new HashMap<>();
    var desc = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
    Map<TopicPartition, org.apache.kafka.clients.admin.OffsetSpec> spec = new HashMap<>();
    desc.partitions()
        .forEach(
            p ->
                spec.put(
                    new TopicPartition(topic, p.partition()),
                    org.apache.kafka.clients.admin.OffsetSpec.latest()));
    admin
        .listOffsets(spec)
        .all()
        .get()
        .forEach((tp, info) -> out.put(tp.partition(), info.offset()));
    return out;
  }

  long count(String sql, Object... args) throws SQLException {
    try (Connection c = dataSource.getConnection();
        PreparedStatement ps = c.prepareStatement(sql)) {
      for (int i = 0; i < args.length; i++) {
        ps.setObject(i + 1, args[i]);
      }
      try (ResultSet rs = ps.executeQuery()) {
        rs.next();
        return rs.getLong(1);
      }
    }
  }

  /** The first column of every row of {@code sql}, as text (UTF-8 for binary columns). */
  List<String> strings(String sql) throws SQLException {
    List<String> out = new ArrayList<>();
    try (Connection c = dataSource.getConnection();
        PreparedStatement ps = c.prepareStatement(sql);
        ResultSet rs = ps.executeQuery()) {
      while (rs.next()) {
        byte[] b = rs.getBytes(1);
        out.add(b == null ? null : new String(b, StandardCharsets.UTF_8));
      }
    }
    return out;
  }

  long coupons(String eventKey) throws SQLException {
    return count("SELECT COUNT(*) FROM coupons WHERE event_key = ?", eventKey);
  }

  /** Waits (polling observable state, at most 60 s) until {@code condition} holds. */
  static void await(String what, BooleanSupplier condition) throws InterruptedException {
    long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        fail("timed out waiting for " + what);
      }
      Thread.sleep(20);
    }
  }

  static byte[] bytes(String s) {
    return s == null ? null : s.getBytes(StandardCharsets.UTF_8);
  }

  static String header(ConsumerRecord<?, ?> r, String name) {
    Header h = r.headers().lastHeader(name);
    return h == null ? null : new String(h.value(), StandardCharsets.UTF_8);
  }

  /** Closes the clients, deletes the topics and drops the database. */
  void close() throws Exception {
    producer.close();
    try {
      if (!groups.isEmpty()) {
        admin.deleteConsumerGroups(groups).all().get();
      }
      if (!topics.isEmpty()) {
        admin.deleteTopics(topics).all().get();
      }
    } finally {
      admin.close();
      dataSource.close();
      try (Connection c = DriverManager.getConnection(url(""));
          Statement s = c.createStatement()) {
        s.execute("DROP DATABASE IF EXISTS " + database);
      }
    }
  }
}
