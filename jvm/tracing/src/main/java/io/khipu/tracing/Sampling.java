package io.khipu.tracing;

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.CRC32;

/**
 * Consistent sampling: the decision is a function of the message id alone, so every hop in every language agrees
 * (docs/trace-format.md, "Sampling"; {@code khipu.trace.sampling}).
 */
public final class Sampling {
    public static final int BUCKETS = 10_000;
    private static final long FIBONACCI_32 = 0x9E3779B1L;

    private Sampling() {}

    /** The id's bucket in [0, 10000): "k.BBBB.rest" carries it (4 ASCII digits), any other id is hashed. */
    public static int bucket(String messageId) {
        if (messageId.length() >= 7 && messageId.startsWith("k.") && messageId.charAt(6) == '.') {
            int carried = 0;
            boolean digits = true;
            for (int i = 2; i < 6; i++) {
                char c = messageId.charAt(i);
                if (c < '0' || c > '9') {
                    digits = false;
                    break;
                }
                carried = carried * 10 + (c - '0');
            }
            if (digits) {
                return carried;
            }
        }
        CRC32 crc = new CRC32();
        crc.update(messageId.getBytes(StandardCharsets.UTF_8));
        long mixed = (crc.getValue() * FIBONACCI_32) & 0xFFFFFFFFL;
        return (int) ((mixed * BUCKETS) >>> 32);
    }

    /** Buckets below this number are sampled: round(percent * 100), halves to even as Python's round. */
    public static int threshold(double samplingPercent) {
        double rounded = Math.rint(samplingPercent * 100);
        return (int) Math.max(0, Math.min(BUCKETS, rounded));
    }

    /** ``bytes`` random bytes as lowercase hex: an id generator's prefix, an emitter id's suffix. */
    static String randomHex(int bytes) {
        byte[] random = new byte[bytes];
        new SecureRandom().nextBytes(random);
        StringBuilder hex = new StringBuilder(2 * bytes);
        for (byte b : random) {
            hex.append(Character.forDigit((b >> 4) & 15, 16)).append(Character.forDigit(b & 15, 16));
        }
        return hex.toString();
    }

    public static boolean isSampled(String messageId, double samplingPercent) {
        return bucket(messageId) < threshold(samplingPercent);
    }

    /** Ids for one producer: {@code k.<bucket>.<12 hex producer prefix>.<hex counter>}, unique across producers. */
    public static final class MessageIds {
        private final String prefix;
        private final AtomicLong counter = new AtomicLong();

        public MessageIds() {
            this.prefix = randomHex(6);
        }

        /** An id carrying {@code bucket}, which the caller drew uniformly from [0, 10000). */
        public String withBucket(int bucket) {
            StringBuilder id = new StringBuilder(32).append("k.");
            String digits = Integer.toString(bucket);
            for (int i = digits.length(); i < 4; i++) {
                id.append('0');
            }
            return id.append(digits).append('.').append(prefix).append('.')
                    .append(Long.toHexString(counter.getAndIncrement())).toString();
        }
    }
}
