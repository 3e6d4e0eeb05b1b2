"""Which of Khipu's DAGs carry whose data in Airflow itself: the bundles a deployment gives Airflow, and each team's
resend DAG (khipu.access.dags)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from khipu.access import EVERY_STREAM_TEAM, MANUAL_DAG, resend_dag_of
from khipu.access.dags import DagAccessError, bundle_setting, dag_bundles, team_dag_file, write_team_dag_files


def test_khipus_own_dags_are_every_streams_and_each_team_has_a_bundle_of_its_own_in_multi_team_mode() -> None:
    bundles = dag_bundles(["team-orders", "team-refunds", "team-orders"], Path("/k/dags"), Path("/t"), True)
    assert [(b["name"], b["kwargs"]["path"], b.get("team_name")) for b in bundles] == [
        ("khipu", "/k/dags", EVERY_STREAM_TEAM),  # snapshots, detector, reconciliation, ...: every team's data
        ("khipu-team-orders", "/t/team-orders", "team-orders"),
        ("khipu-team-refunds", "/t/team-refunds", "team-refunds"),
    ]
    assert {b["classpath"] for b in bundles} == {"airflow.dag_processing.bundles.local.LocalDagBundle"}
    assert json.loads(bundle_setting(bundles)) == bundles  # as Airflow reads it from its setting


def test_without_multi_team_the_bundles_have_no_team_and_the_dags_are_granted_by_id() -> None:
    bundles = dag_bundles(["team-orders"], Path("/k/dags"), Path("/t"), False)
    assert [b.get("team_name") for b in bundles] == [None, None]
    assert [b["name"] for b in bundles] == ["khipu", "khipu-team-orders"]


@pytest.mark.parametrize("owner", ["ab", "team orders", "team/orders", "x" * 51, "../up"])
def test_an_owner_airflow_cannot_name_a_team_is_refused_by_name(owner: str) -> None:
    with pytest.raises(DagAccessError) as refused:
        dag_bundles([owner], Path("/k"), Path("/t"), True)
    assert repr(owner) in str(refused.value) and "Airflow team name" in str(refused.value)


def test_each_team_gets_its_resend_dag_in_its_folder_and_writing_again_changes_nothing(tmp_path: Path) -> None:
    written = write_team_dag_files(["team-orders", "team-refunds"], tmp_path)
    assert written == [
        tmp_path / "team-orders" / "khipu_resend_manual__team-orders.py",
        tmp_path / "team-refunds" / "khipu_resend_manual__team-refunds.py",
    ]
    text = written[0].read_text()
    assert text == team_dag_file("team-orders").text and "manual_resend_dag(team='team-orders')" in text
    stamps = [path.stat().st_mtime_ns for path in written]
    assert write_team_dag_files(["team-refunds", "team-orders"], tmp_path) == written
    assert [path.stat().st_mtime_ns for path in written] == stamps  # the same text: not rewritten


def test_the_operators_resend_dag_and_each_teams_are_named_apart() -> None:
    assert resend_dag_of(None) == MANUAL_DAG == "khipu_resend_manual"
    assert resend_dag_of("team-orders") == "khipu_resend_manual__team-orders"
