package io.khipu.testapps;

import com.sun.management.OperatingSystemMXBean;
import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * bench/tracing_overhead.py's Java loops: a producer or a consumer as fast as it goes, with or without Khipu's
 * interceptors (the properties file says). Prints one JSON line: messages, the seconds the timed loop took (the
 * producer's up to its last acknowledgement), and the CPU the whole JVM process spent in that time (every thread:
 * the client's I/O thread and the trace emitter's included).
 *
 * <pre>
 *   produce PROPERTIES TOPIC COUNT VALUE_BYTES   (20,000 records first, untimed: connections and metadata)
 *   consume PROPERTIES TOPIC COUNT               (reads COUNT records from the beginning of every partition; the
 *                                                clock starts after the first 20,000, and counts what comes after)
 * </pre>
 */
final class BenchApp {
    private BenchApp() {}

    static long cpuNanos() {
        return ((OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    static void produce(Properties config, String topic, int count, int valueBytes) throws Exception {
        byte[] value = new byte[valueBytes];
        java.util.Arrays.fill(value, (byte) 'x');
        AtomicLong acknowledged = new AtomicLong();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (int i = 0; i < 20_000; i++) {
                producer.send(new ProducerRecord<>(topic, value));
            }
            producer.flush();
            long cpu = cpuNanos();
            long started = System.nanoTime();
            for (int i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, value), (metadata, error) -> {
                    if (error == null) {
                        acknowledged.incrementAndGet();
                    }
                });
            }
            producer.flush();
            long elapsed = System.nanoTime() - started;
            long used = cpuNanos() - cpu;
            if (acknowledged.get() != count) {
                throw new IllegalStateException("only " + acknowledged.get() + " of " + count + " acknowledged");
            }
            System.out.printf("{\"messages\":%d,\"seconds\":%.6f,\"cpu_ns\":%d}%n", count, elapsed / 1e9, used);
        }
    }

    static void consume(Properties config, String topic, int count) throws Exception {
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(config, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(topic)) {
                partitions.add(new TopicPartition(topic, info.partition()));
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            long received = 0;
            long bytes = 0;
            long deadline = System.nanoTime() + 120_000_000_000L;
            while (received < Math.min(20_000, count / 10)) { // the first fetches, and a warm-up: not timed
                received += consumer.poll(Duration.ofMillis(500)).count();
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("nothing read from " + topic + " in 120 s");
                }
            }
            count -= (int) received;
            received = 0;
            long cpu = cpuNanos();
            long started = System.nanoTime();
            while (received < count) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
                    bytes += record.value() == null ? 0 : record.value().length;
                    received++;
                }
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("only " + received + " of " + count + " records in 120 s");
                }
            }
            long elapsed = System.nanoTime() - started;
            long used = cpuNanos() - cpu;
            System.out.printf("{\"messages\":%d,\"seconds\":%.6f,\"cpu_ns\":%d,\"bytes\":%d}%n", received, elapsed / 1e9, used, bytes);
        }
    }
}
