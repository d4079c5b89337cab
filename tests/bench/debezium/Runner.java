// Debezium embedded runner for `make bench` (crates/bench): the Debezium MySQL connector with
// the outbox event router, producing each routed record to Kafka with a plain KafkaProducer
// (acks=all, idempotent, linger.ms=1: the relay's settings), the way a Kafka Connect worker
// would. Run with the jars of pom.xml on the class path (Java single-file source launch):
//
//   java -cp '<libs>/*' tests/bench/debezium/Runner.java <debezium.properties> run|prime
//
// The properties file holds the Debezium engine/connector/transform settings plus
// `bench.bootstrap` (Kafka). Prints `STARTED` when the connector task runs; in `prime` mode it
// waits for the first record routed to a topic ending in `.prime`, commits its offset, closes
// the engine (offsets flushed to offset.storage.file.filename) and prints `PRIMED`. In `run`
// mode it runs until SIGTERM, then closes the engine.
import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import java.io.FileInputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;

public class Runner {
    static byte[] bytes(Object o) {
        if (o == null) return null;
        if (o instanceof byte[]) return (byte[]) o;
        if (o instanceof java.nio.ByteBuffer) {
            java.nio.ByteBuffer b = ((java.nio.ByteBuffer) o).duplicate();
            byte[] out = new byte[b.remaining()];
            b.get(out);
            return out;
        }
        return o.toString().getBytes(StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) { props.load(in); }
        boolean prime = args.length > 1 && args[1].equals("prime");

        Properties p = new Properties();
        p.put("bootstrap.servers", props.getProperty("bench.bootstrap"));
        p.put("acks", "all");
        p.put("enable.idempotence", "true");
        p.put("linger.ms", "1");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);

        CountDownLatch primed = new CountDownLatch(1);
        boolean mariaOffsets = Boolean.parseBoolean(props.getProperty("bench.mariadb.offsets", "false"));
        @SuppressWarnings("unchecked")
        java.util.Map<String, Object>[] lastSafe = new java.util.Map[1];
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine
            .create(ChangeEventFormat.of(io.debezium.embedded.Connect.class))
            .using(props)
            .using(new DebeziumEngine.ConnectorCallback() {
                @Override public void taskStarted() { System.out.println("STARTED"); System.out.flush(); }
            })
            .using((success, message, error) -> {
                System.out.println("COMPLETED success=" + success + " " + message);
                if (error != null) error.printStackTrace();
                System.out.flush();
                primed.countDown();
            })
            .notifying((List<RecordChangeEvent<SourceRecord>> records,
                        DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer) -> {
                List<Future<RecordMetadata>> sent = new ArrayList<>(records.size());
                boolean sawPrime = false;
                for (RecordChangeEvent<SourceRecord> r : records) {
                    SourceRecord sr = r.record();
                    if (sr.topic() == null || sr.topic().startsWith("__debezium")) continue;
                    if (sr.topic().endsWith(".prime")) sawPrime = true;
                    RecordHeaders headers = new RecordHeaders();
                    for (Header h : sr.headers()) headers.add(h.key(), bytes(h.value()));
                    sent.add(producer.send(new ProducerRecord<>(sr.topic(), null,
                        bytes(sr.key()), bytes(sr.value()), headers)));
                }
                for (Future<RecordMetadata> f : sent) {
                    try { f.get(); } catch (Exception e) { throw new InterruptedException("produce failed: " + e); }
                }
                if (!mariaOffsets) {
                    for (RecordChangeEvent<SourceRecord> r : records) committer.markProcessed(r);
                } else {
                    // The MySQL connector on MariaDB: no BEGIN query event (MariaDB starts a
                    // transaction with its own GTID event), so a record's offset holds the
                    // position after its rows event plus `row`, and a restart there would skip
                    // `row` rows of the NEXT rows event. Commit the position after the last
                    // rows event known to be complete, without `row`/`event`.
                    for (int i = 0; i < records.size(); i++) {
                        RecordChangeEvent<SourceRecord> r = records.get(i);
                        java.util.Map<String, ?> o = r.record().sourceOffset();
                        boolean complete = true;
                        if (i + 1 < records.size()) {
                            java.util.Map<String, ?> n = records.get(i + 1).record().sourceOffset();
                            complete = !(java.util.Objects.equals(o.get("file"), n.get("file"))
                                && java.util.Objects.equals(o.get("pos"), n.get("pos")));
                        }
                        if (complete && o != null && o.containsKey("pos")) {
                            java.util.Map<String, Object> safe = new java.util.HashMap<>(o);
                            safe.remove("row");
                            safe.remove("event");
                            lastSafe[0] = safe;
                        }
                        if (lastSafe[0] == null) { committer.markProcessed(r); continue; }
                        DebeziumEngine.Offsets off = committer.buildOffsets();
                        for (java.util.Map.Entry<String, Object> e : lastSafe[0].entrySet()) off.set(e.getKey(), e.getValue());
                        committer.markProcessed(r, off);
                    }
                }
                committer.markBatchFinished();
                if (sawPrime) primed.countDown();
            })
            .build();

        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try { engine.close(); executor.shutdown(); executor.awaitTermination(30, TimeUnit.SECONDS); producer.close(); }
            catch (Exception e) { e.printStackTrace(); }
        }));
        if (prime) {
            primed.await();
            Thread.sleep(500);
            engine.close();
            executor.shutdown();
            executor.awaitTermination(60, TimeUnit.SECONDS);
            producer.close();
            System.out.println("PRIMED");
            System.out.flush();
            Runtime.getRuntime().halt(0);
        }
        executor.awaitTermination(Long.MAX_VALUE, TimeUnit.DAYS);
    }
}
