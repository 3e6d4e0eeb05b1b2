package io.khipu.tracing;

/**
 * A record Khipu resent for a confirmed loss: which attempt, for which lost hop, and for which group only (null:
 * every reader, a write-hop loss).
 */
public record ResendMark(String resendId, String hop, String targetGroup) {}
