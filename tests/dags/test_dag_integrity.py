"""Every DAG imports cleanly and carries what operators rely on: owner, retries, tags, docs."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS_FOLDER = Path(__file__).resolve().parents[2] / "dags"
DAG_FILES = sorted(p for p in DAGS_FOLDER.glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_FOLDER))


def test_there_are_dags_to_check() -> None:
    assert DAG_FILES, f"no DAG files in {DAGS_FOLDER}"


def test_every_dag_file_imports_without_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.stem)
def test_one_dag_per_file_with_dag_id_equal_to_the_file_name(dagbag, path: Path) -> None:  # type: ignore[no-untyped-def]
    ids = [dag_id for dag_id, dag in dagbag.dags.items() if Path(dag.fileloc).resolve() == path.resolve()]
    assert ids == [path.stem]


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.stem)
def test_dag_has_owner_retries_tags_and_doc(dagbag, path: Path) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.dags[path.stem]
    assert dag.tags and "khipu" in dag.tags
    assert dag.doc_md and len(dag.doc_md.strip()) > 80, "doc_md must say what the DAG is for and how to trigger it"
    for task in dag.tasks:
        assert task.owner not in ("", "airflow"), f"{task.task_id}: set a real owner"
        assert task.retries >= 1, f"{task.task_id}: retries must be >= 1"


def test_each_registry_teams_resend_dag_file_declares_its_own_dag(tmp_path: Path) -> None:
    """The files `khipu airflow-bundles` writes (khipu.access.dags.team_dag_file), one per registry owner, each parse
    alone into the team's manual resend DAG: one DAG, its id the file's name, the team as owner and tag."""
    from airflow.dag_processing.dagbag import DagBag

    from khipu.access.dags import team_dag_file
    from khipu.registry.loader import load_registry

    registry = load_registry(DAGS_FOLDER.parent / "config" / "registry.yaml")
    owners = sorted(registry.owners)
    assert owners == ["team-bursts", "team-demo"]
    for owner in owners:
        written = team_dag_file(owner)
        folder = tmp_path / owner
        folder.mkdir()
        (folder / written.name).write_text(written.text)
        bag = DagBag(dag_folder=str(folder))
        assert bag.import_errors == {}
        assert list(bag.dags) == [Path(written.name).stem] == [f"khipu_resend_manual__{owner}"]
        dag = bag.dags[f"khipu_resend_manual__{owner}"]
        assert owner in dag.tags and "khipu" in dag.tags and f"team {owner}'s streams" in (dag.doc_md or "")
        assert [task.owner for task in dag.tasks] == [owner] and all(task.retries >= 1 for task in dag.tasks)
