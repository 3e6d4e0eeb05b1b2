package io.khipu.testapps;

import java.io.BufferedWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;

/** An application's own record of what it did: one JSON object per line, flushed as written. */
final class Ledger implements AutoCloseable {
    private final BufferedWriter out;

    Ledger(Path path) throws IOException {
        out = Files.newBufferedWriter(path, StandardCharsets.UTF_8);
    }

    synchronized void write(Map<String, Object> entry) {
        StringBuilder line = new StringBuilder("{");
        for (Map.Entry<String, Object> field : entry.entrySet()) {
            if (line.length() > 1) {
                line.append(',');
            }
            line.append('"').append(field.getKey()).append("\":");
            Object value = field.getValue();
            if (value == null) {
                line.append("null");
            } else if (value instanceof Number || value instanceof Boolean) {
                line.append(value);
            } else {
                line.append('"').append(value.toString().replace("\\", "\\\\").replace("\"", "\\\"")).append('"');
            }
        }
        try {
            out.write(line.append("}\n").toString());
            out.flush();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /**
     * The message id the record carries, or null: what the application itself sees. It is the first field of the
     * "khipu" header ("id stream sampling", split at the last two spaces), or an id the application set in khipu-id.
     */
    static String messageId(Headers headers) {
        Header trace = headers.lastHeader("khipu");
        if (trace != null && trace.value() != null && trace.value().length > 0) {
            String text = new String(trace.value(), StandardCharsets.UTF_8);
            int last = text.lastIndexOf(' ');
            int middle = last <= 0 ? -1 : text.lastIndexOf(' ', last - 1);
            return middle <= 0 || middle + 1 == last ? null : text.substring(0, middle);
        }
        Header id = headers.lastHeader("khipu-id");
        return id == null || id.value() == null ? null : new String(id.value(), StandardCharsets.UTF_8);
    }

    @Override
    public synchronized void close() throws IOException {
        out.close();
    }
}
