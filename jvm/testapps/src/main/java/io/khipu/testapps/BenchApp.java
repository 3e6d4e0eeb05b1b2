package io.khipu.testapps;

import com.sun.management.OperatingSystemMXBean;
import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import javax.management.MBeanServer;
import javax.management.ObjectName;
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
 * interceptors (the properties file says), measured as the Python loops are. Untimed first: WARMUP records produced
 * (or read) and, traced, their traces delivered (the emitters' JMX counters say when none is pending). Then the clock
 * runs from the first timed send (or poll) until the client is closed: every record acknowledged (or read), and the
 * interceptors closed, which closes their emitter: every trace the loop made is delivered inside the clock. Prints one
 * JSON line: messages, the seconds the timed loop took, and the CPU the whole JVM process spent in that time (every
 * thread: the client's I/O thread and the trace emitter's included).
 *
 * <pre>
 *   produce PROPERTIES TOPIC COUNT VALUE_BYTES WARMUP   (WARMUP records first, then COUNT timed)
 *   consume PROPERTIES TOPIC COUNT WARMUP               (reads COUNT records from the beginning of every partition; the
 *                                                       clock starts after the first WARMUP, and counts what comes after)
 * </pre>
 */
final class BenchApp {
    private BenchApp() {}

    static long cpuNanos() {
        return ((OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    /** Wait until no trace emitter in this JVM has a trace queued or in flight (none without the interceptors). */
    static void awaitTracesDelivered() throws Exception {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        ObjectName emitters = new ObjectName("io.khipu.tracing:type=TraceEmitter,*");
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (true) {
            long pending = 0;
            for (ObjectName name : server.queryNames(emitters, null)) {
                pending += (Long) server.getAttribute(name, "Pending");
            }
            if (pending == 0) {
                return;
            }
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException(pending + " warm-up traces still not delivered after 30 s");
            }
            Thread.sleep(5);
        }
    }

    static void produce(Properties config, String topic, int count, int valueBytes, int warmup) throws Exception {
        byte[] value = new byte[valueBytes];
        java.util.Arrays.fill(value, (byte) 'x');
        AtomicLong acknowledged = new AtomicLong();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (int i = 0; i < warmup; i++) {
                producer.send(new ProducerRecord<>(topic, value));
            }
            producer.flush();
            awaitTracesDelivered();
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
            producer.close(); // the interceptor closes its emitter: the loop's last traces are sent, not left lingering
            long elapsed = System.nanoTime() - started;
            long used = cpuNanos() - cpu;
            if (acknowledged.get() != count) {
                throw new IllegalStateException("only " + acknowledged.get() + " of " + count + " acknowledged");
            }
            System.out.printf("{\"messages\":%d,\"seconds\":%.6f,\"cpu_ns\":%d}%n", count, elapsed / 1e9, used);
        }
    }

    static void consume(Properties config, String topic, int count, int warmup) throws Exception {
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
            while (received < Math.max(1, warmup)) { // the first fetches, and a warm-up: not timed
                received += consumer.poll(Duration.ofMillis(500)).count();
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("only " + received + " records read from " + topic + " in 120 s");
                }
            }
            awaitTracesDelivered();
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
            consumer.close(); // the interceptor closes its emitter: the loop's receipts are delivered inside the clock
            long elapsed = System.nanoTime() - started;
            long used = cpuNanos() - cpu;
            System.out.printf("{\"messages\":%d,\"seconds\":%.6f,\"cpu_ns\":%d,\"bytes\":%d}%n", received, elapsed / 1e9, used, bytes);
        }
    }
}
