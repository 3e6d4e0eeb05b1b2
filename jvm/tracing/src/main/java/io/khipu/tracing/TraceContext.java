package io.khipu.tracing;

/** What a traced record carries in its headers: its message id, stream and the stream's sampling percent. */
public record TraceContext(String messageId, String stream, double samplingPercent) {}
