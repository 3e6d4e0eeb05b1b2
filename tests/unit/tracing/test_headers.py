"""Trace headers: read from records, carried from input to output records by processors."""

from __future__ import annotations

from khipu.tracing import (
    HEADER_MESSAGE_ID,
    HEADER_SAMPLING,
    HEADER_STREAM,
    HEADER_TRACE,
    TraceContext,
    carry_trace_headers,
)
from khipu.tracing.headers import HEADER_RESEND_HOP, HEADER_RESEND_ID, ResendMark, resend_mark, trace_context

TRACED = [(HEADER_TRACE, b"m-1 orders 12.5"), ("other", b"x")]
OLDER = [(HEADER_MESSAGE_ID, b"m-1"), (HEADER_STREAM, b"orders"), (HEADER_SAMPLING, b"12.5"), ("other", b"x")]


def test_context_is_read_from_the_trace_header_and_from_the_three_older_headers() -> None:
    for headers in (TRACED, OLDER):
        assert trace_context(headers) == TraceContext("m-1", "orders", 12.5)
        assert trace_context(dict(headers)) == TraceContext("m-1", "orders", 12.5)


def test_record_without_or_with_incomplete_trace_headers_is_untraced() -> None:
    assert trace_context(None) is None
    assert trace_context([("other", b"x")]) is None
    assert trace_context([(HEADER_MESSAGE_ID, b"m-1")]) is None  # no stream: cannot be attributed
    assert trace_context([(HEADER_MESSAGE_ID, b"\xff\xfe"), (HEADER_STREAM, b"s")]) is None


def test_unreadable_sampling_falls_back_to_full_sampling_rather_than_failing_the_app() -> None:
    context = trace_context([(HEADER_MESSAGE_ID, b"m"), (HEADER_STREAM, b"s"), (HEADER_SAMPLING, b"lots")])
    assert context is not None and context.sampling_percent == 100.0


def test_carried_headers_keep_the_outputs_own_headers_and_add_the_inputs_trace_context() -> None:
    for source in (TRACED, OLDER):
        stale = [("content-type", b"json"), (HEADER_MESSAGE_ID, b"stale"), (HEADER_TRACE, b"stale s 1.0")]
        out = carry_trace_headers(source, stale)
        assert ("content-type", b"json") in out
        assert trace_context(out) == TraceContext("m-1", "orders", 12.5)
        assert [name for name, _ in out] == ["content-type", HEADER_TRACE]  # written as one header, whatever it read


def test_untraced_input_adds_nothing() -> None:
    assert carry_trace_headers([("other", b"x")], {"content-type": b"json"}) == [("content-type", b"json")]


def test_context_round_trips_through_headers() -> None:
    context = TraceContext("id-7", "payments", 0.5)
    assert trace_context(context.as_headers()) == context


def test_a_resend_mark_round_trips_and_is_never_carried_on_by_a_processor() -> None:
    mark = ResendMark("r1-ab", "local/out -> s1", "s1")
    resent = [*TRACED, *mark.as_headers()]
    assert resend_mark(resent) == mark
    assert resend_mark(ResendMark("r2-cd", "proc -> local/out", None).as_headers()) == ResendMark(
        "r2-cd", "proc -> local/out", None
    )
    out = carry_trace_headers(resent, resent)  # a processor copying its input's headers whole
    assert resend_mark(out) is None and trace_context(out) == trace_context(TRACED)


def test_an_incomplete_resend_mark_is_an_ordinary_record() -> None:
    assert resend_mark([(HEADER_RESEND_ID, b"r1-ab")]) is None
    assert resend_mark([(HEADER_RESEND_HOP, b"local/out -> s1")]) is None
    assert resend_mark(None) is None
