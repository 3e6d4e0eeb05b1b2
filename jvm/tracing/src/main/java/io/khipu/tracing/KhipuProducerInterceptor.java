package io.khipu.tracing;

import java.util.ArrayDeque;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.producer.ProducerInterceptor;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Utils;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Traces what a producer writes, by configuration alone ({@code interceptor.classes}; docs/tracing-jvm.md).
 *
 * <p>With {@code khipu.stream} set the producer is a <em>source</em>: a record without trace headers is sampled (a
 * random draw, or the id the application put in {@code khipu-id}) and a sampled one gets the headers. A record that
 * already carries them (a processor's output: Kafka Streams carries its input's headers on) is traced as it is. The
 * SENT trace is emitted only from a successful acknowledgement, with the record's own timestamp, the hash of its
 * serialized key, whether its value is null and whether the producer is transactional. The acknowledgement names the
 * record through its headers (kafka-clients 4.1 and later, KIP-512); an older client gets the headers on its records
 * (so every later hop is traced) but no SENT traces, and says so once in its log.
 */
public class KhipuProducerInterceptor<K, V> implements ProducerInterceptor<K, V> {
    private static final Logger log = LoggerFactory.getLogger(KhipuProducerInterceptor.class);
    private static final int MAX_PENDING_KEYS = 100_000;

    private TracingConfig config;
    private TraceEmitter emitter;
    private int threshold;
    private boolean transactional;
    private Serializer<Object> keySerializer;
    private final Sampling.MessageIds ids = new Sampling.MessageIds();
    // message id -> key hashes of its sends not yet acknowledged (the acknowledgement carries no key)
    private final Map<String, ArrayDeque<String>> pendingKeys = new ConcurrentHashMap<>();
    private final AtomicInteger pendingCount = new AtomicInteger();
    private final AtomicBoolean warnedOldClient = new AtomicBoolean();
    private volatile boolean acknowledgementsWithoutHeaders;

    @Override
    public void configure(Map<String, ?> configs) {
        config = TracingConfig.from(configs);
        threshold = config.stream() == null ? 0 : Sampling.threshold(config.samplingPercent());
        Object transactionalId = configs.get("transactional.id");
        transactional = transactionalId != null && !transactionalId.toString().isEmpty();
        keySerializer = keySerializer(configs);
        emitter = TraceEmitter.acquire(config);
    }

    @SuppressWarnings("unchecked")
    private static Serializer<Object> keySerializer(Map<String, ?> configs) {
        Object configured = configs.get("key.serializer");
        try {
            Class<?> type = configured instanceof Class<?> c ? c
                    : configured == null ? null : Class.forName(configured.toString().trim(), true, Utils.getContextOrKafkaClassLoader());
            if (type == null) {
                return null;
            }
            Serializer<Object> serializer = (Serializer<Object>) Utils.newInstance(type);
            serializer.configure(configs, true);
            return serializer;
        } catch (Exception | LinkageError e) { // a key we cannot serialize again has no hash; tracing goes on
            log.warn("khipu: the key serializer {} could not be set up for key hashes ({}); SENT traces will carry none",
                    configured, e.toString());
            return null;
        }
    }

    @Override
    public ProducerRecord<K, V> onSend(ProducerRecord<K, V> record) {
        if (TraceHeaders.resend(record.headers()) != null) {
            record = withoutResendMarks(record); // what an application writes is never itself a resend
        }
        Headers headers = record.headers();
        TraceContext context = TraceHeaders.context(headers);
        if (context == null) {
            if (config.stream() == null) {
                return record;
            }
            String given = TraceHeaders.messageId(headers);
            if (given != null) {
                if (Sampling.bucket(given) >= threshold) {
                    return record;
                }
                context = new TraceContext(given, config.stream(), config.samplingPercent());
            } else {
                int draw = ThreadLocalRandom.current().nextInt(Sampling.BUCKETS);
                if (draw >= threshold) {
                    return record; // the common case: not sampled, nothing added
                }
                context = new TraceContext(ids.withBucket(draw), config.stream(), config.samplingPercent());
            }
            record = withTraceHeaders(record, context);
        }
        rememberKey(context.messageId(), record);
        return record;
    }

