"""Accuracy scoreboard: Khipu's answers beside three designs it improves on, on the same traces and truth.

The baselines are computed from the same archived traces Khipu reads:

- **fixed timeout** (the simplest tracer): a read hop is LOST when no RECEIVED follows the SENT within
  ``timeout_ms``; a processor's write hop is LOST when no SENT on its output follows its RECEIVED within
  it. Counts give DELIVERED / DUPLICATE (rewind when an offset was read twice, retry otherwise).
- **session window per message id** (the design Inca rejected): a message's traces are grouped into
  sessions closed by ``gap_ms`` of silence; each session is judged alone as above, and the first
  answer for a hop is the one that counts (it is what an alert would have said).
- **count-per-window audit** (Chaperone, the ZIO QoS test): per hop and window of the message's
  write time, records in vs. records out; a deficit is that many losses, an excess that many
  duplicates, with no identities and no causes. Scored by the best matching the counts allow.

Scored per (message, hop) against :func:`khipu.demo.score.expected_verdicts`. A final verdict counts by
what its evidence says (:func:`khipu.demo.score.said`). Precision counts every answer about a message of the
truth, on hops the truth expects no verdict for too (:func:`khipu.demo.score.score`'s extra verdicts, e.g. a
LOST said of a hop downstream of a loss, which the message never reached).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from khipu.demo.ledger import GroundTruth
from khipu.demo.score import expected_verdicts, score
from khipu.registry.model import Hop, HopKind, Stream
from khipu.trace.model import Trace, TraceType

Key = tuple[str, str]  # (message id, hop id)
Answer = tuple[str, str | None]  # (verdict, cause)


@dataclass(frozen=True)
class Answers:
    """What a design said of each (message, hop), and when it first said something."""

    said: Mapping[Key, Answer]
    answered_ms: Mapping[Key, int]


@dataclass(frozen=True)
class ScoreRow:
    design: str
    loss_recall: float | None
    loss_precision: float | None
    duplicate_recall: float | None  # right kind and right cause
    duplicate_precision: float | None
    false_lost_late: int  # LOST said of a hop whose trace existed but came after the answer
    false_lost_trace_loss: int  # LOST said of a hop that happened, its trace lost
    # LOST said of a hop the truth expects no verdict for (None: a design without identities cannot say which)
    false_lost_unexpected: int | None
    unexpected_verdicts: int | None  # verdicts of any kind said of such hops (khipu.demo.score's extra)
    trace_lost_hops: int
    labelled_trace_lost: int  # of those, how many were said TRACE_LOST
    first_answer_p50_s: float | None
    first_answer_p95_s: float | None


def _judge(stream: Stream, traces: Sequence[Trace], window_ms: int) -> dict[str, tuple[Answer, int]]:
    """The fixed-timeout judgement of one message's traces: hop id -> (answer, when it could be given)."""
    answers: dict[str, tuple[Answer, int]] = {}
    sent = [t for t in traces if t.type is TraceType.SENT]
    received = [t for t in traces if t.type is TraceType.RECEIVED]
    for topic in {Hop.of_trace(t).topic for t in sent}:
        on_topic = [t for t in sent if Hop.of_trace(t).topic == topic]
        first_ms = min(t.timestamp_ms for t in on_topic)
        for writer in {Hop.of_trace(t) for t in on_topic}:
            offsets = {(t.partition, t.offset) for t in on_topic if Hop.of_trace(t) == writer}
            kind: Answer = ("DELIVERED", None) if len(offsets) == 1 else ("DUPLICATE", "producer_retry")
            answers[writer.id] = (kind, first_ms)
        for reader in stream.route.readers_of(topic):
            hop = Hop.read(topic, reader.group)
            got = [t for t in received if Hop.of_trace(t) == hop and t.timestamp_ms <= first_ms + window_ms]
            answers[hop.id] = (_reads(got), first_ms + window_ms)
    for processor in (c for c in stream.route.consumers if c.is_processor):
        reads = [t for t in received if t.group == processor.group]
        if not reads:
            continue
        first_ms = min(t.timestamp_ms for t in reads)
        for output in processor.writes:
            hop = Hop.write(processor.location, output)
            wrote = [t for t in sent if Hop.of_trace(t) == hop and t.timestamp_ms <= first_ms + window_ms]
            if not wrote:
                answers[hop.id] = (("LOST", None), first_ms + window_ms)
    return answers


