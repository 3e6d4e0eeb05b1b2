"""The ground-truth ledger: what the demo really did to every message, independent of tracing.

Components append events (JSON lines) as they act; :func:`build_truth` folds them into one
:class:`HopTruth` per (message id, hop): how often the hop really happened, which faults were
injected there, and how many traces of it really reached the trace channel.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from khipu.files import create_owner_only
from khipu.registry.model import HopKind

LEDGER_EVENTS = ("run", "written", "received", "skipped", "rewound", "dropped", "delayed", "trace_dropped")


class LedgerError(ValueError):
    """A ledger line could not be read."""


class LedgerWriter:
    """Appends events to a JSON-lines file; safe to call from several threads."""

    def __init__(self, path: Path) -> None:
        create_owner_only(path)  # the ground truth names every message of the demo's streams
        self.path = path
        self._lock = threading.Lock()
        self._file: IO[str] = open(path, "a", encoding="utf-8")

    def append(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


def read_ledger(path: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """All events of the ledger (of one run when ``run_id`` is given)."""
    events = []
    current_run: str | None = None
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LedgerError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(event, dict) or event.get("event") not in LEDGER_EVENTS:
                raise LedgerError(f"{path}:{number}: expected an event object with 'event' in {LEDGER_EVENTS}")
            if event["event"] == "run":
                current_run = event.get("run_id")
            if run_id is None or current_run == run_id:
                events.append(event)
    return events


@dataclass(frozen=True, slots=True)
class HopTruth:
    message_id: str
    hop: str
    kind: HopKind
    count: int  # times the hop really happened: acknowledged writes, or records the group's app received
    faults: frozenset[str]
    traces: int  # traces of this hop that really reached the trace channel
    source: bool = False  # the source's write (the demo's first hop); a processor's write and reads: False
    # a read hop: whether two of its traces that reached the channel name one offset (the id read again there);
    # None: not known (a ledger whose lost traces do not say where they were)
    reread_traced: bool | None = None


@dataclass(frozen=True, slots=True)
class MessageTruth:
    message_id: str
    sampled: bool
    hops: Mapping[str, HopTruth] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroundTruth:
    messages: Mapping[str, MessageTruth]
    # (message id, read hop) -> receipts of records Khipu resent: what the resend delivered, apart from the
    # hop's original truth (which stays what happened to the message the first time)
    resent_receipts: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def rows(self) -> Iterator[HopTruth]:
        for message in self.messages.values():
            yield from message.hops.values()

    def expected_trace_counts(self) -> Counter[tuple[str, str]]:
        """How many traces per (hop id, trace type) the trace topic must hold."""
        counts: Counter[tuple[str, str]] = Counter()
        for row in self.rows():
            if row.traces:
                counts[(row.hop, "SENT" if row.kind is HopKind.WRITE else "RECEIVED")] += row.traces
        return counts

    def fault_counts(self) -> Counter[str]:
        """Number of (message, hop) pairs each fault struck."""
        return Counter(fault for row in self.rows() for fault in row.faults)

    def hop_summary(self) -> dict[str, dict[str, int]]:
        """Per hop: messages that passed it, total passes, traces, and messages struck by each fault."""
        summary: dict[str, dict[str, int]] = {}
        for row in self.rows():
            entry = summary.setdefault(row.hop, {"messages": 0, "passes": 0, "traces": 0})
            entry["messages"] += 1 if row.count else 0
            entry["passes"] += row.count
            entry["traces"] += row.traces
            for fault in row.faults:
                entry[fault] = entry.get(fault, 0) + 1
        return summary


def build_truth(events: Iterable[Mapping[str, Any]]) -> GroundTruth:
    """Fold ledger events into the truth per (message, hop). Pure: no I/O."""
    events = list(events)
    sampled: dict[str, bool] = {}
    counts: Counter[tuple[str, str]] = Counter()
    kinds: dict[tuple[str, str], HopKind] = {}
    faults: dict[tuple[str, str], set[str]] = {}
    lost_traces: Counter[tuple[str, str]] = Counter()
    at_offset: dict[tuple[str, int, int], str] = {}  # (topic, partition, offset) -> message id
    resent: Counter[tuple[str, str]] = Counter()
    sources: set[tuple[str, str]] = set()
    read_at: Counter[tuple[str, str, int, int]] = Counter()  # (message, hop, partition, offset) -> receipts
    lost_at: Counter[tuple[str, str, int, int]] = Counter()  # ... -> traces lost there
    unplaced: set[tuple[str, str]] = set()  # hops with a lost trace whose position the ledger does not say

    for event in events:
        if event["event"] == "written":
            key = (event["message_id"], event["hop"])
            counts[key] += 1
            kinds[key] = HopKind.WRITE
            if event.get("source"):
                sources.add(key)
                sampled[event["message_id"]] = sampled.get(event["message_id"], False) or bool(event["sampled"])
            at_offset[(event["topic"], event["partition"], event["offset"])] = event["message_id"]
            if event.get("fault"):
                faults.setdefault(key, set()).add(event["fault"])

    for event in events:
        kind = event["event"]
        if kind == "received" and event.get("resend_id"):
            resent[(event["message_id"], event["hop"])] += 1
        elif kind == "received":
            key = (event["message_id"], event["hop"])
            counts[key] += 1
            kinds[key] = HopKind.READ
            read_at[(*key, event["partition"], event["offset"])] += 1
        elif kind in ("skipped", "rewound"):
            for offset in range(event["from_offset"], event["to_offset"]):
                message_id = at_offset.get((event["topic"], event["partition"], offset))
                if message_id is not None:
                    key = (message_id, event["hop"])
                    kinds[key] = HopKind.READ
                    faults.setdefault(key, set()).add(event["fault"])
        elif kind in ("dropped", "delayed"):
            key = (event["message_id"], event["hop"])
            kinds[key] = HopKind.WRITE
            faults.setdefault(key, set()).add(event["fault"])
        elif kind == "trace_dropped":
            lost_traces[(event["message_id"], event["hop"])] += 1
            if event.get("offset") is None:
                unplaced.add((event["message_id"], event["hop"]))
            else:
                lost_at[(event["message_id"], event["hop"], event["partition"], event["offset"])] += 1

    reread_traced = {at[:2] for at, n in read_at.items() if n - lost_at[at] > 1}  # two traces of one offset arrived
    rows: dict[str, dict[str, HopTruth]] = {}
    for key, kind in kinds.items():
        message_id, hop = key
        if message_id not in sampled:
            continue  # a record of another run, re-read by a rewind: not this run's truth
        traced = counts[key] if sampled[message_id] else 0
        hop_faults = set(faults.get(key, ()))
        if lost_traces[key]:
            hop_faults.add("trace_loss")
        reread: bool | None = None
        if kind is HopKind.READ and sampled[message_id] and key not in unplaced:
            reread = key in reread_traced
        rows.setdefault(message_id, {})[hop] = HopTruth(
            message_id=message_id,
            hop=hop,
            kind=kind,
            count=counts[key],
            faults=frozenset(hop_faults),
            traces=max(0, traced - lost_traces[key]),
            source=key in sources,
            reread_traced=reread,
        )
    return GroundTruth(
        {mid: MessageTruth(mid, sampled[mid], rows.get(mid, {})) for mid in sampled},
        {key: n for key, n in resent.items() if key[0] in sampled},
    )
