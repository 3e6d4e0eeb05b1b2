package io.khipu.tracing;

import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * The short hash of a record key that a SENT trace carries, never the key: the first 8 bytes of the SHA-256 of the
 * key's bytes as written (after the application's serializer), as 16 lowercase hex digits ({@code khipu.trace.keys}).
 */
public final class KeyHash {
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private KeyHash() {}

    /** The hash of a serialized key; null for a record without one. */
    public static String of(byte[] key) {
        if (key == null) {
            return null;
        }
        byte[] digest;
        try {
            digest = MessageDigest.getInstance("SHA-256").digest(key);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every Java platform has SHA-256", e);
        }
        char[] out = new char[16];
        for (int i = 0; i < 8; i++) {
            out[2 * i] = HEX[(digest[i] >> 4) & 15];
            out[2 * i + 1] = HEX[digest[i] & 15];
        }
        return new String(out);
    }
}
