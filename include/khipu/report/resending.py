"""A resend from a message's page: which confirmed losses the message offers, the manual resend DAG's conf for
one, and what a run of that DAG says about it. A real run follows a dry run of the same loss that succeeded and
said it would resend it (:func:`real_run_refusal`).

The run itself is Airflow's (the plugin triggers the stream's team's manual resend DAG, :mod:`khipu.access.dags`, as
the person asking and reads the run back): here it arrives as a :class:`RunSeen`, and everything is decided from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from khipu.access import MANUAL_DAG
from khipu.report.message import MessageReport
from khipu.verdicts.model import VerdictKind

RESEND_TASK = "resend_chosen_losses"  # its return value is the run's outcomes (khipu.resend.run.ResendRun.as_dict)
FINISHED = ("success", "failed")


class NotThisLoss(LookupError):
    """A run named on a message's page that is not a run of the resend DAG for one of that message's losses."""

    def __init__(self, dag_id: str, run_id: str, message_id: str) -> None:
        super().__init__(f"run {run_id!r} of {dag_id} is not a resend of message {message_id!r}")


@dataclass(frozen=True, slots=True)
class Loss:
    """A message confirmed lost at one hop of its stream: what a resend from its page is for."""

    message_id: str
    stream: str
    hop: str


def confirmed_losses(report: MessageReport) -> list[Loss]:
    """The hops where the message is CONFIRMED_LOST, in route order (a LOST one is not confirmed yet; RESENT and
    UNRECOVERABLE are settled)."""
    if report.stream is None:
        return []
    return [
        Loss(report.message_id, report.stream, hop.hop)
        for hop in report.hops
        if hop.verdict is not None and hop.verdict.get("verdict") == VerdictKind.CONFIRMED_LOST.value
    ]


def run_conf(loss: Loss, *, dry_run: bool) -> dict[str, Any]:
    """The conf of a manual resend DAG's run resending this one loss (its typed Params)."""
    return {"streams": [loss.stream], "hop": loss.hop, "message_ids": [loss.message_id], "dry_run": dry_run}


def loss_of(conf: Mapping[str, Any]) -> tuple[Loss, bool] | None:
    """The one loss a run's conf names, and whether it is a dry run; None: a conf naming anything else (several
    streams or messages, no hop, a time range)."""
    streams, message_ids, hop = conf.get("streams"), conf.get("message_ids"), conf.get("hop")
    if not (isinstance(streams, list) and isinstance(message_ids, list) and isinstance(hop, str) and hop):
        return None
    if len(streams) != 1 or len(message_ids) != 1 or conf.get("since") or conf.get("until"):
        return None
    return Loss(str(message_ids[0]), str(streams[0]), hop), conf.get("dry_run") is not False


@dataclass(frozen=True, slots=True)
class RunSeen:
    """A run of the resend DAG as Airflow's API showed it to the person asking."""

    run_id: str
    state: str  # queued | running | success | failed
    conf: Mapping[str, Any]
    result: Mapping[str, Any] | None = None  # the resend task's return value, once it succeeded
    dag_id: str = MANUAL_DAG  # the resend DAG it is a run of (khipu.access.dags)


@dataclass(frozen=True, slots=True)
class ResendRunView:
    """What a run of the resend DAG says about one loss, for its message's page."""

    run_id: str
    loss: Loss
    dry_run: bool
    state: str
    summary: str | None  # the run's own summary line (its counts)
    outcomes: list[dict[str, Any]] = field(default_factory=list)  # its outcomes for this loss

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def would_resend(self) -> bool:
        """A dry run that succeeded and would resend this loss: a real run may follow."""
        return self.dry_run and self.state == "success" and any(o["state"] == "would_resend" for o in self.outcomes)


def read_run(run: RunSeen, message_id: str) -> ResendRunView:
    """What ``run`` says about ``message_id``'s loss; NotThisLoss when the run is not a resend of that message."""
    named = loss_of(run.conf)
    if named is None or named[0].message_id != message_id:
        raise NotThisLoss(run.dag_id, run.run_id, message_id)
    loss, dry_run = named
    result = run.result or {}
    outcomes = _outcomes(result.get("outcomes"), loss)
    summary = result.get("summary")
    return ResendRunView(run.run_id, loss, dry_run, run.state, str(summary) if summary else None, outcomes)


def _outcomes(listed: object, loss: Loss) -> list[dict[str, Any]]:
    if not isinstance(listed, Sequence):
        return []
    return [
        dict(o)
        for o in listed
        if isinstance(o, Mapping) and o.get("message_id") == loss.message_id and o.get("hop") == loss.hop
    ]


def real_run_refusal(dry: ResendRunView, loss: Loss) -> str | None:
    """Why a real resend of ``loss`` may not follow the run ``dry`` (None: it may)."""
    if not dry.dry_run:
        return f"run {dry.run_id} is not a dry run: a real resend follows a dry run"
    if dry.loss != loss:
        return f"dry run {dry.run_id} was for {dry.loss.hop}, not {loss.hop}"
    if dry.state != "success":
        return f"dry run {dry.run_id} has not succeeded (it is {dry.state})"
    if not dry.would_resend:
        said = "; ".join(f"{o['state']}: {o.get('detail', '')}" for o in dry.outcomes) or "nothing about this loss"
        return f"dry run {dry.run_id} would not resend it ({said})"
    return None