def _reads(got: Sequence[Trace]) -> Answer:
    if not got:
        return "LOST", None
    if len(got) == 1:
        return "DELIVERED", None
    positions = Counter((t.partition, t.offset) for t in got)
    return "DUPLICATE", "rewind_replay" if max(positions.values()) > 1 else "producer_retry"


def fixed_timeout(stream: Stream, by_message: Mapping[str, Sequence[Trace]], timeout_ms: int) -> Answers:
    said: dict[Key, Answer] = {}
    at: dict[Key, int] = {}
    for message_id, traces in by_message.items():
        for hop, (answer, when) in _judge(stream, traces, timeout_ms).items():
            said[(message_id, hop)], at[(message_id, hop)] = answer, when
    return Answers(said, at)


def session_windows(stream: Stream, by_message: Mapping[str, Sequence[Trace]], gap_ms: int) -> Answers:
    said: dict[Key, Answer] = {}
    at: dict[Key, int] = {}
    for message_id, traces in by_message.items():
        ordered = sorted(traces, key=lambda t: t.timestamp_ms)
        sessions: list[list[Trace]] = []
        for trace in ordered:
            if sessions and trace.timestamp_ms - sessions[-1][-1].timestamp_ms <= gap_ms:
                sessions[-1].append(trace)
            else:
                sessions.append([trace])
        for session in sessions:
            closed_ms = session[-1].timestamp_ms + gap_ms
            for hop, (answer, _) in _judge(stream, session, closed_ms - session[0].timestamp_ms).items():
                key = (message_id, hop)
                if key not in said:  # the first answer is the one that alerted
                    said[key], at[key] = answer, closed_ms
    return Answers(said, at)


def traced_hops(by_message: Mapping[str, Sequence[Trace]]) -> set[Key]:
    """(message, hop) pairs with at least one trace in the archive."""
    return {(mid, Hop.of_trace(t).id) for mid, traces in by_message.items() for t in traces}


def first_trace_times(by_message: Mapping[str, Sequence[Trace]]) -> dict[str, int]:
    return {mid: min(t.timestamp_ms for t in traces) for mid, traces in by_message.items() if traces}


def score_answers(
    design: str, answers: Answers, truth: GroundTruth, first_trace_ms: Mapping[str, int], traced: set[Key]
) -> ScoreRow:
    """``traced``: the (message, hop) pairs with a trace in the archive: a false LOST there was said before
    the trace came (late); a false LOST of a hop with no trace at all is trace loss."""
    expected = expected_verdicts(truth)
    said = {key: answers.said[key] for key in expected if key in answers.said}
    rows = ({"message_id": m, "hop": h, "verdict": v, "cause": c} for (m, h), (v, c) in answers.said.items())
    unexpected = score(truth, rows).extra  # said of hops the truth expects no verdict for
    # precision weighs every answer about a message of the truth (as score() reads them), unexpected hops included
    judged = {key: answer for key, answer in answers.said.items() if key[0] in truth.messages}
    true_lost = {k for k, (v, _) in expected.items() if v == "LOST"}
    said_lost = {k for k, (v, _) in judged.items() if v == "LOST"}
    true_dup = {k: c for k, (v, c) in expected.items() if v == "DUPLICATE"}
    said_dup = {k: c for k, (v, c) in judged.items() if v == "DUPLICATE"}
    right_dup = {k for k, c in said_dup.items() if true_dup.get(k, "-") == c}
    trace_lost = {k for k, (v, _) in expected.items() if v == "TRACE_LOST"}
    false_lost = said_lost - true_lost
    delays = sorted(  # of read hops: whether the message got there (a write hop is known when written)
        (answers.answered_ms[k] - first_trace_ms[k[0]]) / 1000
        for k in said
        if k in answers.answered_ms and k[0] in first_trace_ms and truth.messages[k[0]].hops[k[1]].kind is HopKind.READ
    )
    return ScoreRow(
        design=design,
        loss_recall=_share(len(said_lost & true_lost), len(true_lost)),
        loss_precision=_share(len(said_lost & true_lost), len(said_lost)),
        duplicate_recall=_share(len(right_dup), len(true_dup)),
        duplicate_precision=_share(len(right_dup), len(said_dup)),
        false_lost_late=len(false_lost & traced),
        false_lost_trace_loss=len(false_lost & trace_lost),
        false_lost_unexpected=len(false_lost & unexpected.keys()),
        unexpected_verdicts=len(unexpected),
        trace_lost_hops=len(trace_lost),
        labelled_trace_lost=sum(1 for k in trace_lost if said.get(k, ("", None))[0] == "TRACE_LOST"),
        first_answer_p50_s=statistics.median(delays) if delays else None,
        first_answer_p95_s=delays[min(len(delays) - 1, round(0.95 * (len(delays) - 1)))] if delays else None,
    )


