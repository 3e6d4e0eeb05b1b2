"""Airflow's side of resending: a run of :class:`khipu.resend.run.Resender` with the project's connections,
its progress in the task log, its outcome told through the notifiers (and kept on the Alerts page)."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from khipu.access import Viewer, resend_dag_of, seen_registry
from khipu.alerting.dispatch import dispatch_pending
from khipu.clock import now_ms
from khipu.errors import InvalidSetting
from khipu.registry.loader import load_registry
from khipu.registry.model import Registry
from khipu.resend.run import Resender, ResendRequestError, ResendSelection, run_alerts, wait_from_env
from khipu.settings import KhipuSettings
from khipu_airflow.hooks import KhipuStoreHook, cluster_connections
from khipu_airflow.notifiers import configured_notifiers

log = logging.getLogger(__name__)
STORE = "khipu_store"


def run_resend(
    selection: ResendSelection, store_conn_id: str, run_id: str, team: str | None = None
) -> dict[str, Any]:
    """Resend what ``selection`` names, of ``team``'s streams only when a team is given (another team's stream is
    refused as one the registry does not name); fail the task (no retry, nothing written) when it names what cannot
    be resent. Returns the run's outcomes (the task's XCom)."""
    settings = KhipuSettings.from_env()
    try:
        registry: Registry = load_registry(settings.registry_path)
        if team is not None:
            registry = seen_registry(Viewer(team, frozenset({team})), registry)
        wait_ms = wait_from_env()
    except InvalidSetting as exc:
        raise AirflowFailException(str(exc)) from None
    store = KhipuStoreHook(store_conn_id).store()
    try:
        resender = Resender(
            store,
            registry,
            cluster_connections(registry),
            now_ms,
            settings.archive_dir,
            wait_ms,
            verdict_archive_dir=settings.verdict_archive_dir,
        )
        try:
            run = resender.run(selection, progress=log.info)
        except ResendRequestError as exc:
            raise AirflowFailException(str(exc)) from None
        alerts = run_alerts(run, run_id, now_ms())
        if alerts:
            added = sum(store.alerts.add(alert) for alert in alerts)
            report = dispatch_pending(store, configured_notifiers(), now_ms())
            log.info("resend notices: %d recorded, %d sent", added, report.sent)
    finally:
        store.close()
    return run.as_dict()


MANUAL_DOC = """
### Khipu resend, by hand{of_team}

Resends the confirmed losses you name, of {whose} whose `resend.mode` is **manual** or **auto**
(never `off`). **`dry_run` is on by default**: the task log and the return value say what would
be resent, from where and to where (or why not), and nothing is written.{team_note}

**Trigger** from the UI ("Trigger DAG w/ config"), from a message's page in the Khipu view, or the CLI:
`airflow dags trigger {dag_id} --conf '{{"streams": ["<stream>"], "dry_run": false}}'`

- `streams`: stream names (empty: every manual or auto stream{of_them});
- `hop`: one hop id, as `<cluster>/<topic> -> <group>` (empty: every hop);
- `message_ids`: these messages only (each must be CONFIRMED_LOST);
- `since`, `until`: losses decided in `[since, until)` (ISO times with a zone; empty: any time);
- `dry_run`: say what would be resent, write nothing.

Refused, with the reason and nothing written: an unknown stream or hop, a stream whose mode is
`off`, a message id that is not a confirmed loss, a time that is not ISO. A recovery hook that
cannot be imported or raises fails only its loss (the error is in the ledger; the loss stays
CONFIRMED_LOST). Docs: docs/resend.md; who reads its runs: docs/view.md#airflows-own-surfaces.
"""


def manual_resend_dag(team: str | None = None) -> Any:
    """The manual resend DAG of ``team``'s streams (``khipu_resend_manual__<team>``, in the team's own DAG bundle),
    or, without a team, of every stream (``khipu_resend_manual``, Khipu's operators'): khipu.access.dags."""
    from datetime import timedelta

    import pendulum
    from airflow.sdk import Param, dag, get_current_context, task

    dag_id = resend_dag_of(team)
    doc = MANUAL_DOC.format(
        of_team=f" (team {team})" if team else "",
        whose=f"team {team}'s streams" if team else "the streams",
        team_note=(
            f"\n\nOnly team {team}'s streams: another team's is refused as a stream the registry does not name. "
            f"Its runs, their confs, logs and return values are team {team}'s to read (its DAG bundle is theirs)."
            if team
            else "\n\nEvery team's streams: for Khipu's operators (each team has a DAG of its own, "
            "`khipu_resend_manual__<team>`)."
        ),
        dag_id=dag_id,
        of_them=f" of team {team}" if team else "",
    )

    @dag(
        dag_id=dag_id,
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        doc_md=doc,
        tags=["khipu", "resend", *([team] if team else [])],
        # a refused request fails at once (AirflowFailException skips retries); a cluster hiccup is retried once
        default_args={"owner": team or "khipu", "retries": 1, "retry_delay": timedelta(minutes=1)},
        params={
            "streams": Param([], type="array", items={"type": "string"}, description="streams (empty: all)"),
            "hop": Param("", type="string", description="one hop id (empty: every hop)"),
            "message_ids": Param([], type="array", items={"type": "string"}, description="these messages only"),
            "since": Param("", type="string", description="losses decided at or after (ISO with zone; empty: any)"),
            "until": Param("", type="string", description="losses decided before (ISO with zone; empty: any)"),
            "dry_run": Param(True, type="boolean", description="say what would be resent, write nothing"),
        },
    )
    def manual_resend() -> None:
        @task
        def resend_chosen_losses() -> dict[str, Any]:
            from khipu.reconcile.window import parse_time
            from khipu.registry.model import ResendMode

            context = get_current_context()
            params = context["params"]
            try:
                since = parse_time(str(params["since"])) if params.get("since") else None
                until = parse_time(str(params["until"])) if params.get("until") else None
            except InvalidSetting as exc:
                raise AirflowFailException(str(exc)) from None
            selection = ResendSelection(
                modes=frozenset({ResendMode.AUTO, ResendMode.MANUAL}),
                streams=tuple(params.get("streams") or ()),
                hop=params.get("hop") or None,
                message_ids=tuple(params.get("message_ids") or ()),
                since_ms=since,
                until_ms=until,
                dry_run=bool(params.get("dry_run")),
            )
            return run_resend(selection, STORE, str(context["run_id"]), team)

        resend_chosen_losses()

    return manual_resend()
