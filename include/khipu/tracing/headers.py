"""The record headers that carry a traced message's identity from hop to hop.

Only sampled messages carry them; their presence is the signal "trace this record" (as in
Inca). Every component that writes a record derived from a traced input copies them on
(:func:`carry_trace_headers`).

A traced record carries one header, ``khipu``: its message id, stream and sampling percent, separated by spaces
(``k.0042.3fa2b9c1d2e3.1a orders 10.0``; the id comes first and may itself hold spaces, the other two never do).
Records written before it carry three (``khipu-id``, ``khipu-stream``, ``khipu-sampling``), and are read as they
were. One header instead of three costs the consuming application less than half as much to read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

HEADER_TRACE = "khipu"  # "<message id> <stream> <sampling percent>"
# the three headers it replaced, still read (and the id an application may set on a record it writes itself)
HEADER_MESSAGE_ID = "khipu-id"
HEADER_STREAM = "khipu-stream"
HEADER_SAMPLING = "khipu-sampling"
TRACE_HEADERS = (HEADER_TRACE, HEADER_MESSAGE_ID, HEADER_STREAM, HEADER_SAMPLING)

# A record Khipu resent for a confirmed loss (never copied on by processors: what they write is not a resend).
HEADER_RESEND_ID = "khipu-resend-id"  # the attempt's stable id
HEADER_RESEND_HOP = "khipu-resend-hop"  # the hop the message was lost at
HEADER_RESEND_TARGET = "khipu-resend-target"  # a read-hop loss: the one group that should take it
RESEND_HEADERS = (HEADER_RESEND_ID, HEADER_RESEND_HOP, HEADER_RESEND_TARGET)
# the RECEIVED trace of a resent record carries its resend id and hop in these attributes
ATTRIBUTE_RESEND_ID = "khipu.resend_id"
ATTRIBUTE_RESEND_HOP = "khipu.resend_hop"

# what a sampling header may say (as Python's repr of a float writes it: "10.0", "1e-05"); anything else is 100
SAMPLING_PATTERN = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")  # the whole value

HeaderValue = str | bytes | None
Headers = Sequence[tuple[str, HeaderValue]] | Mapping[str, HeaderValue]


class TraceContext(NamedTuple):
    """What a traced record carries: its message id, stream and the stream's sampling rate."""

    message_id: str
    stream: str
    sampling_percent: float

    def as_headers(self) -> list[tuple[str, bytes]]:
        return [(HEADER_TRACE, (self.message_id + trace_header_tail(self.stream, self.sampling_percent)).encode())]


def trace_header_tail(stream: str, sampling_percent: float) -> str:
    """What follows the message id in its trace header: ``" <stream> <sampling percent>"`` (the percent as Python's
    ``repr`` of a float writes it)."""
    return f" {stream} {float(sampling_percent)!r}"


# A context from its three values without NamedTuple's Python-level __new__ (built once per traced message).
new_context = functools.partial(tuple.__new__, TraceContext)


def _text(value: HeaderValue) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value


@functools.lru_cache(maxsize=256)  # a pipeline carries a handful of streams and sampling rates, on every record
def _stream_and_sampling(stream: HeaderValue, sampling: HeaderValue) -> tuple[str, float] | None:
    """The stream's name and sampling rate from their header values (None: no readable stream)."""
    name = _text(stream)
    if not name:
        return None
    text = _text(sampling)
    percent = float(text) if text is not None and SAMPLING_PATTERN.fullmatch(text) else 100.0
    return name, percent if 0 < percent <= 100 else 100.0


def read_headers(headers: Headers | None) -> tuple[TraceContext | None, ResendMark | None]:
    """The trace context and the resend mark in a record's headers (each ``None`` when absent), in one pass.

    A record whose khipu headers are incomplete or unreadable is treated as untraced (or as not resent): tracing
    must never break the application that carries it. A header given twice counts as its last value. A ``khipu``
    header with a value decides alone: the three older headers are read only without one (or with an empty one).
    """
    if not headers:
        return None, None
    # a consumed record's headers are a list (an ABC's isinstance costs more than the rest of this function)
    pairs: Any = headers if type(headers) is list else headers.items() if isinstance(headers, Mapping) else headers
    trace = message_id = stream = sampling = resend_id = hop = target = None
    for name, value in pairs:
        if name == HEADER_TRACE:
            trace = value
        elif name == HEADER_MESSAGE_ID:
            message_id = value
        elif name == HEADER_STREAM:
            stream = value
        elif name == HEADER_SAMPLING:
            sampling = value
        elif name == HEADER_RESEND_ID:
            resend_id = value
        elif name == HEADER_RESEND_HOP:
            hop = value
        elif name == HEADER_RESEND_TARGET:
            target = value
    context = mark = None
    if trace:  # the trace header decides alone: "<id> <stream> <sampling>", split at the last two spaces
        text = _text(trace) if isinstance(trace, (bytes, str)) else None
        message_id, stream, sampling = text.rsplit(" ", 2) if text and text.count(" ") >= 2 else (None, None, None)
    elif message_id:  # the three headers of records written before (what else a header holds says nothing)
        message_id = _text(message_id) if isinstance(message_id, (bytes, str)) else None
        stream = stream if isinstance(stream, (bytes, str)) else None
        sampling = sampling if isinstance(sampling, (bytes, str)) else None
    named = _stream_and_sampling(stream, sampling) if message_id and stream else None
    if named is not None:
        context = new_context((message_id, *named))
    if resend_id and hop:
        resend_id, hop = _text(resend_id), _text(hop)
        if resend_id and hop:
            mark = ResendMark(resend_id, hop, _text(target) or None)
    return context, mark


def trace_context(headers: Headers | None) -> TraceContext | None:
    """The trace context in a record's headers, or ``None`` when the record is not traced (see
    :func:`read_headers`)."""
    return read_headers(headers)[0]


class ResendMark(NamedTuple):
    """What a resent record's headers say: which attempt, for which lost hop, and for which group only."""

    resend_id: str
    hop: str
    target_group: str | None  # None: every reader (a write-hop loss)

    def as_headers(self) -> list[tuple[str, bytes]]:
        headers = [(HEADER_RESEND_ID, self.resend_id.encode()), (HEADER_RESEND_HOP, self.hop.encode())]
        if self.target_group is not None:
            headers.append((HEADER_RESEND_TARGET, self.target_group.encode()))
        return headers

    def as_attributes(self) -> dict[str, str]:
        return {ATTRIBUTE_RESEND_ID: self.resend_id, ATTRIBUTE_RESEND_HOP: self.hop}


def resend_mark(headers: Headers | None) -> ResendMark | None:
    """The resend mark in a record's headers, or ``None`` for a record Khipu did not resend (or whose mark is
    incomplete: treated as an ordinary record; see :func:`read_headers`)."""
    return read_headers(headers)[1]


def carry_trace_headers(
    source_headers: Headers | None, headers: Headers | None = None
) -> list[tuple[str, HeaderValue]]:
    """Headers for a record derived from an input record: ``headers`` plus the input's trace headers.

    Use it in processors: ``out.produce(topic, value, headers=carry_trace_headers(msg.headers()))``.
    A resend mark is never carried on: what a processor writes from a resent record is an ordinary record.
    """
    given = headers.items() if isinstance(headers, Mapping) else headers or []
    result: list[tuple[str, HeaderValue]] = [(n, v) for n, v in given if n not in RESEND_HEADERS]
    context = trace_context(source_headers)
    if context is not None:
        result = [(n, v) for n, v in result if n not in TRACE_HEADERS]
        result.extend(context.as_headers())
    return result