    /** The record without Khipu's resend mark: a processor (Kafka Streams, MirrorMaker) copies its input's headers on,
     * and a resent input's mark would make its output look resent for another group. */
    private ProducerRecord<K, V> withoutResendMarks(ProducerRecord<K, V> record) {
        RecordHeaders copy = new RecordHeaders(record.headers().toArray());
        copy.remove(TraceHeaders.RESEND_ID);
        copy.remove(TraceHeaders.RESEND_HOP);
        copy.remove(TraceHeaders.RESEND_TARGET);
        return new ProducerRecord<>(record.topic(), record.partition(), record.timestamp(), record.key(), record.value(), copy);
    }

    private ProducerRecord<K, V> withTraceHeaders(ProducerRecord<K, V> record, TraceContext context) {
        // a record's headers turn read-only once sent: a record the application sends again is copied
        RecordHeaders copy = new RecordHeaders(record.headers().toArray());
        TraceHeaders.write(copy, context);
        return new ProducerRecord<>(record.topic(), record.partition(), record.timestamp(), record.key(), record.value(), copy);
    }

    private void rememberKey(String messageId, ProducerRecord<K, V> record) {
        if (record.key() == null || acknowledgementsWithoutHeaders || pendingCount.get() >= MAX_PENDING_KEYS) {
            return;
        }
        String hash;
        try {
            // a copy of the headers: a serializer that writes headers must not write them twice on the record
            byte[] serialized = record.key() instanceof byte[] bytes ? bytes : keySerializer == null ? null
                    : keySerializer.serialize(record.topic(), new RecordHeaders(record.headers().toArray()), record.key());
            hash = KeyHash.of(serialized);
        } catch (RuntimeException e) {
            hash = null;
        }
        if (hash == null) {
            return;
        }
        String known = hash;
        pendingKeys.compute(pendingKey(messageId, record.topic()), (id, hashes) -> {
            ArrayDeque<String> queue = hashes == null ? new ArrayDeque<>(1) : hashes;
            queue.addLast(known);
            return queue;
        });
        pendingCount.incrementAndGet();
    }

    private static String pendingKey(String messageId, String topic) {
        return messageId + "\0" + topic;
    }

    /** The key hash of an acknowledged write of ``messageId`` to ``topic``. Acknowledgements come in order only
     * within a partition: when writes of one id to one topic with different keys are pending, which is which is not
     * known, and the trace carries no hash (never another record's). */
    private String takeKey(String messageId, String topic) {
        String[] taken = new String[1];
        pendingKeys.computeIfPresent(pendingKey(messageId, topic), (id, hashes) -> {
            String first = hashes.pollFirst();
            boolean same = hashes.stream().allMatch(first::equals);
            taken[0] = same ? first : null;
            if (first != null) {
                pendingCount.decrementAndGet();
            }
            return hashes.isEmpty() ? null : hashes;
        });
        return taken[0];
    }

    @Override
    public void onAcknowledgement(RecordMetadata metadata, Exception exception, Headers headers) {
        TraceContext context = TraceHeaders.context(headers);
        if (context == null) {
            return;
        }
        String keyHash = metadata == null ? null : takeKey(context.messageId(), metadata.topic());
        if (exception != null || metadata == null || !metadata.hasOffset() || metadata.partition() < 0) {
            return; // not written: no SENT trace (the detector judges the write from what it never saw)
        }
        emitter.emitSent(context, config.cluster(), metadata.topic(), metadata.partition(), metadata.offset(),
                metadata.hasTimestamp() ? metadata.timestamp() : null, keyHash,
                metadata.serializedValueSize() < 0, transactional);
    }

    /** Only a client older than 4.1 calls this one: its acknowledgement does not say which record it was. */
    @Override
    public void onAcknowledgement(RecordMetadata metadata, Exception exception) {
        acknowledgementsWithoutHeaders = true; // nothing remembered for a SENT trace could be taken back
        if (warnedOldClient.compareAndSet(false, true)) {
            pendingKeys.clear();
            pendingCount.set(0);
            log.warn("khipu: this kafka-clients gives acknowledgements without their record's headers (they came in 4.1,"
                    + " KIP-512): location '{}' writes traced records, but emits no SENT traces", config.location());
        }
    }

    @Override
    public void close() {
        if (emitter != null) {
            emitter.release();
            emitter = null;
        }
        if (keySerializer != null) {
            keySerializer.close();
        }
    }

    /** The emitter this producer traces through (its counters: {@link TraceEmitterMXBean}). */
    public TraceEmitter emitter() {
        return emitter;
    }
}
