"""The trace record: what a traced component emits at every hop, and its wire format."""

from __future__ import annotations

from khipu.trace.codec import (
    MAX_TRACE_BYTES,
    TRACE_FORMAT_VERSION,
    TraceDecodeError,
    decode_record,
    decode_trace,
    encode_mark,
    encode_trace,
)
from khipu.trace.model import EmitterMark, Trace, TraceType
from khipu.trace.sampling import SAMPLING_BUCKETS, is_sampled, sampling_bucket

__all__ = [
    "EmitterMark",
    "decode_record",
    "encode_mark",
    "MAX_TRACE_BYTES",
    "SAMPLING_BUCKETS",
    "TRACE_FORMAT_VERSION",
    "Trace",
    "TraceDecodeError",
    "TraceType",
    "decode_trace",
    "encode_trace",
    "is_sampled",
    "sampling_bucket",
]
