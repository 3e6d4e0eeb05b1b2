"""One resend run: every confirmed loss a selection names, resent once, exactly once, or given up on.

For each CONFIRMED_LOST verdict the selection names (streams, hop, message ids, a time range), whose
stream's ``resend.mode`` the run may act on:

1. The attempt to make: the first; the one a killed run left *intended* (resumed: the ledger and the
   destination topic say whether its record already landed); the next, once the last one was produced
   ``wait_ms`` ago and the detector has not seen it arrive (the verdict would be RESENT), or failed.
2. Its plan (:func:`khipu.resend.plan.plan_resend`): the original's source, the destination, or why the
   loss is UNRECOVERABLE (also past ``max_attempts``).
3. The attempt, walked by :func:`khipu.resend.ledger.run_attempt`: the resent record carries the
   original's key, value and headers (or the recovery hook's payload with the message's trace headers),
   plus the resend id, the lost hop and, for a read hop, the one group that should take it.
4. An UNRECOVERABLE loss's verdict becomes UNRECOVERABLE, with its history; a RESENT verdict is the
   detector's to give, when the resent record's traces arrive.

A dry run plans and reports, and writes nothing (no ledger row, no record, no verdict). A hook that
cannot be imported or raises fails that attempt (recorded in the ledger, the loss stays
CONFIRMED_LOST) and the run goes on with the others. A cluster that does not answer leaves the
attempt *intended*: the next run finds out whether its record landed before producing anything.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import secrets
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from khipu.alerting.model import Alert, AlertState, Severity
from khipu.config import ResendSection, default, load
from khipu.errors import InvalidSetting
from khipu.kafka.admin import KafkaAdmin
from khipu.kafka.connection import KafkaConnection, KafkaUnavailable
from khipu.kafka.records import (
    StoredRecord,
    end_offset,
    find_by_header,
    log_start_offset,
    partition_count,
    produce_record,
    read_record,
    record_producer,
)
from khipu.registry.model import Registry, ResendMode, Stream, TopicRef, UnknownStreamError
from khipu.resend.ledger import BUSY, FAILED, PRODUCED, UNRECOVERABLE, Landed, Placed, run_attempt
from khipu.resend.plan import ResendPlan, SourceKind, plan_resend
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace.archive import HOUR_MS, hours_between, read_traces_in_hours
from khipu.tracing.headers import HEADER_RESEND_ID, RESEND_HEADERS, ResendMark, TraceContext
from khipu.verdicts.archive import VerdictArchive
from khipu.verdicts.book import VerdictBook, verdict_of
from khipu.verdicts.model import VerdictKind
from khipu.verdicts.read import verdicts_of
from khipu.verdicts.settle import Judge, settle

log = logging.getLogger(__name__)

WAIT_MS: int = default(ResendSection, "wait_ms")  # a produced attempt has this long to arrive before the next attempt
MAX_LOSSES_PER_RUN = 10_000

Hook = Callable[[str, Mapping[str, str]], bytes | str]


class ResendRequestError(ValueError):
    """A resend asked for something that does not exist or cannot be resent; nothing was written."""


class ResendSettingError(InvalidSetting):
    kind = "resend setting"


class HookFailed(RuntimeError):
    """The stream's recovery hook could not be imported, raised, or returned something that is not a payload."""


class SourceGone(RuntimeError):
    """The original left the log between planning and reading it."""


def wait_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``KHIPU_RESEND_WAIT_MS``: how long a produced attempt has to arrive before the next one
    (:class:`khipu.config.ResendSection`)."""
    return int(load(ResendSection, environ, ResendSettingError).wait_ms)


@dataclass(frozen=True, slots=True)
class ResendSelection:
    """Which confirmed losses a run considers (empty: all) and which streams' ``resend.mode`` it acts for."""

    modes: frozenset[ResendMode] = frozenset({ResendMode.AUTO})
    streams: tuple[str, ...] = ()
    hop: str | None = None
    message_ids: tuple[str, ...] = ()
    since_ms: int | None = None  # the loss was decided at or after
    until_ms: int | None = None  # ... and before
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class ResendOutcome:
    message_id: str
    stream: str
    hop: str
    attempt: int
    resend_id: str
    state: str  # produced | unrecoverable | failed | waiting | busy | would_resend | would_give_up | skipped
    source: str
    destination: str
    detail: str

    def line(self) -> str:
        return f"{self.state:<13} {self.message_id} at {self.hop} (attempt {self.attempt}): {self.detail}"


