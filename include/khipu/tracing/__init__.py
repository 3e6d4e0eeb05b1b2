"""Tracing for applications: traced producer, consumer and processor helpers, and the emitter."""

from __future__ import annotations

from khipu.tracing.clients import TracedConsumer, TracedProducer
from khipu.tracing.config import DEFAULT_TRACE_TOPIC, TraceEmitterConfig, TracingConfigError
from khipu.tracing.emitter import EmitterStats, TraceEmitter
from khipu.tracing.headers import (
    HEADER_MESSAGE_ID,
    HEADER_SAMPLING,
    HEADER_STREAM,
    HEADER_TRACE,
    TraceContext,
    carry_trace_headers,
    trace_context,
)

__all__ = [
    "DEFAULT_TRACE_TOPIC",
    "HEADER_MESSAGE_ID",
    "HEADER_SAMPLING",
    "HEADER_STREAM",
    "HEADER_TRACE",
    "EmitterStats",
    "TraceContext",
    "TraceEmitter",
    "TraceEmitterConfig",
    "TracedConsumer",
    "TracedProducer",
    "TracingConfigError",
    "carry_trace_headers",
    "trace_context",
]
