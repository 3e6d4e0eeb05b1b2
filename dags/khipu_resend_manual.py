"""
### Khipu resend, by hand

Resends the confirmed losses you name, for streams whose `resend.mode` is **manual** or **auto**
(never `off`). **`dry_run` is on by default**: the task log and the return value say what would
be resent, from where and to where (or why not), and nothing is written.

**Trigger** from the UI ("Trigger DAG w/ config") or the CLI:
`airflow dags trigger khipu_resend_manual --conf '{"streams": ["demo.orders"], "dry_run": false}'`

- `streams`: stream names (empty: every manual or auto stream);
- `hop`: one hop id, e.g. `local/demo.orders -> demo-enricher` (empty: every hop);
- `message_ids`: these messages only (each must be CONFIRMED_LOST);
- `since`, `until`: losses decided in `[since, until)` (ISO times with a zone; empty: any time);
- `dry_run`: say what would be resent, write nothing.

Refused, with the reason and nothing written: an unknown stream or hop, a stream whose mode is
`off`, a message id that is not a confirmed loss, a time that is not ISO. A recovery hook that
cannot be imported or raises fails only its loss (the error is in the ledger; the loss stays
CONFIRMED_LOST). Docs: docs/resend.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

STORE = "khipu_store"


@dag(
    dag_id="khipu_resend_manual",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["khipu", "resend"],
    # a refused request fails at once (AirflowFailException skips retries); a cluster hiccup is retried once
    default_args={"owner": "khipu", "retries": 1, "retry_delay": timedelta(minutes=1)},
    params={
        "streams": Param([], type="array", items={"type": "string"}, description="streams (empty: all)"),
        "hop": Param("", type="string", description="one hop id (empty: every hop)"),
        "message_ids": Param([], type="array", items={"type": "string"}, description="these messages only"),
        "since": Param("", type="string", description="losses decided at or after (ISO with zone; empty: any)"),
        "until": Param("", type="string", description="losses decided before (ISO with zone; empty: any)"),
        "dry_run": Param(True, type="boolean", description="say what would be resent, write nothing"),
    },
)
def khipu_resend_manual() -> None:
    @task
    def resend_chosen_losses() -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from khipu.errors import InvalidSetting
        from khipu.reconcile.window import parse_time
        from khipu.registry.model import ResendMode
        from khipu.resend.run import ResendSelection
        from khipu_airflow.resend import run_resend

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
        return run_resend(selection, STORE, str(context["run_id"]))

    resend_chosen_losses()


khipu_resend_manual()