@dataclass(slots=True)
class ResendRun:
    dry_run: bool
    outcomes: list[ResendOutcome] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(o.state for o in self.outcomes).items()))

    def summary(self) -> str:
        counts = ", ".join(f"{n} {state}" for state, n in self.counts().items()) or "nothing to resend"
        return f"{'dry run: ' if self.dry_run else ''}{len(self.outcomes)} confirmed losses considered: {counts}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "summary": self.summary(),
            "counts": self.counts(),
            "outcomes": [dataclasses.asdict(o) for o in self.outcomes],
        }


def import_hook(name: str) -> Hook:
    """The callable ``module:function`` names (HookFailed, naming what is missing, when it cannot be imported)."""
    module_name, _, function_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import runs the owner's module: any error is the hook's
        raise HookFailed(f"recovery hook {name} cannot be imported: {type(exc).__name__}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise HookFailed(f"recovery hook {name}: module {module_name} has no callable {function_name!r}")
    return function  # type: ignore[no-any-return]


def hook_payload(name: str, message_id: str, attributes: Mapping[str, str]) -> bytes:
    """What the hook returns for the message, as bytes (HookFailed on any error, naming the hook)."""
    hook = import_hook(name)
    try:
        payload = hook(message_id, dict(attributes))
    except Exception as exc:  # the owner's code: whatever it raises fails this attempt only
        raise HookFailed(f"recovery hook {name} raised {type(exc).__name__}: {exc}") from None
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, bytes):
        return payload
    raise HookFailed(f"recovery hook {name} returned {type(payload).__name__}, expected bytes or str")


