package io.khipu.tracing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.Test;

/**
 * What onSend does to a record, before any broker is involved (the real-broker behaviour, SENT traces included, is
 * tested end to end by tests/integration/tracing/test_jvm_interceptors.py). No trace is sent here: the emitter's
 * producer points at a port nothing listens on, and the interceptor is closed at once.
 */
class ProducerInterceptorTest {

    static KhipuProducerInterceptor<String, String> interceptor(Object... pairs) {
        Map<String, Object> configs = TracingConfigTest.client(pairs);
        configs.put("bootstrap.servers", "127.0.0.1:1");
        configs.put("key.serializer", StringSerializer.class);
        configs.put("khipu.close.timeout.ms", 0);
        KhipuProducerInterceptor<String, String> interceptor = new KhipuProducerInterceptor<>();
        interceptor.configure(configs);
        return interceptor;
    }

    @Test
    void a_source_at_100_percent_gives_each_record_a_new_id_and_the_stream_headers() {
        KhipuProducerInterceptor<String, String> source = interceptor("khipu.location", "src", "khipu.stream", "orders");
        try {
            ProducerRecord<String, String> sent = source.onSend(new ProducerRecord<>("orders", "k", "v"));
            TraceContext context = TraceHeaders.context(sent.headers());
            assertNotNull(context);
            assertTrue(context.messageId().matches("^k\\.[0-9]{4}\\.[0-9a-f]{12}\\.[0-9a-f]+$"), context.messageId());
            assertEquals("orders", context.stream());
            assertEquals(context.messageId() + " orders 100.0",
                    new String(sent.headers().lastHeader("khipu").value(), StandardCharsets.UTF_8));
            assertEquals(1, sent.headers().toArray().length); // one header, as the Python library writes it
            assertEquals("k", sent.key());
        } finally {
            source.close();
        }
    }

    @Test
    void a_source_at_0_percent_and_a_producer_without_a_stream_leave_untraced_records_alone() {
        KhipuProducerInterceptor<String, String> off = interceptor("khipu.location", "src", "khipu.stream", "orders",
                "khipu.sampling.percent", "0");
        KhipuProducerInterceptor<String, String> plain = interceptor("khipu.location", "proc");
        try {
            ProducerRecord<String, String> record = new ProducerRecord<>("orders", "k", "v");
            assertSame(record, off.onSend(record));
            assertSame(record, plain.onSend(record));
            assertNull(record.headers().lastHeader("khipu"));
            assertNull(record.headers().lastHeader("khipu-id"));
        } finally {
            off.close();
            plain.close();
        }
    }

    @Test
    void an_id_the_application_gives_is_sampled_by_its_bucket_and_carried_headers_are_kept() {
        KhipuProducerInterceptor<String, String> source = interceptor("khipu.location", "src", "khipu.stream", "orders",
                "khipu.sampling.percent", "1");
        try {
            RecordHeaders in = new RecordHeaders();
            in.add("khipu-id", "k.0420.x".getBytes(StandardCharsets.UTF_8)); // bucket 420: not in a 1 % sample (0-99)
            assertNull(TraceHeaders.context(source.onSend(new ProducerRecord<>("t", null, "k", "v", in)).headers()));
            RecordHeaders low = new RecordHeaders();
            low.add("khipu-id", "k.0007.x".getBytes(StandardCharsets.UTF_8)); // bucket 7: sampled
            assertEquals(new TraceContext("k.0007.x", "orders", 1.0),
                    TraceHeaders.context(source.onSend(new ProducerRecord<>("t", null, "k", "v", low)).headers()));
            RecordHeaders carried = new RecordHeaders();
            TraceHeaders.write(carried, new TraceContext("m-1", "payments", 50.0));
            ProducerRecord<String, String> output = new ProducerRecord<>("t", null, "k", "v", carried);
            assertEquals(new TraceContext("m-1", "payments", 50.0), TraceHeaders.context(source.onSend(output).headers()));
        } finally {
            source.close();
        }
    }

    @Test
    void a_resend_mark_is_never_carried_on_to_what_is_written() {
        KhipuProducerInterceptor<String, String> processor = interceptor("khipu.location", "proc");
        try {
            RecordHeaders in = new RecordHeaders();
            TraceHeaders.write(in, new TraceContext("m-1", "orders", 100.0));
            in.add(TraceHeaders.RESEND_ID, "r-1".getBytes(StandardCharsets.UTF_8));
            in.add(TraceHeaders.RESEND_HOP, "local/in -> proc".getBytes(StandardCharsets.UTF_8));
            in.add(TraceHeaders.RESEND_TARGET, "proc".getBytes(StandardCharsets.UTF_8));
            ProducerRecord<String, String> out = processor.onSend(new ProducerRecord<>("out", null, "k", "v", in));
            assertNull(TraceHeaders.resend(out.headers()));
            assertNull(out.headers().lastHeader(TraceHeaders.RESEND_TARGET));
            assertEquals(new TraceContext("m-1", "orders", 100.0), TraceHeaders.context(out.headers()));
        } finally {
            processor.close();
        }
    }

    @Test
    void closing_with_the_trace_cluster_down_waits_no_longer_than_the_close_timeout() {
        KhipuProducerInterceptor<String, String> source = interceptor("khipu.location", "src", "khipu.stream", "orders",
                "khipu.close.timeout.ms", 300);
        TraceEmitter emitter = source.emitter();
        emitter.emitSent(new TraceContext("m-1", "orders", 100.0), "local", "orders", 0, 0, 1L, null, false, false);
        long started = System.nanoTime();
        source.close();
        long tookMs = (System.nanoTime() - started) / 1_000_000;
        assertTrue(tookMs < 3_000, "close took " + tookMs + " ms");
        assertEquals(1, emitter.getEmitted());
        assertEquals(0, emitter.getDelivered());
        assertEquals(0, emitter.getPending());
    }
}
