package io.khipu.tracing;

import java.util.Map;

/**
 * One trace: a traced message seen at one hop (docs/trace-format.md, version 3). The same fields, in the same order,
 * as the Python library's {@code khipu.trace.Trace}.
 *
 * @param group the consumer group of a RECEIVED trace; null for SENT
 * @param attributes string attributes, written in their iteration order (a resent record's mark)
 * @param prevOffsets RECEIVED: the emitter's previous RECEIVED offsets on this partition, newest first
 * @param keyHash SENT: the short hash of the record's serialized key ({@link KeyHash}); null: no key
 */
public record Trace(
        String messageId,
        String stream,
        String location,
        String cluster,
        TraceType type,
        long timestampMs,
        String topic,
        int partition,
        long offset,
        String group,
        String emitterId,
        long emitterSeq,
        double samplingPercent,
        Map<String, String> attributes,
        long[] prevOffsets,
        String keyHash,
        boolean tombstone,
        boolean transactional,
        boolean readUncommitted) {}