class Resender:
    """Runs resends against a store, the registry and the clusters' connections (see the module doc)."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        connections: Mapping[str, KafkaConnection],
        now_ms: Callable[[], int],
        archive_dir: Location | Path | None = None,
        wait_ms: int = WAIT_MS,
        verdict_archive_dir: Location | Path | None = None,
    ) -> None:
        self.store, self.registry, self.connections = store, registry, connections
        self.now_ms, self.wait_ms = now_ms, wait_ms
        # the archives: each a local folder or an object-store prefix
        self.archive_dir = Location.of(archive_dir, "trace archive") if archive_dir is not None else None
        # a write-hop loss in a processor is resent from the record its read hop DELIVERED: archived, often
        self.verdict_archive = VerdictArchive(verdict_archive_dir, store) if verdict_archive_dir is not None else None
        self.book = VerdictBook(store.verdicts)
        self._producers: dict[str, Any] = {}  # cluster -> one producer for the run's records
        self._partitions: dict[tuple[str, str], int] = {}  # (cluster, topic) -> partition count
        self._admins: dict[str, KafkaAdmin] = {}  # cluster -> one admin client for the run's offset checks
        self.owner = f"resend-{os.getpid()}-{secrets.token_hex(4)}"  # this run, as the ledger's claims name it

    # -- what to resend ---------------------------------------------------------------------------------------

    def losses(self, selection: ResendSelection) -> list[dict[str, Any]]:
        """The confirmed losses the selection names (at most MAX_LOSSES_PER_RUN per stream, the newest: those
        resent leave the list, the next run takes older ones), oldest first; ResendRequestError (nothing
        written) for an unknown stream or hop, or a message id that is not a confirmed loss there."""
        streams = self._streams(selection)
        if selection.hop is not None and not any(selection.hop in {h.id for h in s.route.hops} for s in streams):
            known = sorted({h.id for s in streams for h in s.route.hops})
            raise ResendRequestError(f"hop {selection.hop!r} is not on the route: known hops are {', '.join(known)}")
        names = {s.name for s in streams}
        if selection.message_ids:
            rows = self._verdicts_of(selection.message_ids)
            chosen = [r for r in rows if r["stream"] in names and (selection.hop is None or r["hop"] == selection.hop)]
            for message_id in selection.message_ids:
                mine = [r for r in chosen if r["message_id"] == message_id]
                if not mine:
                    raise ResendRequestError(f"message {message_id!r}: no verdict of it here{self._where(selection)}")
                if not any(r["verdict"] == VerdictKind.CONFIRMED_LOST for r in mine):
                    said = ", ".join(sorted(f"{r['hop']}: {r['verdict']}" for r in mine))
                    raise ResendRequestError(
                        f"message {message_id!r} is not confirmed lost ({said}): nothing to resend"
                    )
            losses = [r for r in chosen if r["verdict"] == VerdictKind.CONFIRMED_LOST]
            if selection.since_ms is not None:
                losses = [r for r in losses if int(r["decided_ms"]) >= selection.since_ms]
            if selection.until_ms is not None:
                losses = [r for r in losses if int(r["decided_ms"]) < selection.until_ms]
        else:
            losses = [
                row
                for name in sorted(names)
                for row in self.store.verdicts.page(
                    verdicts=[VerdictKind.CONFIRMED_LOST.value],
                    stream=name,
                    hop=selection.hop,
                    since_ms=selection.since_ms,
                    until_ms=selection.until_ms,
                    limit=MAX_LOSSES_PER_RUN,
                )
            ]
        return sorted(losses, key=lambda r: (int(r["decided_ms"]), r["message_id"], r["hop"]))

    def _verdicts_of(self, message_ids: Collection[str]) -> list[dict[str, Any]]:
        """Every verdict of these messages: the store's, and the verdict archive's where it has none."""
        found = verdicts_of(self.store.verdicts, self.verdict_archive, message_ids)
        if found.note:
            log.warning("resend: %s", found.note)
        return found.rows

    def _streams(self, selection: ResendSelection) -> list[Stream]:
        for name in selection.streams:
            if name not in self.registry.streams:
                raise ResendRequestError(str(UnknownStreamError(name, tuple(self.registry.streams))))
        names = selection.streams or tuple(self.registry.streams)
        streams = [self.registry.streams[n] for n in names]
        if selection.streams:
            for stream in streams:
                if stream.resend.mode not in selection.modes:
                    allowed = ", ".join(sorted(m.value for m in selection.modes))
                    raise ResendRequestError(
                        f"stream {stream.name!r} has resend.mode {stream.resend.mode.value}: this run resends "
                        f"streams whose mode is {allowed}"
                    )
        return [s for s in streams if s.resend.mode in selection.modes]

    @staticmethod
    def _where(selection: ResendSelection) -> str:
        parts = ([f"stream {', '.join(selection.streams)}"] if selection.streams else []) + (
            [f"hop {selection.hop}"] if selection.hop else []
        )
        return f" ({'; '.join(parts)})" if parts else ""

    # -- the run ----------------------------------------------------------------------------------------------

    def run(self, selection: ResendSelection, progress: Callable[[str], None] = log.info) -> ResendRun:
        losses = self.losses(selection)
        run = ResendRun(selection.dry_run)
        progress(f"{len(losses)} confirmed losses to consider{' (dry run: nothing is written)' * selection.dry_run}")
        verdicts: dict[str, list[dict[str, Any]]] = {}
        for row in self._verdicts_of({r["message_id"] for r in losses}):
            verdicts.setdefault(row["message_id"], []).append(row)
        for number, loss in enumerate(losses, 1):
            outcome = self.resend_one(loss, verdicts.get(loss["message_id"], []), selection.dry_run)
            run.outcomes.append(outcome)
            progress(f"[{number}/{len(losses)}] {outcome.line()}")
        progress(run.summary())
        return run

    def resend_one(
        self, loss: Mapping[str, Any], message_verdicts: Sequence[Mapping[str, Any]], dry_run: bool
    ) -> ResendOutcome:
        stream = self.registry.streams[str(loss["stream"])]
        attempts = self.store.resends.attempts(str(loss["message_id"]), str(loss["hop"]))
        last = attempts[-1] if attempts else None
        produced_before = sum(1 for a in attempts if a["state"] == PRODUCED)
        missing = sorted({hop.topic.cluster for hop in stream.route.hops} - set(self.connections))
        if missing:
            known = ", ".join(self.connections)
            why = f"no connection for cluster {', '.join(missing)}: nothing written (known: {known})"
            return self._outcome(loss, last["attempt"] if last else 1, "", "failed", last, why)
        attempt = 1
        if last is not None:
            attempt = int(last["attempt"])
            waiting = self._still_waiting(stream, last)
            if waiting is not None:
                return self._outcome(loss, attempt, str(last["resend_id"]), "waiting", last, waiting)
            if last["state"] in (PRODUCED, FAILED):
                attempt += 1
        try:
            plan = plan_resend(
                loss, message_verdicts, stream, self._log_start, attempt, stream.resend.hook, produced_before
            )
        except KafkaException as exc:  # an outage must not pass for a record that left the log
            why = f"the cluster did not answer where the original is: {exc.args[0] if exc.args else exc}"
            return self._outcome(loss, attempt, "", "failed", last, why)
        if dry_run:
            state = "would_resend" if plan.recoverable else "would_give_up"
            return self._outcome(loss, attempt, plan.resend_id, state, None, plan.reason, plan)
        try:
            done = run_attempt(
                plan, self.store.resends, self._place, self._find_landed, self._produce, self.now_ms, self.owner
            )
        except (HookFailed, SourceGone) as exc:  # nothing produced: the next run tries again (not counted)
            self.store.resends.mark(plan.resend_id, FAILED, self.now_ms(), str(exc))
            return self._outcome(loss, attempt, plan.resend_id, "failed", None, str(exc), plan)
        except KafkaException as exc:  # whether it landed is not known: the intent stays, the next run finds out
            why = f"left intended, the cluster did not answer: {exc.args[0] if exc.args else exc}"
            return self._outcome(loss, attempt, plan.resend_id, "failed", None, why, plan)
        if done.state == BUSY:
            return self._outcome(loss, attempt, plan.resend_id, "busy", None, "another run holds this attempt", plan)
        if done.state == UNRECOVERABLE:
            reason = str((self.store.resends.entry(plan.resend_id) or {}).get("error") or plan.reason)
            stored = self._give_up(loss, reason)
            if stored != VerdictKind.UNRECOVERABLE:  # the detector saw a copy arrive meanwhile: that stands
                return self._outcome(loss, attempt, plan.resend_id, "skipped", None, f"the verdict is {stored} now")
            return self._outcome(loss, attempt, plan.resend_id, "unrecoverable", None, reason, plan)
        if done.state == PRODUCED and done.landed is not None:
            again = "" if done.produced_now else " (found there: an earlier run produced it)"
            detail = f"{plan.reason}; landed at [{done.landed[0]}]@{done.landed[1]}{again}"
            return self._outcome(loss, attempt, plan.resend_id, "produced", None, detail, plan)
        entry = self.store.resends.entry(plan.resend_id) or {}
        return self._outcome(
            loss, attempt, plan.resend_id, str(done.state), entry, str(entry.get("error") or plan.reason), plan
        )

    def _still_waiting(self, stream: Stream, last: Mapping[str, Any]) -> str | None:
        """Why the next attempt must wait, or None: a produced copy has ``wait_ms`` to arrive, and is never
        followed by another while a group it is for has not read past it (a second copy would reach it too);
        a failed attempt (nothing produced) is tried again after ``wait_ms``."""
        young = self.now_ms() - int(last["updated_ms"]) < self.wait_ms
        if last["state"] == FAILED:
            return f"the last attempt failed ({last['error']}); tried again after the wait" if young else None
        if last["state"] != PRODUCED:
            return None
        cluster, _, topic = str(last["destination"]).partition("/")
        partition, offset = int(last["produced_partition"]), int(last["produced_offset"])
        where = f"{last['destination']}[{partition}]@{offset}"
        if young:
            return f"produced to {where}, waiting for its traces"
        groups = [str(last["target_group"])] if last["target_group"] else []
        if not groups:
            groups = [c.group for c in stream.route.readers_of(TopicRef(cluster, topic))]
        try:
            admin = self._admins.get(cluster) or self._admins.setdefault(cluster, KafkaAdmin(self._connection(cluster)))
            position = (topic, partition)
            behind = [g for g in groups if admin.committed_offsets(g, [position]).get(position, 0) <= offset]
        except (KafkaException, KafkaUnavailable) as exc:
            return f"produced to {where}; whether {', '.join(groups)} read it is not known ({exc}): no second copy"
        if behind:
            return f"produced to {where}; {', '.join(behind)} has not read past it yet, so no second copy"
        return None

    def _outcome(
        self,
        loss: Mapping[str, Any],
        attempt: int,
        resend_id: str,
        state: str,
        entry: Mapping[str, Any] | None,
        detail: str,
        plan: ResendPlan | None = None,
    ) -> ResendOutcome:
        if plan is not None:
            source = str(plan.source_position) if plan.source_position else plan.source.value
            destination = str(plan.destination) if plan.destination else ""
            if plan.target_group:
                destination += f" for {plan.target_group} only"
        else:
            source = str((entry or {}).get("source_position") or (entry or {}).get("source_kind") or "")
            destination = str((entry or {}).get("destination") or "")
        return ResendOutcome(
            str(loss["message_id"]),
            str(loss["stream"]),
            str(loss["hop"]),
            attempt,
            resend_id,
            state,
            source,
            destination,
            detail,
        )

    def _give_up(self, loss: Mapping[str, Any], reason: str) -> VerdictKind:
        """The loss's verdict UNRECOVERABLE (with its history), unless it changed meanwhile: the verdict stored."""
        stored = verdict_of(loss)
        judged = dataclasses.replace(
            stored, kind=VerdictKind.UNRECOVERABLE, decided_by=Judge.RESEND.value, detail=reason
        )
        change = settle(stored, judged)
        if change is not None and not self.book.apply([change], self.now_ms()):
            return VerdictKind.UNRECOVERABLE
        now = self.book.stored_verdicts([stored.message_id]).get(stored.message_id, {}).get(stored.hop)
        return now.kind if now is not None else stored.kind

    # -- Kafka ------------------------------------------------------------------------------------------------

    def _connection(self, cluster: str) -> KafkaConnection:
        connection = self.connections.get(cluster)
        if connection is None:
            raise KafkaException(
                f"no connection for cluster {cluster!r}: known are {', '.join(sorted(self.connections))}"
            )
        return connection

    def _log_start(self, cluster: str, topic: str, partition: int) -> int | None:
        return log_start_offset(self._connection(cluster), topic, partition)

    def _place(self, plan: ResendPlan) -> Placed:
        """The copy's partition: the original's partition number, where the destination has it (for a read hop
        the very partition it was skipped in; for a processor drop the input's partition number, which keeps
        a key's order when both topics are partitioned alike), else a stable hash of the message id; and that
        partition's end now, where the search for it starts."""
        assert plan.destination is not None
        connection = self._connection(plan.destination.cluster)
        key = (plan.destination.cluster, plan.destination.topic)
        partitions = self._partitions.get(key) or self._partitions.setdefault(
            key, partition_count(connection, plan.destination.topic)
        )
        source = plan.source_position
        if source is not None and source.partition < partitions:
            partition = source.partition
        else:
            partition = zlib.crc32(plan.message_id.encode()) % partitions
        return partition, end_offset(connection, plan.destination.topic, partition)

    def _find_landed(self, resend_id: str, partition: int, from_offset: int) -> Landed | None:
        entry = self.store.resends.entry(resend_id)
        assert entry is not None and entry["destination"]
        cluster, _, topic = str(entry["destination"]).partition("/")
        offset = find_by_header(
            self._connection(cluster), topic, partition, from_offset, HEADER_RESEND_ID, resend_id.encode()
        )
        return None if offset is None else (partition, offset)

    def _produce(self, plan: ResendPlan, partition: int) -> Landed:
        assert plan.destination is not None
        intended = (self.store.resends.entry(plan.resend_id) or {}).get("destination")
        if intended != str(plan.destination):  # the route changed since a killed run wrote the intent
            raise SourceGone(
                f"the intent names {intended}, the route now {plan.destination}: the next attempt plans again"
            )
        record = self._original(plan)
        mark = ResendMark(plan.resend_id, plan.hop, plan.target_group)
        headers = [(n, v) for n, v in record.headers if n not in RESEND_HEADERS] + list(mark.as_headers())
        resent = StoredRecord(record.key, record.value, headers)
        cluster = plan.destination.cluster
        connection = self._connection(cluster)
        producer = self._producers.get(cluster) or self._producers.setdefault(cluster, record_producer(connection))
        return partition, produce_record(connection, plan.destination.topic, partition, resent, producer=producer)

    def _original(self, plan: ResendPlan) -> StoredRecord:
        stream = self.registry.streams[plan.stream]
        if plan.source is SourceKind.TOPIC:
            assert plan.source_position is not None
            where = plan.source_position
            connection = self._connection(where.cluster)
            record, why = read_record(connection, where.topic, where.partition, where.offset)
            if record is not None:
                return record
            if log_start_offset(connection, where.topic, where.partition) <= where.offset:  # still there: unreadable
                raise KafkaException(f"the original at {where} could not be read: {why}")
            if stream.resend.hook is None:
                raise SourceGone(f"the original at {where} left the log since it was planned: {why}")
        assert stream.resend.hook is not None
        payload = hook_payload(stream.resend.hook, plan.message_id, self._attributes(plan))
        return StoredRecord(
            None, payload, list(TraceContext(plan.message_id, stream.name, stream.sampling_percent).as_headers())
        )

    def _attributes(self, plan: ResendPlan) -> dict[str, str]:
        """The message's recovery attributes, from its archived traces (empty without an archive)."""
        if self.archive_dir is None:
            return {}
        entry = self.store.verdicts.read_messages([plan.message_id])
        spans = [(int(r.get("first_seen_ms") or r["decided_ms"]), int(r["decided_ms"])) for r in entry]
        hours = {h for start, end in spans for h in hours_between(start - HOUR_MS, end)}
        found: dict[str, str] = {}
        for trace in read_traces_in_hours(self.archive_dir, [plan.message_id], hours):
            found.update((k, v) for k, v in trace.attributes.items() if not k.startswith("khipu."))
        return found


