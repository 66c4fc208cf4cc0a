import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * A KTable read from an input topic into a RocksDB store named "table", its changelog on (the topic configs given).
 * args: mode bootstrap application.id input partitions state.dir out [changelog-config k=v ...]
 * mode "build": runs until SIGTERM (KafkaStreams.close() commits what it processed).
 * mode "dump": once every changelog partition is restored (each must hold records: a wiped state restores them
 * all), writes the store as key TAB value lines to `out` (through a temporary file: the file appears whole),
 * "restore partition start end records" lines to stdout, and exits.
 */
public class TableApp {
    static final String STORE = "table";
    static final KafkaStreams.CloseOptions CLOSE =
        new KafkaStreams.CloseOptions().timeout(Duration.ofSeconds(30)).leaveGroup(true);

    public static void main(String[] a) throws Exception {
        String mode = a[0];
        int partitions = Integer.parseInt(a[4]);
        Map<String, String> changelog = new HashMap<>();
        for (int i = 7; i < a.length; i++) {
            changelog.put(a[i].substring(0, a[i].indexOf('=')), a[i].substring(a[i].indexOf('=') + 1));
        }
        Properties p = new Properties();
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a[1]);
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, a[2]);
        p.put(StreamsConfig.STATE_DIR_CONFIG, a[5]);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);  // every update reaches the changelog
        // a static member: closed, it leaves the group at once (a dynamic member of Streams stays until its session
        // times out, 45 s, and the next run waits for that before its tasks are assigned)
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG), a[2] + "-instance");
        StreamsBuilder b = new StreamsBuilder();
        b.table(a[3], Consumed.with(Serdes.String(), Serdes.String()),
                Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as(STORE)
                    .withKeySerde(Serdes.String()).withValueSerde(Serdes.String())
                    .withLoggingEnabled(changelog));
        KafkaStreams s = new KafkaStreams(b.build(), p);
        Map<TopicPartition, long[]> restored = new ConcurrentHashMap<>();  // start, end, records; -1 records: running
        s.setGlobalStateRestoreListener(new StateRestoreListener() {
            public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
                restored.put(tp, new long[] {start, end, -1});
            }
            public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {}
            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                restored.compute(tp, (k, r) -> r == null ? new long[] {-1, -1, total} : new long[] {r[0], r[1], total});
            }
        });
        CountDownLatch failed = new CountDownLatch(1);
        s.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            failed.countDown();
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        if (mode.equals("build")) {
            Runtime.getRuntime().addShutdownHook(new Thread(() -> s.close(CLOSE)));
            s.start();
            failed.await();
            System.exit(1);
        }
        s.start();
        Map<String, String> state = new HashMap<>();
        for (int part = 0; part < partitions; part++) {
            // a task being restored answers queries too (its store is open): a partition is read only once the
            // listener saw its restoration end (every changelog partition of these tests holds records)
            while (true) {
                if (failed.await(100, TimeUnit.MILLISECONDS)) System.exit(1);
                if (!ended(restored, part)) continue;
                try {
                    ReadOnlyKeyValueStore<String, String> store = s.store(StoreQueryParameters
                        .fromNameAndType(STORE, QueryableStoreTypes.<String, String>keyValueStore())
                        .withPartition(part));
                    try (KeyValueIterator<String, String> it = store.all()) {
                        while (it.hasNext()) {
                            KeyValue<String, String> kv = it.next();
                            state.put(kv.key, kv.value);
                        }
                    }
                    break;
                } catch (InvalidStateStoreException retry) {
                    // restoring, or not assigned yet
                }
            }
        }
        for (Map.Entry<TopicPartition, long[]> e : restored.entrySet()) {
            long[] r = e.getValue();
            System.out.printf("restore %d %d %d %d%n", e.getKey().partition(), r[0], r[1], r[2]);
        }
        write(Path.of(a[6]), state);
        s.close(CLOSE);
        System.exit(0);
    }

    static boolean ended(Map<TopicPartition, long[]> restored, int partition) {
        for (Map.Entry<TopicPartition, long[]> e : restored.entrySet()) {
            if (e.getKey().partition() == partition && e.getValue()[2] >= 0) return true;
        }
        return false;
    }

    static void write(Path out, Map<String, String> state) throws IOException {
        Path tmp = out.resolveSibling(out.getFileName() + ".tmp");
        try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(tmp, StandardCharsets.UTF_8))) {
            for (Map.Entry<String, String> e : state.entrySet()) w.print(e.getKey() + "\t" + e.getValue() + "\n");
        }
        Files.move(tmp, out, StandardCopyOption.ATOMIC_MOVE);
    }
}
