package io.khipu.tracing;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared vectors (vectors/ at the repository's root): the Java encoder writes the very bytes the Python codec
 * writes and reads (tests/unit/trace/test_vectors.py holds Python to the same files), and reads headers, samples and
 * hashes keys as Python does.
 */
class SharedVectorsTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    static JsonNode load(String name) throws IOException {
        String folder = System.getProperty("khipu.vectors", "../../vectors");
        return JSON.readTree(Path.of(folder, name).toFile());
    }

    static Trace trace(JsonNode f) {
        Map<String, String> attributes = new LinkedHashMap<>();
        f.get("attributes").fields().forEachRemaining(e -> attributes.put(e.getKey(), e.getValue().asText()));
        long[] prev = new long[f.get("prev_offsets").size()];
        for (int i = 0; i < prev.length; i++) {
            prev[i] = f.get("prev_offsets").get(i).asLong();
        }
        return new Trace(f.get("message_id").asText(), f.get("stream").asText(), f.get("location").asText(),
                f.get("cluster").asText(), TraceType.valueOf(f.get("type").asText()), f.get("timestamp_ms").asLong(),
                f.get("topic").asText(), f.get("partition").asInt(), f.get("offset").asLong(),
                f.get("group").isNull() ? null : f.get("group").asText(), f.get("emitter_id").asText(),
                f.get("emitter_seq").asLong(), f.get("sampling_percent").asDouble(), attributes, prev,
                f.get("key_hash").isNull() ? null : f.get("key_hash").asText(), f.get("tombstone").asBoolean(),
                f.get("transactional").asBoolean(), f.get("read_uncommitted").asBoolean());
    }

    static RecordHeaders headers(JsonNode list) {
        RecordHeaders headers = new RecordHeaders();
        for (JsonNode h : list) {
            byte[] value = h.has("value_hex") ? HexFormat.of().parseHex(h.get("value_hex").asText())
                    : h.get("value").isNull() ? null : h.get("value").asText().getBytes(StandardCharsets.UTF_8);
            headers.add(h.get("name").asText(), value);
        }
        return headers;
    }

    @TestFactory
    Stream<DynamicTest> traces_encode_byte_for_byte() throws IOException {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode v : load("trace-records.json").get("traces")) {
            tests.add(DynamicTest.dynamicTest(v.get("name").asText(), () -> assertEquals(
                    v.get("bytes").asText(), new String(TraceFormat.encode(trace(v.get("trace"))), StandardCharsets.UTF_8))));
            tests.add(DynamicTest.dynamicTest(v.get("name").asText() + " (bytes)", () -> assertArrayEquals(
                    v.get("bytes").asText().getBytes(StandardCharsets.UTF_8), TraceFormat.encode(trace(v.get("trace"))))));
        }
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> batches_join_byte_for_byte() throws IOException {
        java.util.Map<String, byte[]> lines = new java.util.HashMap<>();
        JsonNode records = load("trace-records.json");
        for (String kind : List.of("traces", "marks")) {
            for (JsonNode v : records.get(kind)) {
                lines.put(v.get("name").asText(), v.get("bytes").asText().getBytes(StandardCharsets.UTF_8));
            }
        }
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode v : load("batch-records.json").get("batches")) {
            List<byte[]> batch = new ArrayList<>();
            v.get("lines").forEach(name -> batch.add(lines.get(name.asText())));
            tests.add(DynamicTest.dynamicTest(v.get("name").asText(), () -> assertArrayEquals(
                    v.get("bytes").asText().getBytes(StandardCharsets.UTF_8), TraceFormat.joinBatch(batch))));
        }
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> marks_encode_byte_for_byte() throws IOException {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode v : load("trace-records.json").get("marks")) {
            JsonNode m = v.get("mark");
            List<EmitterMark.Received> received = new ArrayList<>();
            for (JsonNode r : m.get("received")) {
                received.add(new EmitterMark.Received(r.get(0).asText(), r.get(1).asText(), r.get(2).asInt(), r.get(3).asLong()));
            }
            EmitterMark mark = new EmitterMark(m.get("emitter_id").asText(), m.get("location").asText(),
                    m.get("emitter_seq").asLong(), m.get("timestamp_ms").asLong(), received);
            tests.add(DynamicTest.dynamicTest(v.get("name").asText(), () -> assertArrayEquals(
                    v.get("bytes").asText().getBytes(StandardCharsets.UTF_8), TraceFormat.encode(mark))));
        }
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> sampling_buckets_and_thresholds() throws IOException {
        JsonNode sampling = load("sampling.json");
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode v : sampling.get("buckets")) {
            String id = v.get("id").asText();
            tests.add(DynamicTest.dynamicTest("bucket of " + id.substring(0, Math.min(24, id.length())),
                    () -> assertEquals(v.get("bucket").asInt(), Sampling.bucket(id))));
        }
        for (JsonNode v : sampling.get("thresholds")) {
            tests.add(DynamicTest.dynamicTest("threshold of " + v.get("percent").asText(),
                    () -> assertEquals(v.get("threshold").asInt(), Sampling.threshold(v.get("percent").asDouble()))));
        }
        String pattern = sampling.get("generated_id_pattern").asText();
        Sampling.MessageIds ids = new Sampling.MessageIds();
        for (int bucket : new int[] {0, 42, 9999}) {
            tests.add(DynamicTest.dynamicTest("generated id with bucket " + bucket, () -> {
                String id = ids.withBucket(bucket);
                assertTrue(id.matches(pattern), id);
                assertEquals(bucket, Sampling.bucket(id));
            }));
        }
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> key_hashes() throws IOException {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode v : load("key-hashes.json")) {
            String hex = v.get("key_hex").asText();
            tests.add(DynamicTest.dynamicTest("key " + (hex.isEmpty() ? "(empty)" : hex),
                    () -> assertEquals(v.get("key_hash").asText(), KeyHash.of(HexFormat.of().parseHex(hex)))));
        }
        tests.add(DynamicTest.dynamicTest("no key, no hash", () -> assertNull(KeyHash.of(null))));
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> header_sets_read_as_python_reads_them() throws IOException {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode v : load("headers.json").get("read")) {
            tests.add(DynamicTest.dynamicTest(v.get("name").asText(), () -> {
                RecordHeaders headers = headers(v.get("headers"));
                TraceContext context = TraceHeaders.context(headers);
                JsonNode expected = v.get("context");
                if (expected.isNull()) {
                    assertNull(context);
                } else {
                    assertEquals(new TraceContext(expected.get("message_id").asText(), expected.get("stream").asText(),
                            expected.get("sampling_percent").asDouble()), context);
                }
                ResendMark mark = TraceHeaders.resend(headers);
                JsonNode resend = v.get("resend");
                if (resend.isNull()) {
                    assertNull(mark);
                } else {
                    assertEquals(new ResendMark(resend.get("resend_id").asText(), resend.get("hop").asText(),
                            resend.get("target_group").isNull() ? null : resend.get("target_group").asText()), mark);
                }
            }));
        }
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> trace_headers_written_as_python_writes_them() throws IOException {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode v : load("headers.json").get("written")) {
            JsonNode c = v.get("context");
            TraceContext context = new TraceContext(c.get("message_id").asText(), c.get("stream").asText(),
                    c.get("sampling_percent").asDouble());
            tests.add(DynamicTest.dynamicTest("headers of " + context, () -> {
                RecordHeaders written = new RecordHeaders();
                TraceHeaders.write(written, context);
                Header[] expected = headers(v.get("headers")).toArray();
                Header[] actual = written.toArray();
                assertEquals(expected.length, actual.length);
                for (int i = 0; i < expected.length; i++) {
                    assertEquals(expected[i].key(), actual[i].key());
                    assertArrayEquals(expected[i].value(), actual[i].value(), expected[i].key());
                }
            }));
        }
        return tests.stream();
    }
}
