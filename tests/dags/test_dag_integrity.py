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
