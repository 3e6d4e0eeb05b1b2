package io.khipu.tracing;

import java.util.Map;
import org.apache.kafka.clients.consumer.ConsumerInterceptor;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Emits a RECEIVED trace for every traced record a consumer's poll returns, by configuration alone
 * ({@code interceptor.classes}; docs/tracing-jvm.md). The trace names the consumer's {@code group.id} (or
 * {@code khipu.group} for a client without one, such as MirrorMaker 2's source consumer) and says whether it reads
 * uncommitted ({@code isolation.level}; the Java client's default is read_uncommitted). A client with neither (a
 * Kafka Streams restore consumer) traces nothing: it is not a hop of any route.
 */
public class KhipuConsumerInterceptor<K, V> implements ConsumerInterceptor<K, V> {
    private static final Logger log = LoggerFactory.getLogger(KhipuConsumerInterceptor.class);

    private TracingConfig config;
    private TraceEmitter emitter;
    private String group;
    private boolean readUncommitted;

    @Override
    public void configure(Map<String, ?> configs) {
        config = TracingConfig.from(configs);
        Object groupId = configs.get("group.id");
        group = config.group() != null ? config.group()
                : groupId == null || groupId.toString().isEmpty() ? null : groupId.toString();
        Object isolation = configs.get("isolation.level");
        readUncommitted = isolation == null || !"read_committed".equalsIgnoreCase(isolation.toString().trim());
        if (group == null) {
            log.info("khipu: consumer {} has no group.id and no khipu.group: it traces nothing", configs.get("client.id"));
            return;
        }
        if (!TracingConfig.isName(group)) { // every RECEIVED trace would be refused by the detector
            log.error("khipu: consumer group '{}' is not a name Khipu can trace (1-249 characters of letters, digits, "
                    + "'.', '_' or '-'); set khipu.group to one: this consumer traces nothing", group);
            group = null;
            return;
        }
        emitter = TraceEmitter.acquire(config);
    }

    @Override
    public ConsumerRecords<K, V> onConsume(ConsumerRecords<K, V> records) {
        if (emitter == null) {
            return records;
        }
        for (ConsumerRecord<K, V> record : records) {
            TraceContext context = TraceHeaders.context(record.headers());
            if (context == null) {
                continue;
            }
            ResendMark resend = TraceHeaders.resend(record.headers());
            Map<String, String> attributes = resend == null ? Map.of()
                    : new java.util.LinkedHashMap<>(Map.of(TraceHeaders.ATTRIBUTE_RESEND_ID, resend.resendId()));
            if (resend != null) {
                attributes.put(TraceHeaders.ATTRIBUTE_RESEND_HOP, resend.hop());
            }
            emitter.emitReceived(context, config.cluster(), record.topic(), record.partition(), record.offset(), group,
                    attributes, readUncommitted);
        }
        return records;
    }

    @Override
    public void onCommit(Map<TopicPartition, OffsetAndMetadata> offsets) {
        // the commit is done when this is called: traces are already queued (the detector's grace covers the rest)
    }

    @Override
    public void close() {
        if (emitter != null) {
            emitter.release();
            emitter = null;
        }
    }

    /** The emitter this consumer traces through, or null when it traces nothing. */
    public TraceEmitter emitter() {
        return emitter;
    }
}