def window_audit(
    stream: Stream, by_message: Mapping[str, Sequence[Trace]], truth: GroundTruth, window_ms: int, lag_ms: int
) -> ScoreRow:
    """Counts per (hop, window of the message's first write) in and out; deficits are losses, excesses
    duplicates, matched as well as counts can be against the true ones in the same bucket."""
    expected = expected_verdicts(truth)
    bucket_of = {mid: min(t.timestamp_ms for t in ts) // window_ms for mid, ts in by_message.items() if ts}
    said_in: Counter[tuple[str, int]] = Counter()  # (hop, bucket) -> records that should have passed the hop
    seen: Counter[tuple[str, int]] = Counter()  # -> traces of the hop by the time the window is audited
    for message_id, traces in by_message.items():
        bucket = bucket_of.get(message_id)
        if bucket is None:
            continue
        hops = _judge(stream, traces, 10**12)  # which hops the message was headed for
        for hop in hops:
            said_in[(hop, bucket)] += 1
        audited_ms = (bucket + 1) * window_ms + lag_ms
        for trace in traces:
            if trace.timestamp_ms < audited_ms:
                seen[(Hop.of_trace(trace).id, bucket)] += 1
    true_lost: Counter[tuple[str, int]] = Counter()
    true_dup: Counter[tuple[str, int]] = Counter()
    trace_lost: Counter[tuple[str, int]] = Counter()
    for (message_id, hop), (verdict, _) in expected.items():
        bucket = bucket_of.get(message_id)
        if bucket is None:
            continue
        if verdict == "LOST":
            true_lost[(hop, bucket)] += 1
        elif verdict == "DUPLICATE":
            true_dup[(hop, bucket)] += 1
        elif verdict == "TRACE_LOST":
            trace_lost[(hop, bucket)] += 1
    deficit = {k: max(0, n - seen[k]) for k, n in said_in.items()}
    excess = {k: max(0, seen[k] - n) for k, n in said_in.items()}
    hit_lost = sum(min(d, true_lost[k]) for k, d in deficit.items())
    false_lost = {k: max(0, d - true_lost[k]) for k, d in deficit.items()}
    lag_s = (window_ms + lag_ms) / 1000
    return ScoreRow(
        design="count audit per window",
        loss_recall=_share(hit_lost, sum(true_lost.values())),
        loss_precision=_share(hit_lost, sum(deficit.values())),
        duplicate_recall=0.0 if sum(true_dup.values()) else None,  # no identities, so never the cause
        duplicate_precision=0.0 if sum(excess.values()) else None,
        false_lost_late=sum(max(0, f - trace_lost[k]) for k, f in false_lost.items()),
        false_lost_trace_loss=sum(min(f, trace_lost[k]) for k, f in false_lost.items()),
        false_lost_unexpected=None,  # its deficits count every hop the messages headed for (in its precision)
        unexpected_verdicts=None,
        trace_lost_hops=sum(trace_lost.values()),
        labelled_trace_lost=0,
        first_answer_p50_s=lag_s,
        first_answer_p95_s=lag_s,
    )


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def markdown(rows: Iterable[ScoreRow]) -> str:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f} %"

    def secs(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0f} s"

    def count(value: int | None) -> str:
        return "n/a" if value is None else str(value)

    lines = [
        "| design | loss recall | loss precision | duplicate recall (with cause) | duplicate precision "
        "| false LOST: late traces | false LOST: trace loss | false LOST: no verdict expected "
        "| verdicts on hops with no verdict expected | trace-lost hops labelled TRACE_LOST | first answer p50 / p95 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.design} | {pct(r.loss_recall)} | {pct(r.loss_precision)} | {pct(r.duplicate_recall)} "
            f"| {pct(r.duplicate_precision)} | {r.false_lost_late} | {r.false_lost_trace_loss} "
            f"| {count(r.false_lost_unexpected)} | {count(r.unexpected_verdicts)} "
            f"| {r.labelled_trace_lost} of {r.trace_lost_hops} | {secs(r.first_answer_p50_s)} / "
            f"{secs(r.first_answer_p95_s)} |"
        )
    return "\n".join(lines)
