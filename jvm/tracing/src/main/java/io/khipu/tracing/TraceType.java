package io.khipu.tracing;

/** SENT: the broker acknowledged a traced write. RECEIVED: a consumer group got a traced record. */
public enum TraceType {
    SENT,
    RECEIVED
}