RUN_ALERT_KIND, UNRECOVERABLE_ALERT_KIND = "resend_run", "resend_unrecoverable"


def run_alerts(run: ResendRun, run_id: str, at_ms: int) -> list[Alert]:
    """What the notifiers are told of a run: one message with its counts (when it considered any loss), and one
    per loss given up on (keyed by the loss: a retried task never tells it twice). A dry run tells nothing."""
    if run.dry_run or all(o.state in ("waiting", "busy") for o in run.outcomes):
        return []  # nothing happened worth a message
    troubled = any(o.state in ("failed", "unrecoverable") for o in run.outcomes)
    alerts = [
        Alert(
            key=f"resend:{run_id}",
            subject="resend",
            kind=RUN_ALERT_KIND,
            state=AlertState.FIRING,
            severity=Severity.WARNING if troubled else Severity.INFO,
            title=f"Khipu resend run {run_id}: {run.summary()}",
            at_ms=at_ms,
            details={"run_id": run_id, "counts": run.counts()},
        )
    ]
    for outcome in run.outcomes:
        if outcome.state == "unrecoverable":
            alerts.append(
                Alert(
                    key=f"unrecoverable:{outcome.message_id}:{outcome.hop}",
                    subject=f"{outcome.stream}: {outcome.hop}",
                    kind=UNRECOVERABLE_ALERT_KIND,
                    state=AlertState.FIRING,
                    severity=Severity.WARNING,
                    title=f"{outcome.stream}: message {outcome.message_id} lost at {outcome.hop} is UNRECOVERABLE: "
                    f"{outcome.detail}",
                    at_ms=at_ms,
                    details=dataclasses.asdict(outcome),
                )
            )
    return alerts
