"""A set-up whose executors would reach for the driver's disk is refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.detector.launch import DetectorJobError, check_deployment, runs_on_one_host
from khipu.storage.location import Location, StorageError

PG = "postgresql+psycopg2://khipu:pw@db.internal:5432/khipu"
SQLITE = "sqlite:////var/lib/khipu/khipu.db"


@pytest.mark.parametrize(
    ("master", "one_host"),
    [("local", True), ("local[*]", True), ("local[*,4]", True), ("local-cluster[2,1,1024]", False),
     ("spark://127.0.0.1:7077", False), ("yarn", False), ("k8s://https://10.0.0.1:6443", False)],
)  # fmt: skip
def test_only_local_masters_run_every_executor_in_the_driver(master: str, one_host: bool) -> None:
    assert runs_on_one_host(master) is one_host


@pytest.mark.parametrize(
    ("master", "store", "local_archive", "refused"),
    [
        ("local[*,4]", SQLITE, True, None),  # the embedded default
        ("local[*,4]", PG, True, None),
        ("spark://10.0.0.5:7077", SQLITE, False, "'store': got 'SQLite with master spark://10.0.0.5:7077'"),
        ("yarn", PG, True, "'archive': got"),
    ],
)
def test_a_cluster_master_needs_a_network_store_and_shared_locations(
    tmp_path: Path, master: str, store: str, local_archive: bool, refused: str | None
) -> None:
    archive = Location.of(tmp_path / "archive") if local_archive else Location.of("s3a://khipu-data/x/archive")
    locations = {"archive": archive}
    if refused is None:
        check_deployment(master, store, locations)
        return
    with pytest.raises(DetectorJobError) as raised:
        check_deployment(master, store, locations)
    assert refused in str(raised.value)
    assert "pw" not in str(raised.value)  # the store's password is never shown


def test_a_cluster_with_postgres_and_object_store_locations_passes_the_host_checks() -> None:
    """Past the host checks, each location must answer: an object store nobody listens on is refused by name."""
    unreachable = {"archive": Location.of("s3a://khipu-data/x/archive")}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KHIPU_S3_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers S3 there
        env.setenv("AWS_ACCESS_KEY_ID", "k")
        env.setenv("AWS_SECRET_ACCESS_KEY", "s")
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with pytest.raises(StorageError, match=r"'archive'.*s3a://khipu-data/x/archive.*a location this host can list"):
            check_deployment("spark://10.0.0.5:7077", PG, unreachable)
