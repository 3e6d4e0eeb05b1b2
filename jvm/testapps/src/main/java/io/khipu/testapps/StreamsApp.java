package io.khipu.testapps;

import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.ContextualFixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * A Kafka Streams processor hop: reads IN, drops the records whose key's number ends in 7 (its own rule, so those
 * messages are lost in the processor), upper-cases the rest to OUT. Streams carries each input's headers to its
 * output, so the trace headers go on without a line of tracing code. The ledger: each record it took from IN (with its
 * partition and offset, and whether it dropped it). It stops once it has taken COUNT records and 3 s were quiet.
 */
final class StreamsApp {
    private StreamsApp() {}

    static void run(Properties config, String in, String out, int count, Path ledgerPath) throws Exception {
        AtomicLong taken = new AtomicLong();
        AtomicLong lastNanos = new AtomicLong(System.nanoTime());
        try (Ledger ledger = new Ledger(ledgerPath)) {
            StreamsBuilder builder = new StreamsBuilder();
            builder.stream(in, Consumed.with(Serdes.String(), Serdes.String()))
                    .processValues(() -> new ContextualFixedKeyProcessor<String, String, String>() {
                        @Override
                        public void process(FixedKeyRecord<String, String> record) {
                            boolean drop = record.key() != null && record.key().endsWith("7");
                            var where = context().recordMetadata().orElseThrow();
                            Map<String, Object> entry = new LinkedHashMap<>();
                            entry.put("key", record.key());
                            entry.put("partition", where.partition());
                            entry.put("offset", where.offset());
                            entry.put("message_id", Ledger.messageId(record.headers()));
                            entry.put("dropped", drop);
                            ledger.write(entry);
                            taken.incrementAndGet();
                            lastNanos.set(System.nanoTime());
                            if (!drop) {
                                context().forward(record.withValue(record.value().toUpperCase()));
                            }
                        }
                    })
                    .to(out, Produced.with(Serdes.String(), Serdes.String()));
            config.putIfAbsent(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "200");
            try (KafkaStreams streams = new KafkaStreams(builder.build(), config)) {
                streams.start();
                while (taken.get() < count || System.nanoTime() - lastNanos.get() < TimeUnit.SECONDS.toNanos(3)) {
                    Thread.sleep(100);
                    if (streams.state() == KafkaStreams.State.ERROR) {
                        throw new IllegalStateException("the Streams application failed");
                    }
                }
                streams.close(java.time.Duration.ofSeconds(30));
            }
        }
    }
}
