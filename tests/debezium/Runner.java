// Debezium embedded runner for the Debezium compatibility tests (crates/testkit/src/debezium.rs,
// tests/debezium_e2e.rs): Debezium's connector with the outbox EventRouter (`transforms=outbox`,
// settings from the properties file), each routed record serialized exactly as a Kafka Connect
// worker does (Kafka's WorkerSourceTask#convertTransformedRecord: the header converter on each
// header, then the key and value converters with those headers) and produced with a plain
// KafkaProducer (byte[] serializers, acks=all, idempotent, the default partitioner, the
// record's own partition when it has one, the record timestamp as Debezium set it).
//
//   java -cp '<libs>/*' tests/debezium/Runner.java <debezium.properties>
//
// Properties read here (everything else goes to the engine as it is):
//   test.bootstrap             Kafka of the outputs.
//   test.outputs=s,j,js        the outputs of this run; for each NAME:
//   test.output.NAME.key       string | json | json_schemas (StringConverter, JsonConverter with
//   test.output.NAME.value       schemas.enable false / true), configured as key / value converter
//   test.output.NAME.prefix    each record goes to prefix + its routed topic
//   test.stop_after=N          after N routed records are produced and committed: close the
//                              engine (offsets flushed), print STOPPED, exit 0. Without it the
//                              runner runs until SIGTERM, then closes the engine.
//   test.convert_errors=skip   a record a converter cannot serialize is left out of that output
//                              (CONVERT_FAILED line) instead of failing the run as a Connect
//                              worker does (errors.tolerance=none).
//   test.mariadb.offsets=true  the MySQL connector on MariaDB: commit the position after the
//                              last complete rows event instead of the connector's offset (see
//                              handleBatch).
// Prints STARTED when the connector task runs and `COMPLETED success=...` when the engine ends.
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import java.io.FileInputStream;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.Converter;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;
import org.apache.kafka.connect.storage.StringConverter;

public class Runner {
    /** One output: its converters and topic prefix. */
    static final class Output {
        final String name;
        final String prefix;
        final Converter key;
        final Converter value;
        final SimpleHeaderConverter header = new SimpleHeaderConverter();

        Output(String name, String prefix, String key, String value) {
            this.name = name;
            this.prefix = prefix;
            this.key = converter(key, true);
            this.value = converter(value, false);
            // A Connect worker's default header.converter, configured as the worker does.
            Map<String, Object> hc = new HashMap<>();
            hc.put("converter.type", "header");
            header.configure(hc);
        }

        static Converter converter(String kind, boolean isKey) {
            Map<String, Object> conf = new HashMap<>();
            Converter c;
            switch (kind) {
                case "string":
                    c = new StringConverter();
                    break;
                case "json":
                    c = new JsonConverter();
                    conf.put("schemas.enable", "false");
                    break;
                case "json_schemas":
                    c = new JsonConverter();
                    conf.put("schemas.enable", "true");
                    break;
                default:
                    throw new IllegalArgumentException("unknown converter " + kind + " (string | json | json_schemas)");
            }
            c.configure(conf, isKey);
            return c;
        }

        /** WorkerSourceTask#convertTransformedRecord, to prefix + the routed topic. */
        ProducerRecord<byte[], byte[]> convert(SourceRecord r) {
            String topic = r.topic();
            RecordHeaders headers = new RecordHeaders();
            if (r.headers() != null) {
                for (Header h : r.headers()) {
                    headers.add(h.key(), header.fromConnectHeader(topic, h.key(), h.schema(), h.value()));
                }
            }
            byte[] k = key.fromConnectData(topic, headers, r.keySchema(), r.key());
            byte[] v = value.fromConnectData(topic, headers, r.valueSchema(), r.value());
            Long ts = r.timestamp();
            if (ts != null && ts < 0) ts = null;
            return new ProducerRecord<>(prefix + topic, r.kafkaPartition(), ts, k, v, headers);
        }
    }

    /** A schema with its fields, for error messages. */
    static String describe(org.apache.kafka.connect.data.Schema schema) {
        if (schema == null) return "null";
        StringBuilder b = new StringBuilder(schema.type() + (schema.name() == null ? "" : "(" + schema.name() + ")"));
        if (schema.type() == org.apache.kafka.connect.data.Schema.Type.STRUCT) {
            b.append('{');
            for (org.apache.kafka.connect.data.Field f : schema.fields()) b.append(f.name()).append(':').append(describe(f.schema())).append(',');
            b.append('}');
        }
        return b.toString();
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) { props.load(in); }

        List<Output> outputs = new ArrayList<>();
        for (String name : props.getProperty("test.outputs", "").split(",")) {
            name = name.trim();
            if (name.isEmpty()) continue;
            outputs.add(new Output(name,
                props.getProperty("test.output." + name + ".prefix", ""),
                props.getProperty("test.output." + name + ".key", "string"),
                props.getProperty("test.output." + name + ".value", "string")));
        }
        if (outputs.isEmpty()) throw new IllegalArgumentException("test.outputs names no output");
        long stopAfter = Long.parseLong(props.getProperty("test.stop_after", "-1"));
        boolean skipConvertErrors = props.getProperty("test.convert_errors", "fail").equals("skip");
        boolean mariaOffsets = Boolean.parseBoolean(props.getProperty("test.mariadb.offsets", "false"));

