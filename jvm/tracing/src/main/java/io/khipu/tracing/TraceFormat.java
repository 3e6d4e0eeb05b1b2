package io.khipu.tracing;

import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.Map;

/**
 * The trace wire format, byte for byte as the Python encoder writes it ({@code khipu.trace.codec.encode_trace}): the
 * shared vectors (vectors/trace-records.json) hold both to the same bytes, so a trace from the JVM takes the
 * detector's cheapest decode path exactly as a Python one does.
 */
public final class TraceFormat {
    public static final int TRACE_VERSION = 3;
    public static final int MARK_VERSION = 2;
    public static final int MAX_TRACE_BYTES = 16_384;
    public static final int MAX_MARK_ENTRIES = 4_096;
    /** An emitter packs up to this many traces into one trace-topic record (khipu.trace.codec.BATCH_MAX_TRACES). */
    public static final int BATCH_MAX_TRACES = 500;
    /** ... and up to this many bytes of them (khipu.trace.codec.BATCH_MAX_BYTES). */
    public static final int BATCH_MAX_BYTES = 65_536;

    private TraceFormat() {}

    /**
     * Several encoded traces (and marks) as one trace-topic record, in order: their bytes joined by a line feed, none
     * after the last (JSON Lines; vectors/batch-records.json). A batch of one is the trace itself.
     */
    public static byte[] joinBatch(java.util.List<byte[]> encoded) {
        int size = Math.max(0, encoded.size() - 1);
        for (byte[] line : encoded) {
            size += line.length;
        }
        byte[] out = new byte[size];
        int at = 0;
        for (int i = 0; i < encoded.size(); i++) {
            if (i > 0) {
                out[at++] = '\n';
            }
            byte[] line = encoded.get(i);
            System.arraycopy(line, 0, out, at, line.length);
            at += line.length;
        }
        return out;
    }

    /** A trace as its version-3 JSON bytes; the version-3 fields follow prev_offsets, each only when it says something. */
    public static byte[] encode(Trace t) {
        StringBuilder out = new StringBuilder(320);
        out.append("{\"v\":").append(TRACE_VERSION).append(",\"message_id\":");
        appendString(out, t.messageId());
        out.append(",\"stream\":");
        appendString(out, t.stream());
        out.append(",\"location\":");
        appendString(out, t.location());
        out.append(",\"cluster\":");
        appendString(out, t.cluster());
        out.append(",\"type\":\"").append(t.type().name()).append("\",\"timestamp_ms\":").append(t.timestampMs());
        out.append(",\"topic\":");
        appendString(out, t.topic());
        out.append(",\"partition\":").append(t.partition()).append(",\"offset\":").append(t.offset()).append(",\"group\":");
        if (t.group() == null) {
            out.append("null");
        } else {
            appendString(out, t.group());
        }
        out.append(",\"emitter_id\":");
        appendString(out, t.emitterId());
        out.append(",\"emitter_seq\":").append(t.emitterSeq());
        out.append(",\"sampling_percent\":").append(pythonFloat(t.samplingPercent()));
        out.append(",\"attributes\":{");
        boolean first = true;
        for (Map.Entry<String, String> entry : t.attributes().entrySet()) {
            if (!first) {
                out.append(',');
            }
            first = false;
            appendString(out, entry.getKey());
            out.append(':');
            appendString(out, entry.getValue());
        }
        out.append("},\"prev_offsets\":[");
        long[] prev = t.prevOffsets();
        for (int i = 0; i < prev.length; i++) {
            if (i > 0) {
                out.append(',');
            }
            out.append(prev[i]);
        }
        out.append(']');
        if (t.keyHash() != null) {
            out.append(",\"key_hash\":");
            appendString(out, t.keyHash());
        }
        if (t.tombstone()) {
            out.append(",\"tombstone\":true");
        }
        if (t.transactional()) {
            out.append(",\"transactional\":true");
        }
        if (t.readUncommitted()) {
            out.append(",\"read_uncommitted\":true");
        }
        out.append('}');
        return out.toString().getBytes(StandardCharsets.UTF_8);
    }

    /** An emitter mark as its version-2 JSON bytes. */
    public static byte[] encode(EmitterMark mark) {
        StringBuilder out = new StringBuilder(160 + 40 * mark.received().size());
        out.append("{\"v\":").append(MARK_VERSION).append(",\"mark\":true,\"emitter_id\":");
        appendString(out, mark.emitterId());
        out.append(",\"location\":");
        appendString(out, mark.location());
        out.append(",\"emitter_seq\":").append(mark.emitterSeq()).append(",\"timestamp_ms\":").append(mark.timestampMs());
        out.append(",\"received\":[");
        boolean first = true;
        for (EmitterMark.Received r : mark.received()) {
            if (!first) {
                out.append(',');
            }
            first = false;
            out.append('[');
            appendString(out, r.cluster());
            out.append(',');
            appendString(out, r.topic());
            out.append(',').append(r.partition()).append(',').append(r.offset()).append(']');
        }
        out.append("]}");
        return out.toString().getBytes(StandardCharsets.UTF_8);
    }

    /**
     * A JSON string as Python's {@code json} writes it without ensure_ascii: quote, backslash and the control
     * characters below U+0020 escaped ({@code \n \r \t \b \f}, else a six-character escape, backslash u 00XX, in lowercase hex), all else as is.
     */
    static void appendString(StringBuilder out, String s) {
        out.append('"');
        int n = s.length();
        for (int i = 0; i < n; i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                case '\b' -> out.append("\\b");
                case '\f' -> out.append("\\f");
                default -> {
                    if (c < 0x20) {
                        out.append("\\u00").append(Character.forDigit(c >> 4, 16)).append(Character.forDigit(c & 15, 16));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    /**
     * A double as Python's {@code repr} writes it: the shortest digits that read back to it, positional from 1e-4 up
     * to 1e16 (with ".0" when whole), else in exponent form ("1e-05", "1.5e+16").
     */
    public static String pythonFloat(double value) {
        if (Double.isNaN(value) || Double.isInfinite(value)) {
            throw new IllegalArgumentException("not a finite number: " + value);
        }
        if (value == 0) {
            return (1 / value < 0) ? "-0.0" : "0.0";
        }
        BigDecimal exact = new BigDecimal(Double.toString(value)).stripTrailingZeros();
        String digits = exact.unscaledValue().abs().toString();
        int exponent = digits.length() - 1 - exact.scale(); // of the first digit
        String sign = exact.signum() < 0 ? "-" : "";
        if (exponent >= -4 && exponent < 16) {
            String plain = exact.abs().toPlainString();
            return sign + (plain.indexOf('.') < 0 ? plain + ".0" : plain);
        }
        String mantissa = digits.length() == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
        String power = String.format("%02d", Math.abs(exponent));
        return sign + mantissa + "e" + (exponent < 0 ? "-" : "+") + power;
    }
}
