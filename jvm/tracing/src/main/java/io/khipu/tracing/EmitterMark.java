package io.khipu.tracing;

import java.util.List;

/**
 * An emitter's "I am at sequence number N, and this is where I last received" (docs/trace-format.md, "Emitter
 * marks"): a trace lost just before a quiet spell still leaves a gap in the numbers and is still pointed at.
 */
public record EmitterMark(String emitterId, String location, long emitterSeq, long timestampMs, List<Received> received) {

    /** The offset of a recent RECEIVED trace on one partition. */
    public record Received(String cluster, String topic, int partition, long offset) {}
}
