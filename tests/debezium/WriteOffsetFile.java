// Writes crates/cli/testdata/debezium-offsets.dat with Kafka Connect's own
// FileOffsetBackingStore and JsonConverter (schemas.enable=false), as Debezium Server and the
// embedded engine store source offsets: keys [connector, {"server": topic.prefix}], values the
// MySQL connector's offset map. Run (the jars tests/bench/debezium.sh mysql8 resolves):
//   java -cp "$OUTBOX_SERVICES_DIR/debezium-libs-3.6.1.Final-mysql/*" \
//       tests/debezium/WriteOffsetFile.java crates/cli/testdata/debezium-offsets.dat
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.runtime.standalone.StandaloneConfig;
import org.apache.kafka.connect.storage.FileOffsetBackingStore;

public class WriteOffsetFile {
  public static void main(String[] args) throws Exception {
    Path out = Path.of(args[0]);
    Files.deleteIfExists(out);
    JsonConverter keys = new JsonConverter();
    keys.configure(Map.of("schemas.enable", "false"), true);
    JsonConverter values = new JsonConverter();
    values.configure(Map.of("schemas.enable", "false"), false);

    Map<String, String> props = new HashMap<>();
    props.put("bootstrap.servers", "localhost:9092");
    props.put("key.converter", "org.apache.kafka.connect.json.JsonConverter");
    props.put("value.converter", "org.apache.kafka.connect.json.JsonConverter");
    props.put("offset.storage.file.filename", out.toString());
    FileOffsetBackingStore store = new FileOffsetBackingStore(keys);
    store.configure(new StandaloneConfig(props));
    store.start();

    Map<String, Object> offset = new LinkedHashMap<>();
    offset.put("transaction_id", null);
    offset.put("ts_sec", 1767323046L);
    offset.put("file", "binlog.000003");
    offset.put("pos", 1234L);
    offset.put("gtids", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5");
    offset.put("row", 1);
    offset.put("server_id", 1L);
    offset.put("event", 2L);
    Map<ByteBuffer, ByteBuffer> batch = new HashMap<>();
    batch.put(
        ByteBuffer.wrap(keys.fromConnectData("", null, Arrays.asList("inventory-engine", Map.of("server", "shop")))),
        ByteBuffer.wrap(values.fromConnectData("", null, offset)));
    // A deleted offset (null value) of another engine.
    batch.put(
        ByteBuffer.wrap(keys.fromConnectData("", null, Arrays.asList("old-engine", Map.of("server", "legacy")))),
        null);
    store.set(batch, null).get();
    store.stop();
    System.out.println("wrote " + out + " (" + Files.size(out) + " bytes)");
  }
}
