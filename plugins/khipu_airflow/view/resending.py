"""A resend from a message's page (docs/view.md#resending-from-a-message-page).

On the page of a message CONFIRMED_LOST at a hop, whoever sees its stream and may trigger its team's manual resend
DAG (``khipu_resend_manual__<team>``; :mod:`khipu.access.dags`) gets a button that triggers a **dry run** of that
DAG for that one loss. The page then follows the run (it reloads until the run ends) and shows what the dry run
said; when it said it would resend the loss, a second button triggers the real run, naming the dry run. The real run
is refused unless that dry run succeeded for the same loss and said ``would_resend``. Its outcome and the resend
ledger's attempts show on the same page.

The runs are Airflow's, triggered and read as the person asking (:class:`ResendRuns`; the plugin's is
:class:`khipu_airflow.access.AirflowResendRuns`).

No ``from __future__ import annotations`` here: FastAPI reads the route's annotations.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol
from urllib.parse import quote

from fastapi import Depends, FastAPI, Form, Request
from fastapi.responses import RedirectResponse, Response

from khipu.access import MANUAL_DAG, Viewer, resend_dag_for, resend_dag_of, resend_refusal
from khipu.registry.model import Registry
from khipu.report.message import MessageReport
from khipu.report.resending import (
    Loss,
    NotThisLoss,
    ResendRunView,
    RunSeen,
    confirmed_losses,
    read_run,
    real_run_refusal,
    run_conf,
)
from khipu.report.service import ReportQueryError


class ResendRuns(Protocol):
    """The manual resend DAG's runs, as the person asking (``request`` carries their login)."""

    def trigger(self, request: Request, dag_id: str, conf: Mapping[str, Any], note: str) -> str: ...

    def run(self, request: Request, dag_id: str, run_id: str) -> RunSeen: ...


class ResendRefused(Exception):
    """A resend the person asking may not make now: the status to answer and why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


@dataclass(frozen=True, slots=True)
class Offer:
    loss: Loss
    refusal: str | None  # why this person may not resend it (None: the button is theirs)


@dataclass(frozen=True, slots=True)
class ResendPanel:
    """The message page's resend part: a dry-run button per confirmed loss, and the run the page follows."""

    offers: list[Offer] = field(default_factory=list)
    run: ResendRunView | None = None
    next_refusal: str | None = None  # why the run shown cannot be followed by a real resend (None: it can)
    following: str | None = None  # the run id the page follows
    unread: str | None = None  # why that run could not be read just now (Airflow did not answer): asked again

    @property
    def reloads(self) -> bool:
        """The page reloads itself: the run it follows has not ended, or could not be read just now."""
        return self.following is not None and (self.run is None or not self.run.finished)


def panel(
    runs: ResendRuns | None,
    viewer: Viewer,
    registry: Registry,
    report: MessageReport,
    request: Request,
    run_id: str | None,
) -> ResendPanel | None:
    """What the message page shows of resending ``report``'s message (None: nothing to show)."""
    if runs is None:
        return None
    offers = [Offer(loss, resend_refusal(viewer, registry, loss.stream)) for loss in confirmed_losses(report)]
    run, unread = None, None
    if run_id:
        try:
            seen = runs.run(request, resend_dag(viewer, registry, report.stream), run_id)
            run = read_run(seen, report.message_id)  # NotThisLoss: 404
        except ResendRefused as exc:
            if exc.status < 500:  # refused (not theirs, not found): the page says so
                raise
            unread = str(exc)  # Airflow did not answer now: the page says so and asks again, still following
    if not offers and run is None and unread is None:
        return None
    refusal = None
    if run is not None:
        refusal = real_run_refusal(run, run.loss) or resend_refusal(viewer, registry, run.loss.stream)
    return ResendPanel(offers, run, refusal, run_id or None, unread)


def resend_dag(viewer: Viewer, registry: Registry, stream: str | None) -> str:
    """The resend DAG whose runs the view triggers and follows for a loss of ``stream`` (khipu.access.dags): the
    one ``viewer`` may trigger, else its team's own (Airflow then answers for it)."""
    if stream is None or stream not in registry.streams:
        return MANUAL_DAG
    owner = registry.streams[stream].owner
    return resend_dag_for(viewer, owner) or resend_dag_of(owner)


def add_routes(
    app: FastAPI,
    runs: ResendRuns | None,
    viewer: Callable[[], Viewer],
    registry: Callable[[], Registry],
    report_of: Callable[[str], MessageReport],
    page_user: Any,
) -> None:
    """``POST /messages/{id}/resend``: a dry run (``hop``), or the real run after one (``hop`` and ``after``, the
    dry run's id); 303 back to the message page following the new run."""
    PageUser = Annotated[Any, Depends(page_user)]

    @app.post("/messages/{message_id:path}/resend", include_in_schema=False)  # any id, '/' included
    def resend_message(
        request: Request,
        message_id: str,
        _user: PageUser,
        hop: Annotated[str, Form()],
        after: Annotated[str | None, Form()] = None,
    ) -> Response:
        report = report_of(message_id)  # another team's message is one that does not exist: 404
        losses = confirmed_losses(report)
        loss = next((loss for loss in losses if loss.hop == hop), None)
        if loss is None:
            confirmed = "; ".join(loss.hop for loss in losses) or "none"
            raise ReportQueryError("hop", hop, f"a hop where {message_id} is CONFIRMED_LOST: {confirmed}")
        refusal = resend_refusal(viewer(), registry(), loss.stream)
        if refusal is not None:
            raise ResendRefused(403, refusal)
        if runs is None:
            raise ResendRefused(404, "resending is not available in this view")
        dag_id = resend_dag(viewer(), registry(), loss.stream)
        if after:
            refused = real_run_refusal(read_run(runs.run(request, dag_id, after), message_id), loss)
            if refused is not None:
                raise ResendRefused(409, refused)
        what = "resend" if after else "dry run"
        note = f"{what} from the Khipu view: message {message_id} lost at {loss.hop}" + (
            f", after dry run {after}" if after else ""
        )
        run_id = runs.trigger(request, dag_id, run_conf(loss, dry_run=not after), note)
        base = str(request.scope.get("root_path", "")).rstrip("/")
        target = f"{base}/messages/{quote(message_id, safe='')}?resend_run={quote(run_id, safe='')}#resend"
        return RedirectResponse(target, status_code=303)


__all__ = ["NotThisLoss", "Offer", "ResendPanel", "ResendRefused", "ResendRuns", "add_routes", "panel"]
