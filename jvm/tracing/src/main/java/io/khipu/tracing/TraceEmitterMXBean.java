package io.khipu.tracing;

/**
 * An emitter's counters over JMX ({@code io.khipu.tracing:type=TraceEmitter,id=<emitter id>}), beside the client's own
 * metrics: what the application asked to trace, what reached the trace topic, and what was dropped and why.
 */
public interface TraceEmitterMXBean {
    String getEmitterId();

    /** Traces the application's clients asked for (each got a sequence number). */
    long getEmitted();

    /** Handed to the trace producer. */
    long getAccepted();

    /** Acknowledged by the trace cluster. */
    long getDelivered();

    /** Dropped at once because the bounded queue was full (the trace channel slow or down). */
    long getDroppedQueueFull();

    /** Could not be encoded (a bug; logged). */
    long getDroppedInvalid();

    /** Accepted, then not delivered within khipu.delivery.timeout.ms. */
    long getFailedDelivery();

    /** Still queued when close gave up waiting. */
    long getDroppedAtClose();

    /** Queued or in flight now. */
    long getPending();
}
