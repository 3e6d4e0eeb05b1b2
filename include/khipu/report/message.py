"""One message laid out along its stream's route: every hop with its traces, its verdict and how it changed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from khipu.registry.model import Hop, Route, Stream, TopicRef
from khipu.store.verdicts import VERDICT_COLUMNS
from khipu.trace.archive import ArchivedTrace
from khipu.verdicts.model import KAFKA_SEMANTICS_KINDS, LOSS_KINDS, VerdictKind

VERDICT_FIELDS = tuple(c for c in VERDICT_COLUMNS if c not in ("stream", "hop_kind", "topic"))  # the hop names those
HISTORY_FIELDS = ("at_ms", "from_verdict", "to_verdict", "cause", "decided_by", "reason")


@dataclass(frozen=True, slots=True)
class TraceLine:
    type: str  # SENT | RECEIVED
    location: str
    topic: str  # cluster/topic
    partition: int | None
    offset: int | None
    group: str | None
    at_ms: int
    emitter_id: str


@dataclass(frozen=True, slots=True)
class HopLine:
    hop: str
    hop_kind: str  # write | read | unknown
    on_route: bool  # False: a hop the traces or verdicts name that the stream's route does not
    verdict: dict[str, Any] | None  # the stored verdict's fields; None: none yet
    traces: tuple[TraceLine, ...] = field(default_factory=tuple)
    history: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    not_reached: str | None = None  # no verdict because the message never got here: "not reached: lost at <hop>"
    decided_ms: int | None = None  # when its verdict became what it is (its last change); None: no verdict
    first_decided_ms: int | None = None  # when it was first judged (the verdict's decided_ms, its metrics minute)


@dataclass(frozen=True, slots=True)
class MessageReport:
    message_id: str
    stream: str | None
    attributes: dict[str, str]  # recovery attributes, from its traces
    hops: tuple[HopLine, ...]
    resends: list[dict[str, Any]] = field(default_factory=list)  # the resend ledger's attempts for its losses
    verdicts_note: str | None = None  # why archived verdicts may be missing (the verdict archive's search)

    @property
    def found(self) -> bool:
        return any(hop.verdict is not None or hop.traces for hop in self.hops)


# a verdict that ends the message's way at its hop (the hops after it are never reached), in words
ENDS_ITS_WAY = {
    **{kind.value: "lost" for kind in (*LOSS_KINDS, VerdictKind.UNRECOVERABLE)},
    **{kind.value: kind.value.lower() for kind in KAFKA_SEMANTICS_KINDS},
}


def why_not_reached(route: Route, hop: Hop, kinds: Mapping[str, str], seen: frozenset[Hop] = frozenset()) -> str | None:
    """Why a hop of the route has no verdict, when a hop before it ended the message's way there:
    ``not reached: lost at <hop>`` (or aborted, superseded); None when nothing before it did."""
    for before in route.feeders_of(hop):
        if before in seen:
            continue
        kind = kinds.get(before.id)
        if kind in ENDS_ITS_WAY:
            return f"not reached: {ENDS_ITS_WAY[kind]} at {before.id}"
        if kind is None:
            upstream = why_not_reached(route, before, kinds, seen | {hop})
            if upstream is not None:
                return upstream
    return None


def decision_times(
    verdict: Mapping[str, Any] | None, history: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], int | None]:
    """A hop's history told in decision times, oldest first, and when its verdict became what it is.

    A verdict keeps the time it was first judged (``decided_ms``: the detector's moment of judgement on its
    executors, the minute its figures count it in); the history keeps each change. The detector's writer stores a
    batch seconds after it was judged, and the history line of a first decision it writes carries the writer's
    clock (:func:`khipu.verdicts.book.history_entry`), where the verdict archive's carries ``decided_ms``
    (:func:`khipu.verdicts.read.with_first_decisions`). One decision is shown at one time: the first decision at
    ``decided_ms``; every later change at its own time. The verdict is what it is since its last change to it."""
    entries = sorted((dict(entry) for entry in history), key=lambda e: int(e["at_ms"]))
    if verdict is None or verdict.get("decided_ms") is None:
        return entries, None
    first_ms = int(verdict["decided_ms"])
    if entries and entries[0].get("from_verdict") is None:
        entries[0]["at_ms"] = first_ms
    to_it = [int(e["at_ms"]) for e in entries if e.get("to_verdict") == verdict.get("verdict")]
    return entries, max(to_it, default=first_ms)


def trace_hop(trace: ArchivedTrace) -> Hop:
    topic = TopicRef(trace.cluster, trace.topic)
    if trace.type == "SENT":
        return Hop.write(trace.location, topic)
    return Hop.read(topic, trace.group or "?")


def lay_out(
    message_id: str,
    stream: Stream | None,
    verdicts: Sequence[Mapping[str, Any]],
    history: Iterable[Mapping[str, Any]],
    traces: Sequence[ArchivedTrace],
) -> MessageReport:
    """Every hop of the route in route order (with or without evidence), then any other hop seen."""
    route = [(hop.id, hop.kind.value) for hop in stream.route.hops] if stream is not None else []
    kinds = dict(route)
    by_hop_traces: dict[str, list[TraceLine]] = {}
    for trace in traces:
        hop = trace_hop(trace)
        kinds.setdefault(hop.id, hop.kind.value)
        by_hop_traces.setdefault(hop.id, []).append(
            TraceLine(
                trace.type,
                trace.location,
                f"{trace.cluster}/{trace.topic}",
                trace.partition,
                trace.offset,
                trace.group,
                trace.timestamp_ms,
                trace.emitter_id,
            )
        )
    by_hop_verdict = {str(row["hop"]): row for row in verdicts}
    for hop_id, row in by_hop_verdict.items():
        kinds.setdefault(hop_id, str(row.get("hop_kind") or "unknown"))
    by_hop_history: dict[str, list[dict[str, Any]]] = {}
    for change in history:
        by_hop_history.setdefault(str(change["hop"]), []).append({name: change.get(name) for name in HISTORY_FIELDS})
    on_route = {hop_id for hop_id, _ in route}
    ordered = [hop_id for hop_id, _ in route] + sorted(set(kinds) - on_route)
    decided = {hop_id: str(row["verdict"]) for hop_id, row in by_hop_verdict.items()}
    route_hops = {hop.id: hop for hop in stream.route.hops} if stream is not None else {}
    unreached = {
        hop_id: why_not_reached(stream.route, hop, decided)
        for hop_id, hop in route_hops.items()
        if stream is not None and hop_id not in decided
    }
    attributes: dict[str, str] = {}
    for trace in traces:
        attributes.update(trace.attributes)
    told = {hop_id: decision_times(by_hop_verdict.get(hop_id), by_hop_history.get(hop_id, ())) for hop_id in ordered}
    return MessageReport(
        message_id=message_id,
        stream=stream.name if stream is not None else (str(verdicts[0]["stream"]) if verdicts else None),
        attributes=attributes,
        hops=tuple(
            HopLine(
                hop=hop_id,
                hop_kind=kinds[hop_id],
                on_route=hop_id in on_route,
                verdict=(
                    {name: by_hop_verdict[hop_id].get(name) for name in VERDICT_FIELDS}
                    if hop_id in by_hop_verdict
                    else None
                ),
                traces=tuple(by_hop_traces.get(hop_id, ())),
                history=tuple(told[hop_id][0]),
                not_reached=unreached.get(hop_id),
                decided_ms=told[hop_id][1],
                first_decided_ms=by_hop_verdict[hop_id].get("decided_ms") if hop_id in by_hop_verdict else None,
            )
            for hop_id in ordered
        ),
    )
