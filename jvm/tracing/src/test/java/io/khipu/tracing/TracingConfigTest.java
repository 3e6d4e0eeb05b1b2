package io.khipu.tracing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigException;
import org.junit.jupiter.api.Test;

/** The khipu.* properties: defaults, where traces go, and errors that name the property and what it expects. */
class TracingConfigTest {

    static Map<String, Object> client(Object... pairs) {
        Map<String, Object> configs = new HashMap<>();
        configs.put("bootstrap.servers", List.of("127.0.0.1:9092"));
        for (int i = 0; i < pairs.length; i += 2) {
            configs.put((String) pairs[i], pairs[i + 1]);
        }
        return configs;
    }

    @Test
    void defaults_trace_to_the_clients_own_cluster_with_its_security_settings() {
        TracingConfig config = TracingConfig.from(client("khipu.location", "orders-api", "security.protocol", "SASL_SSL",
                "sasl.jaas.config", "secret", "max.poll.records", 5));
        assertEquals("local", config.cluster());
        assertNull(config.stream());
        assertEquals(100.0, config.samplingPercent());
        assertEquals("khipu.traces", config.traceTopic());
        assertEquals(Map.of("bootstrap.servers", "127.0.0.1:9092", "security.protocol", "SASL_SSL",
                "sasl.jaas.config", "secret"), config.traceProducerConfig());
        assertFalse(config.toString().contains("secret"), config.toString());
    }

    @Test
    void a_trace_cluster_of_its_own_takes_only_the_khipu_trace_settings() {
        TracingConfig config = TracingConfig.from(client("khipu.location", "mm2", "security.protocol", "SSL",
                "khipu.trace.bootstrap.servers", "traces:9093", "khipu.trace.security.protocol", "PLAINTEXT",
                "khipu.trace.topic", "my.traces", "khipu.stream", "orders", "khipu.sampling.percent", "2.5"));
        assertEquals(Map.of("bootstrap.servers", "traces:9093", "security.protocol", "PLAINTEXT"),
                config.traceProducerConfig());
        assertEquals("my.traces", config.traceTopic());
        assertEquals("orders", config.stream());
        assertEquals(2.5, config.samplingPercent());
    }

    @Test
    void bad_values_fail_naming_the_property_and_what_it_expects() {
        String missing = assertThrows(ConfigException.class, () -> TracingConfig.from(client())).getMessage();
        assertTrue(missing.startsWith("khipu.location: missing; expected 1-249 characters"), missing);
        String badName = assertThrows(ConfigException.class,
                () -> TracingConfig.from(client("khipu.location", "a b"))).getMessage();
        assertEquals("khipu.location: expected 1-249 characters of letters, digits, '.', '_' or '-', got 'a b'", badName);
        String badPercent = assertThrows(ConfigException.class,
                () -> TracingConfig.from(client("khipu.location", "x", "khipu.sampling.percent", "150"))).getMessage();
        assertEquals("khipu.sampling.percent: expected a number in [0, 100], got '150'", badPercent);
        String notNumber = assertThrows(ConfigException.class,
                () -> TracingConfig.from(client("khipu.location", "x", "khipu.queue.max.traces", "many"))).getMessage();
        assertEquals("khipu.queue.max.traces: expected an integer in [1, 10000000], got 'many'", notNumber);
        String noLinger = assertThrows(ConfigException.class,
                () -> TracingConfig.from(client("khipu.location", "x", "khipu.batch.linger.ms", "0"))).getMessage();
        assertEquals("khipu.batch.linger.ms: expected milliseconds in [1, 5000], got '0'", noLinger);
        assertEquals(50, TracingConfig.from(client("khipu.location", "x")).batchLingerMs());
        String owned = assertThrows(ConfigException.class, () -> TracingConfig.from(client("khipu.location", "x",
                "khipu.trace.bootstrap.servers", "t:1", "khipu.trace.acks", "1"))).getMessage();
        assertEquals("khipu.trace.acks: not set here; the trace emitter owns it", owned);
        Map<String, Object> noServers = new HashMap<>(Map.of("khipu.location", "x"));
        String nowhere = assertThrows(ConfigException.class, () -> TracingConfig.from(noServers)).getMessage();
        assertTrue(nowhere.startsWith("khipu.trace.bootstrap.servers: no trace cluster"), nowhere);
    }
}