        Properties p = new Properties();
        p.put("bootstrap.servers", props.getProperty("test.bootstrap"));
        p.put("acks", "all");
        p.put("enable.idempotence", "true");
        p.put("linger.ms", "1");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);

        CountDownLatch done = new CountDownLatch(1);
        AtomicBoolean stopping = new AtomicBoolean(false);
        AtomicBoolean failed = new AtomicBoolean(false);
        long[] produced = {0};
        AtomicReference<Map<String, Object>> lastSafe = new AtomicReference<>();

        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine
            .create(ChangeEventFormat.of(io.debezium.embedded.Connect.class))
            .using(props)
            .using(new DebeziumEngine.ConnectorCallback() {
                @Override public void taskStarted() { System.out.println("STARTED"); System.out.flush(); }
            })
            .using((success, message, error) -> {
                System.out.println("COMPLETED success=" + success + " " + message);
                if (error != null) error.printStackTrace();
                if (!success) failed.set(true);
                System.out.flush();
                done.countDown();
            })
            .notifying((List<RecordChangeEvent<SourceRecord>> records,
                        DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer) -> {
                // Past the stop point nothing more is produced or committed.
                if (stopping.get()) return;
                List<RecordChangeEvent<SourceRecord>> routed = new ArrayList<>(records.size());
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                boolean reachedStop = false;
                for (RecordChangeEvent<SourceRecord> r : records) {
                    SourceRecord sr = r.record();
                    if (sr.topic() != null && !sr.topic().startsWith("__debezium")) {
                        if (stopAfter >= 0 && produced[0] >= stopAfter) { reachedStop = true; break; }
                        for (Output o : outputs) {
                            ProducerRecord<byte[], byte[]> pr;
                            try {
                                pr = o.convert(sr);
                            } catch (RuntimeException e) {
                                // A Connect worker fails the task here (errors.tolerance=none):
                                // so does the runner, after naming the record, unless
                                // test.convert_errors=skip (the record is left out of that output).
                                Header idHeader = sr.headers().lastWithName("id");
                                System.out.println("CONVERT_FAILED output=" + o.name
                                    + " id=" + (idHeader == null ? null : idHeader.value())
                                    + " topic=" + sr.topic()
                                    + " key=" + sr.key() + " headers=" + sr.headers()
                                    + " valueSchema=" + describe(sr.valueSchema())
                                    + " value=" + sr.value() + " (" + (sr.value() == null ? "null" : sr.value().getClass().getName())
                                    + "): " + e);
                                System.out.flush();
                                if (skipConvertErrors) continue;
                                throw e;
                            }
                            sent.add(producer.send(pr));
                        }
                        produced[0]++;
                    }
                    routed.add(r);
                }
                for (Future<RecordMetadata> f : sent) {
                    try { f.get(); } catch (Exception e) { throw new InterruptedException("produce failed: " + e); }
                }
                if (!mariaOffsets) {
                    for (RecordChangeEvent<SourceRecord> r : routed) committer.markProcessed(r);
                } else {
                    // The MySQL connector on MariaDB (as tests/bench/debezium/Runner.java): no
                    // BEGIN query event (MariaDB starts a transaction with its own GTID event), so
                    // a record's offset holds the position after its rows event plus `row`, and a
                    // restart there would skip `row` rows of the NEXT rows event. Commit the
                    // position after the last rows event known to be complete, without
                    // `row`/`event`.
                    for (int i = 0; i < routed.size(); i++) {
                        RecordChangeEvent<SourceRecord> r = routed.get(i);
                        Map<String, ?> o = r.record().sourceOffset();
                        boolean complete = true;
                        if (i + 1 < records.size()) {
                            Map<String, ?> n = records.get(i + 1).record().sourceOffset();
                            complete = !(Objects.equals(o.get("file"), n.get("file"))
                                && Objects.equals(o.get("pos"), n.get("pos")));
                        }
                        if (complete && o != null && o.containsKey("pos")) {
                            Map<String, Object> safe = new HashMap<>(o);
                            safe.remove("row");
                            safe.remove("event");
                            lastSafe.set(safe);
                        }
                        if (lastSafe.get() == null) { committer.markProcessed(r); continue; }
                        DebeziumEngine.Offsets off = committer.buildOffsets();
                        for (Map.Entry<String, Object> e : lastSafe.get().entrySet()) off.set(e.getKey(), e.getValue());
                        committer.markProcessed(r, off);
                    }
                }
                committer.markBatchFinished();
                if (stopAfter >= 0 && (reachedStop || produced[0] >= stopAfter)) {
                    stopping.set(true);
                    System.out.println("PRODUCED " + produced[0]);
                    System.out.flush();
                    done.countDown();
                }
            })
            .build();

        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        AtomicBoolean closed = new AtomicBoolean(false);
        Runnable close = () -> {
            if (!closed.compareAndSet(false, true)) return;
            try {
                engine.close();
                executor.shutdown();
                executor.awaitTermination(60, TimeUnit.SECONDS);
                producer.close();
            } catch (Exception e) {
                e.printStackTrace();
            }
        };
        AtomicBoolean terminating = new AtomicBoolean(false);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> { terminating.set(true); close.run(); }));
        done.await();
        // SIGTERM: the shutdown hook closes the engine (offsets flushed) and the JVM exits.
        if (terminating.get()) return;
        if (stopAfter >= 0 && stopping.get()) {
            // The engine commits the task's offsets when it stops its tasks.
            close.run();
            System.out.println(failed.get() ? "FAILED" : "STOPPED");
            System.out.flush();
            Runtime.getRuntime().halt(failed.get() ? 1 : 0);
        }
        // The engine ended by itself (failure): exit non-zero.
        close.run();
        System.out.flush();
        Runtime.getRuntime().halt(failed.get() ? 1 : 2);
    }
}
