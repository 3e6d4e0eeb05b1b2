package io.khipu.tracing;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.regex.Pattern;
import org.apache.kafka.common.config.ConfigException;

/**
 * The interceptors' {@code khipu.*} properties, read from the client's own configuration and checked at once: a bad
 * value fails the client's construction with a message naming the property, the value and what is allowed (never a
 * secret's value). docs/tracing-jvm.md lists them.
 *
 * <p>Traces go to {@code khipu.trace.bootstrap.servers} with the client settings given as {@code khipu.trace.<setting>}
 * (security.protocol, sasl.*, ssl.*); without it, to the client's own cluster with the client's own security settings.
 */
public record TracingConfig(
        String location,
        String cluster,
        String stream,
        double samplingPercent,
        String group,
        String traceTopic,
        int queueMaxTraces,
        long batchLingerMs,
        long markIntervalMs,
        long markMemoryMs,
        int deliveryTimeoutMs,
        long closeTimeoutMs,
        Map<String, Object> traceProducerConfig) {

    public static final String PREFIX = "khipu.";
    public static final String LOCATION = "khipu.location";
    public static final String CLUSTER = "khipu.cluster";
    public static final String STREAM = "khipu.stream";
    public static final String SAMPLING_PERCENT = "khipu.sampling.percent";
    public static final String GROUP = "khipu.group";
    public static final String TRACE_TOPIC = "khipu.trace.topic";
    public static final String TRACE_PREFIX = "khipu.trace.";
    public static final String TRACE_BOOTSTRAP = "khipu.trace.bootstrap.servers";
    public static final String QUEUE_MAX_TRACES = "khipu.queue.max.traces";
    public static final String BATCH_LINGER_MS = "khipu.batch.linger.ms";
    public static final String MARK_INTERVAL_MS = "khipu.mark.interval.ms";
    public static final String MARK_MEMORY_MS = "khipu.mark.memory.ms";
    public static final String DELIVERY_TIMEOUT_MS = "khipu.delivery.timeout.ms";
    public static final String CLOSE_TIMEOUT_MS = "khipu.close.timeout.ms";
    public static final String DEFAULT_TRACE_TOPIC = "khipu.traces";

    private static final Pattern NAME = Pattern.compile("[A-Za-z0-9._-]{1,249}");
    private static final String NAME_RULE = "1-249 characters of letters, digits, '.', '_' or '-'";
    // the client settings a trace producer takes from the application's client when traces go to the same cluster
    private static final String[] SECURITY_PREFIXES = {"security.protocol", "ssl.", "sasl."};
    // settings of the trace producer that the emitter owns
    private static final String[] OWNED = {"key.serializer", "value.serializer", "acks", "enable.idempotence",
        "interceptor.classes", "transactional.id"};

    /** Read and check the {@code khipu.*} properties of a client's configuration. */
    public static TracingConfig from(Map<String, ?> configs) {
        String location = name(configs, LOCATION, null);
        String cluster = name(configs, CLUSTER, "local");
        String stream = name(configs, STREAM, "");
        double percent = number(configs, SAMPLING_PERCENT, 100.0, 0, 100, "a number in [0, 100]");
        String group = name(configs, GROUP, "");
        String topic = name(configs, TRACE_TOPIC, DEFAULT_TRACE_TOPIC);
        int queue = (int) number(configs, QUEUE_MAX_TRACES, 100_000, 1, 10_000_000, "an integer in [1, 10000000]");
        long linger = (long) number(configs, BATCH_LINGER_MS, 50, 1, 5_000, "milliseconds in [1, 5000]");
        long markInterval = (long) number(configs, MARK_INTERVAL_MS, 2_000, 100, 3_600_000, "milliseconds in [100, 3600000]");
        long markMemory = (long) number(configs, MARK_MEMORY_MS, 10_000, 0, 3_600_000, "milliseconds in [0, 3600000]");
        int delivery = (int) number(configs, DELIVERY_TIMEOUT_MS, 60_000, 1_000, 3_600_000, "milliseconds in [1000, 3600000]");
        long close = (long) number(configs, CLOSE_TIMEOUT_MS, 5_000, 0, 300_000, "milliseconds in [0, 300000]");
        return new TracingConfig(location, cluster, stream.isEmpty() ? null : stream, percent,
                group.isEmpty() ? null : group, topic, queue, linger, markInterval, markMemory, delivery, close,
                traceProducerConfig(configs));
    }

    /** Where the trace producer connects, and how: its bootstrap servers and security settings. */
    static Map<String, Object> traceProducerConfig(Map<String, ?> configs) {
        Map<String, Object> producer = new LinkedHashMap<>();
        Object own = configs.get(TRACE_BOOTSTRAP);
        if (own != null && !own.toString().isBlank()) {
            for (Map.Entry<String, ?> entry : configs.entrySet()) {
                String key = entry.getKey();
                if (key.startsWith(TRACE_PREFIX) && !key.equals(TRACE_TOPIC)) {
                    producer.put(key.substring(TRACE_PREFIX.length()), entry.getValue());
                }
            }
        } else {
            Object servers = configs.get("bootstrap.servers");
            if (servers == null || servers.toString().isBlank() || "[]".equals(servers.toString())) {
                throw new ConfigException(TRACE_BOOTSTRAP + ": no trace cluster: set " + TRACE_BOOTSTRAP
                        + " ('host:port[,host:port...]'), or give the client bootstrap.servers to trace to its own cluster");
            }
            producer.put("bootstrap.servers", servers instanceof java.util.List<?> list
                    ? String.join(",", list.stream().map(Object::toString).toList()) : servers.toString());
            for (Map.Entry<String, ?> entry : configs.entrySet()) {
                for (String prefix : SECURITY_PREFIXES) {
                    if (entry.getKey().startsWith(prefix) && entry.getValue() != null) {
                        producer.put(entry.getKey(), entry.getValue());
                    }
                }
            }
        }
        for (String owned : OWNED) {
            if (producer.containsKey(owned)) {
                throw new ConfigException(TRACE_PREFIX + owned + ": not set here; the trace emitter owns it");
            }
        }
        return producer;
    }

    /** Whether ``text`` is a name Khipu accepts for streams, locations, clusters, topics and groups. */
    public static boolean isName(String text) {
        return text != null && NAME.matcher(text).matches();
    }

    private static String name(Map<String, ?> configs, String key, String fallback) {
        Object value = configs.get(key);
        if (value == null || value.toString().isEmpty()) {
            if (fallback == null) {
                throw new ConfigException(key + ": missing; expected " + NAME_RULE
                        + " (the application, as the registry names its location)");
            }
            return fallback;
        }
        String text = value.toString();
        if (!NAME.matcher(text).matches()) {
            throw new ConfigException(key + ": expected " + NAME_RULE + ", got '" + text + "'");
        }
        return text;
    }

    private static double number(Map<String, ?> configs, String key, double fallback, double low, double high, String rule) {
        Object value = configs.get(key);
        if (value == null || value.toString().isBlank()) {
            return fallback;
        }
        double number;
        try {
            number = value instanceof Number n ? n.doubleValue() : Double.parseDouble(value.toString().trim());
        } catch (NumberFormatException e) {
            throw new ConfigException(key + ": expected " + rule + ", got '" + value + "'");
        }
        if (!(number >= low && number <= high)) {
            throw new ConfigException(key + ": expected " + rule + ", got '" + value + "'");
        }
        return number;
    }

    /** What identifies one shared emitter: the same location writing to the same trace cluster and topic. */
    Object emitterKey() {
        return java.util.List.of(location, traceTopic, traceProducerConfig, queueMaxTraces, batchLingerMs, markIntervalMs,
                markMemoryMs, deliveryTimeoutMs);
    }

    /** Never the trace producer's settings: they may hold credentials. */
    @Override
    public String toString() {
        return "TracingConfig[location=" + location + ", cluster=" + cluster + ", stream=" + stream
                + ", samplingPercent=" + samplingPercent + ", group=" + group + ", traceTopic=" + traceTopic
                + ", traceServers=" + traceProducerConfig.get("bootstrap.servers") + "]";
    }
}
