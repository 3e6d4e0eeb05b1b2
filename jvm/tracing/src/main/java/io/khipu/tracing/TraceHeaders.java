package io.khipu.tracing;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.regex.Pattern;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;

/**
 * The record headers that carry a traced message's identity from hop to hop ({@code khipu.tracing.headers}); only
 * sampled messages carry them. A traced record carries one, {@code khipu}: "&lt;message id&gt; &lt;stream&gt;
 * &lt;sampling percent&gt;" (the id may hold spaces, the other two never do). Records written before it carry
 * three ({@code khipu-id}, {@code khipu-stream}, {@code khipu-sampling}), read only when there is no {@code khipu}
 * header. Read as the Python library reads them (vectors/headers.json): the last header of a name counts, a value
 * that is not UTF-8 is no value, an unreadable sampling percent means 100.
 */
public final class TraceHeaders {
    public static final String TRACE = "khipu";
    public static final String MESSAGE_ID = "khipu-id";
    public static final String STREAM = "khipu-stream";
    public static final String SAMPLING = "khipu-sampling";
    public static final String RESEND_ID = "khipu-resend-id";
    public static final String RESEND_HOP = "khipu-resend-hop";
    public static final String RESEND_TARGET = "khipu-resend-target";
    public static final String ATTRIBUTE_RESEND_ID = "khipu.resend_id";
    public static final String ATTRIBUTE_RESEND_HOP = "khipu.resend_hop";
    private static final Pattern SAMPLING_PATTERN = Pattern.compile("[0-9]+(?:\\.[0-9]+)?(?:[eE][-+]?[0-9]+)?");

    private TraceHeaders() {}

    /** The trace context in a record's headers, or null when the record is not traced. */
    public static TraceContext context(Headers headers) {
        if (headers == null) {
            return null;
        }
        Header trace = headers.lastHeader(TRACE);
        if (trace != null && trace.value() != null && trace.value().length > 0) {
            return fromTraceHeader(text(trace));
        }
        String messageId = text(headers.lastHeader(MESSAGE_ID));
        if (messageId == null || messageId.isEmpty()) {
            return null;
        }
        String stream = text(headers.lastHeader(STREAM));
        if (stream == null || stream.isEmpty()) {
            return null;
        }
        return new TraceContext(messageId, stream, sampling(text(headers.lastHeader(SAMPLING))));
    }

    private static TraceContext fromTraceHeader(String text) {
        int last = text == null ? -1 : text.lastIndexOf(' ');
        int middle = last <= 0 ? -1 : text.lastIndexOf(' ', last - 1);
        if (middle <= 0 || middle + 1 == last) {
            return null; // fewer than three fields, an empty id or an empty stream
        }
        return new TraceContext(text.substring(0, middle), text.substring(middle + 1, last),
                sampling(text.substring(last + 1)));
    }

    /** The message id an application put in the headers itself (a source naming its own ids), or null. */
    public static String messageId(Headers headers) {
        String id = headers == null ? null : text(headers.lastHeader(MESSAGE_ID));
        return id == null || id.isEmpty() ? null : id;
    }

    /** The resend mark in a record's headers, or null for a record Khipu did not resend. */
    public static ResendMark resend(Headers headers) {
        if (headers == null) {
            return null;
        }
        String id = text(headers.lastHeader(RESEND_ID));
        String hop = text(headers.lastHeader(RESEND_HOP));
        if (id == null || id.isEmpty() || hop == null || hop.isEmpty()) {
            return null;
        }
        String target = text(headers.lastHeader(RESEND_TARGET));
        return new ResendMark(id, hop, target == null || target.isEmpty() ? null : target);
    }

    /** Put a context's headers on a record (replacing any of the same names), as the Python library writes them. */
    public static void write(Headers headers, TraceContext context) {
        headers.remove(TRACE);
        headers.remove(MESSAGE_ID);
        headers.remove(STREAM);
        headers.remove(SAMPLING);
        String value = context.messageId() + " " + context.stream() + " "
                + TraceFormat.pythonFloat(context.samplingPercent());
        headers.add(TRACE, value.getBytes(StandardCharsets.UTF_8));
    }

    static double sampling(String text) {
        if (text == null || !SAMPLING_PATTERN.matcher(text).matches()) {
            return 100.0;
        }
        double value = Double.parseDouble(text);
        return value > 0 && value <= 100 ? value : 100.0;
    }

    /** A header's value as strict UTF-8; null for no header, a null value or bytes that are not UTF-8. */
    static String text(Header header) {
        byte[] value = header == null ? null : header.value();
        if (value == null) {
            return null;
        }
        boolean ascii = true;
        for (byte b : value) {
            if (b < 0) {
                ascii = false;
                break;
            }
        }
        if (ascii) {
            return new String(value, StandardCharsets.US_ASCII);
        }
        try {
            return StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(value))
                    .toString();
        } catch (CharacterCodingException e) {
            return null;
        }
    }
}
