package io.khipu.testapps;

import java.io.FileInputStream;
import java.io.IOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Plain Kafka applications, traced by configuration alone (the properties file names the interceptors): none of them
 * knows of Khipu. Each writes a ledger of what it did, the tests' ground truth.
 *
 * <pre>
 *   produce  PROPERTIES TOPIC COUNT LEDGER [ids]  keys key-0..key-(COUNT-1); the ledger: each acknowledged write;
 *                                                 "ids": the application names its messages itself (khipu-id: order-N)
 *   consume  PROPERTIES TOPIC COUNT LEDGER [SKIP] reads until COUNT records and 3 s quiet, committing after each poll;
 *                                                 SKIP=P:FROM:TO seeks partition P from FROM to TO when it is assigned
 *                                                 (records FROM..TO-1 never fetched); the ledger: each record received
 *   streams  PROPERTIES IN OUT COUNT LEDGER       Kafka Streams: drops keys whose number ends in 7, upper-cases the rest
 *   bench-produce, bench-consume                  bench/tracing_overhead.py's Java loops ({@link BenchApp})
 * </pre>
 */
public final class Apps {
    private Apps() {}

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "produce" -> produce(properties(args[1]), args[2], Integer.parseInt(args[3]), Path.of(args[4]),
                    args.length > 5 && args[5].equals("ids"));
            case "consume" -> consume(properties(args[1]), args[2], Integer.parseInt(args[3]), Path.of(args[4]),
                    args.length > 5 ? args[5] : null);
            case "bench-produce" -> BenchApp.produce(properties(args[1]), args[2], Integer.parseInt(args[3]),
                    Integer.parseInt(args[4]), Integer.parseInt(args[5]));
            case "bench-consume" -> BenchApp.consume(properties(args[1]), args[2], Integer.parseInt(args[3]),
                    Integer.parseInt(args[4]));
            case "streams" -> StreamsApp.run(properties(args[1]), args[2], args[3], Integer.parseInt(args[4]),
                    Path.of(args[5]));
            default -> throw new IllegalArgumentException("unknown app " + args[0]);
        }
    }

    static Properties properties(String path) throws IOException {
        Properties properties = new Properties();
        try (FileInputStream in = new FileInputStream(path)) {
            properties.load(in);
        }
        return properties;
    }

    static void produce(Properties config, String topic, int count, Path ledgerPath, boolean ids) throws Exception {
        try (Ledger ledger = new Ledger(ledgerPath);
                KafkaProducer<String, String> producer = new KafkaProducer<>(config, new StringSerializer(), new StringSerializer())) {
            CountDownLatch acknowledged = new CountDownLatch(count);
            for (int i = 0; i < count; i++) {
                String key = "key-" + i;
                ProducerRecord<String, String> record = new ProducerRecord<>(topic, key, "value-" + i);
                if (ids) {
                    record.headers().add("khipu-id", ("order-" + i).getBytes(java.nio.charset.StandardCharsets.UTF_8));
                }
                producer.send(record, (metadata, error) -> {
                    Map<String, Object> entry = new LinkedHashMap<>();
                    entry.put("key", key);
                    entry.put("acknowledged", error == null);
                    entry.put("partition", metadata == null ? null : metadata.partition());
                    entry.put("offset", error == null ? metadata.offset() : null);
                    ledger.write(entry);
                    acknowledged.countDown();
                });
            }
            producer.flush();
            if (!acknowledged.await(60, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not every write was answered within 60 s");
            }
        }
    }

    static void consume(Properties config, String topic, int count, Path ledgerPath, String skip) throws Exception {
        try (Ledger ledger = new Ledger(ledgerPath);
                KafkaConsumer<String, String> consumer = new KafkaConsumer<>(config, new StringDeserializer(), new StringDeserializer())) {
            String[] seek = skip == null ? null : skip.split(":");
            boolean[] sought = {seek == null};
            consumer.subscribe(List.of(topic), new org.apache.kafka.clients.consumer.ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(java.util.Collection<TopicPartition> partitions) {}

                @Override
                public void onPartitionsAssigned(java.util.Collection<TopicPartition> partitions) {
                    if (sought[0]) {
                        return;
                    }
                    TopicPartition target = new TopicPartition(topic, Integer.parseInt(seek[0]));
                    if (partitions.contains(target) && consumer.position(target) == Long.parseLong(seek[1])) {
                        consumer.seek(target, Long.parseLong(seek[2]));
                        Map<String, Object> entry = new LinkedHashMap<>();
                        entry.put("skipped_partition", target.partition());
                        entry.put("skipped_from", Long.parseLong(seek[1]));
                        entry.put("skipped_to", Long.parseLong(seek[2]));
                        ledger.write(entry);
                        sought[0] = true;
                    }
                }
            });
            long received = 0;
            long quietSince = System.nanoTime();
            while (received < count || System.nanoTime() - quietSince < TimeUnit.SECONDS.toNanos(3)) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                quietSince = System.nanoTime();
                for (ConsumerRecord<String, String> record : records) {
                    Map<String, Object> entry = new LinkedHashMap<>();
                    entry.put("key", record.key());
                    entry.put("partition", record.partition());
                    entry.put("offset", record.offset());
                    entry.put("message_id", Ledger.messageId(record.headers()));
                    ledger.write(entry);
                    received++;
                }
                consumer.commitSync();
            }
        }
    }


}
