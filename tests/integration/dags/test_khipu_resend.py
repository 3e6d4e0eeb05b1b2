"""The resend DAGs under dag.test(): the manual DAG's typed Params, its dry run (writes nothing) and real run,
refusals with their reason, the auto DAG acting only for `auto` streams, and the notifiers told once per run.

Real parts: the session's Kafka broker (the originals and the resent copies), a SQLite store, a webhook
receiver on 127.0.0.1.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from khipu.localstack.broker import BrokerProcess
from khipu.store import Store
from khipu.verdicts.model import Cause, VerdictKind
from tests.integration.resend.pipeline import Pipeline, registry, registry_text, resent_copies

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"


@pytest.fixture
def resend_env(
    broker: BrokerProcess,
    airflow_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    webhook: tuple[str, list[dict[str, Any]]],
) -> tuple[Pipeline, Path, list[dict[str, Any]]]:
    suffix = secrets.token_hex(3)
    inp, out = f"in-{suffix}", f"out-{suffix}"
    broker.admin().ensure_topics({inp: 1, out: 2})
    registry_file = tmp_path / "registry.yaml"
    registry_file.write_text(registry_text(inp, out, mode="manual"))
    store_path = tmp_path / "khipu.db"
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    url, received = webhook
    for variable, value in {
        "KHIPU_STATE_DIR": str(tmp_path / "state"),
        "KHIPU_REGISTRY": str(registry_file),
        "AIRFLOW_CONN_KHIPU_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers, "khipu.cluster": "local"}}
        ),
        "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "sqlite", "host": str(store_path)}),
        "AIRFLOW_CONN_KHIPU_ALERT_WEBHOOK": json.dumps({"conn_type": "http", "extra": {"url": url}}),
    }.items():
        monkeypatch.setenv(variable, value)
    pipeline = Pipeline(broker, store, registry(inp, out, mode="manual"), inp, out)
    hops = pipeline.hops
    at = pipeline.write(out, 1, "m-skip", b"order-1")
    pipeline.verdict(
        "m-skip", hops["s1"], VerdictKind.CONFIRMED_LOST, cause=Cause.SKIPPED_BY_CONSUMER, partition=1, offset=at
    )
    gone = pipeline.write(out, 0, "m-gone", b"order-2")
    broker.admin().delete_records({(out, 0): gone + 1})
    pipeline.verdict("m-gone", hops["s2"], VerdictKind.CONFIRMED_LOST, cause=Cause.TRUNCATED, partition=0, offset=gone)
    return pipeline, registry_file, received


def trigger(dag_id: str, conf: dict[str, Any] | None = None) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS)).get_dag(dag_id)
    assert dag is not None
    return dag.test(run_conf=conf)


def returned(run: Any, task_id: str) -> dict[str, Any]:
    value = run.get_task_instance(task_id).xcom_pull(task_ids=task_id)
    assert isinstance(value, dict)
    return value


def test_the_manual_dag_dry_runs_then_resends_and_tells_the_notifiers_once(
    resend_env: tuple[Pipeline, Path, list[dict[str, Any]]],
) -> None:
    from airflow.utils.state import DagRunState

    pipeline, _, received = resend_env
    dry = trigger("khipu_resend_manual", {"streams": ["orders"]})  # dry_run is the default
    assert dry.state == DagRunState.SUCCESS
    said = returned(dry, "resend_chosen_losses")
    assert said["dry_run"] is True and said["counts"] == {"would_give_up": 1, "would_resend": 1}
    skip = next(o for o in said["outcomes"] if o["message_id"] == "m-skip")
    assert skip["destination"] == f"local/{pipeline.out} for s1 only" and skip["source"].endswith("[1]@0")
    assert resent_copies(pipeline) == [] and pipeline.store.resends.of_messages(["m-skip", "m-gone"]) == {}
    assert received == []  # a dry run tells no one

    real = trigger("khipu_resend_manual", {"streams": ["orders"], "dry_run": False})
    assert real.state == DagRunState.SUCCESS
    assert returned(real, "resend_chosen_losses")["counts"] == {"produced": 1, "unrecoverable": 1}
    (copy,) = resent_copies(pipeline)
    assert copy.value() == b"order-1"
    kinds = sorted((p["kind"], p["severity"]) for p in received)
    assert kinds == [("resend_run", "warning"), ("resend_unrecoverable", "warning")]
    run_notice = next(p for p in received if p["kind"] == "resend_run")
    assert run_notice["details"]["counts"] == {"produced": 1, "unrecoverable": 1}
    assert "m-gone" in next(p for p in received if p["kind"] == "resend_unrecoverable")["title"]

    again = trigger("khipu_resend_manual", {"streams": ["orders"], "dry_run": False})
    assert returned(again, "resend_chosen_losses")["counts"] == {"waiting": 1}
    assert len(resent_copies(pipeline)) == 1
    assert [p["kind"] for p in received].count("resend_unrecoverable") == 1  # each UNRECOVERABLE told once


@pytest.mark.parametrize(
    ("conf", "reason"),
    [
        ({"streams": ["payments"]}, "unknown stream 'payments'"),
        ({"hop": "local/nowhere -> s9"}, "hop 'local/nowhere -> s9' is not on the route"),
        ({"message_ids": ["m-none"]}, "message 'm-none': no verdict of it here"),
        ({"since": "yesterday"}, "an ISO time"),
    ],
)
def test_the_manual_dag_refuses_what_cannot_be_resent_with_its_reason_and_writes_nothing(
    resend_env: tuple[Pipeline, Path, list[dict[str, Any]]],
    conf: dict[str, Any],
    reason: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from airflow.utils.state import DagRunState

    pipeline, _, received = resend_env
    run = trigger("khipu_resend_manual", {**conf, "dry_run": False})
    assert run.state == DagRunState.FAILED
    captured = capfd.readouterr()
    assert reason in captured.out + captured.err
    assert resent_copies(pipeline) == [] and pipeline.store.resends.of_messages(["m-skip", "m-gone"]) == {}
    assert sorted(r["verdict"] for r in pipeline.store.verdicts.rows()) == ["CONFIRMED_LOST", "CONFIRMED_LOST"]
    assert received == []  # whoever triggered it reads the reason in the task log


def test_a_teams_resend_dag_resends_the_teams_streams_and_refuses_another_teams_as_unknown(
    resend_env: tuple[Pipeline, Path, list[dict[str, Any]]],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each team's own DAG (khipu.access.dags, in the team's bundle): the stream of team-orders is resent by
    team-orders' DAG; team-refunds' DAG answers for it as for a stream the registry does not name, and resends
    nothing when asked for everything (it has no stream)."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    from khipu.access.dags import bundle_setting, dag_bundles, write_team_dag_files

    pipeline, _, _ = resend_env
    owners = ["team-orders", "team-refunds"]
    write_team_dag_files(owners, tmp_path / "team-dags")
    teams = dag_bundles(owners, DAGS, tmp_path / "team-dags", multi_team=False)[1:]  # as `khipu airflow-bundles`
    this_session = {"name": "dags-folder", "classpath": teams[0]["classpath"], "kwargs": {}}  # Airflow's default
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", bundle_setting([this_session, *teams]))
    dags = {
        owner: DagBag(dag_folder=str(tmp_path / "team-dags" / owner)).get_dag(f"khipu_resend_manual__{owner}")
        for owner in ("team-orders", "team-refunds")
    }
    everything = dags["team-refunds"].test(run_conf={"dry_run": False})
    assert everything.state == DagRunState.SUCCESS
    assert returned(everything, "resend_chosen_losses")["counts"] == {}
    own = dags["team-orders"].test(run_conf={"dry_run": False})  # every stream of the team
    assert own.state == DagRunState.SUCCESS
    assert returned(own, "resend_chosen_losses")["counts"] == {"produced": 1, "unrecoverable": 1}
    (copy,) = resent_copies(pipeline)
    assert copy.value() == b"order-1"

    capfd.readouterr()
    refused = dags["team-refunds"].test(run_conf={"streams": ["orders"], "dry_run": False})
    assert refused.state == DagRunState.FAILED
    captured = capfd.readouterr()
    assert "unknown stream 'orders'" in captured.out + captured.err  # as one that does not exist
    assert len(resent_copies(pipeline)) == 1  # nothing more


def test_the_auto_dag_resends_only_auto_streams(resend_env: tuple[Pipeline, Path, list[dict[str, Any]]]) -> None:
    from airflow.utils.state import DagRunState

    pipeline, registry_file, _ = resend_env
    manual_only = trigger("khipu_resend")
    assert manual_only.state == DagRunState.SUCCESS
    assert returned(manual_only, "resend_confirmed_losses")["counts"] == {}  # a manual stream waits for a human
    registry_file.write_text(registry_text(pipeline.inp, pipeline.out, mode="auto"))
    auto = trigger("khipu_resend")
    assert auto.state == DagRunState.SUCCESS
    assert returned(auto, "resend_confirmed_losses")["counts"] == {"produced": 1, "unrecoverable": 1}
    assert len(resent_copies(pipeline)) == 1
