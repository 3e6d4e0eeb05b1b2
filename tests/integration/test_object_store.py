"""The object store for real: S3Proxy serves the S3 API to pyarrow and to Spark's S3A with the environment
``ObjectStoreProcess.environment()`` gives, refuses other credentials, keeps its secret out of command lines, Spark
settings and logs, and holds a Structured Streaming checkpoint that a restarted query resumes from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from khipu.localstack.object_store import ObjectStoreProcess, ObjectStoreSpec, start_object_store
from khipu.storage.location import Location

pytestmark = pytest.mark.integration

JOB = Path(__file__).with_name("s3a_job.py")


def prefix(name: str) -> str:
    """A prefix of its own for each test, so tests sharing the session's store never see each other's objects."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def run_job(store: ObjectStoreProcess, *args: str, endpoint: str | None = None) -> dict[str, Any]:
    """tests/integration/s3a_job.py in a process of its own, with the store's environment (never its argv);
    ``endpoint``: the store named otherwise than by its IP address."""
    result = subprocess.run(
        [sys.executable, str(JOB), *args],
        env={**os.environ, **store.environment(), **({"KHIPU_S3_ENDPOINT": endpoint} if endpoint else {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{args[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    seen: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    assert store.secret_key not in result.stdout + result.stderr  # never printed, not even by Spark's logs
    return seen


def test_pyarrow_writes_lists_and_reads_parquet_under_a_prefix_with_the_stores_environment(
    object_store: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in object_store.environment().items():
        monkeypatch.setenv(name, value)
    root = Location.of(f"s3a://{object_store.bucket}/{prefix('pyarrow')}")
    filesystem = root.filesystem()  # as Khipu opens it: KHIPU_S3_ENDPOINT, the credentials from the environment
    hours = {0: list(range(0, 500)), 1: list(range(500, 1200))}
    for hour, ids in hours.items():
        pq.write_table(pa.table({"id": ids}), f"{root.path}/hour={hour}/part-0.parquet", filesystem=filesystem)

    assert root.files(recursive=True) == [f"{root.path}/hour={hour}/part-0.parquet" for hour in hours]
    assert root.child_folders("hour=") == ["hour=0", "hour=1"]
    read = pq.read_table(root.path, filesystem=filesystem)
    assert sorted(read.column("id").to_pylist()) == hours[0] + hours[1]
    # the objects are in S3Proxy's own folder: this is the store that answered, not some other S3
    on_disk = object_store.spec.data_dir / root.path
    assert sorted(str(p.relative_to(on_disk)) for p in on_disk.rglob("*.parquet")) == [
        "hour=0/part-0.parquet",
        "hour=1/part-0.parquet",
    ]
    # a rename (pyarrow copies, then deletes) and a delete, as archives do
    filesystem.move(f"{root.path}/hour=1/part-0.parquet", f"{root.path}/hour=1/part-1.parquet")
    (root / "hour=0").delete()
    assert root.files(recursive=True) == [f"{root.path}/hour=1/part-1.parquet"]


def test_requests_with_other_credentials_or_none_are_refused(object_store: ObjectStoreProcess) -> None:
    key = f"{prefix('refused')}/x.parquet"
    base = {"endpoint_override": object_store.endpoint, "region": "us-east-1", "force_virtual_addressing": False}
    wrong_secret = pafs.S3FileSystem(access_key=object_store.access_key, secret_key="not-the-secret", **base)
    unknown_user = pafs.S3FileSystem(access_key="someone-else", secret_key=object_store.secret_key, **base)
    for filesystem, refusal in ((wrong_secret, "SIGNATURE_DOES_NOT_MATCH"), (unknown_user, "INVALID_ACCESS_KEY_ID")):
        with pytest.raises(OSError, match=refusal):
            filesystem.get_file_info(pafs.FileSelector(object_store.bucket, recursive=True))
        with pytest.raises(OSError, match=refusal):
            pq.write_table(pa.table({"id": [1]}), f"{object_store.bucket}/{key}", filesystem=filesystem)
    assert not (object_store.spec.data_dir / object_store.bucket / key).exists()  # nothing was written
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{object_store.endpoint}/{object_store.bucket}", timeout=10)
    assert anonymous.value.code == 403


def test_the_secret_is_in_an_owner_only_file_and_in_no_command_line_or_log(object_store: ObjectStoreProcess) -> None:
    credentials = object_store.spec.credentials_path
    assert oct(credentials.stat().st_mode & 0o777) == "0o600"
    assert json.loads(credentials.read_text())["secret_key"] == object_store.secret_key
    properties = object_store.spec.directory / "s3proxy.properties"  # S3Proxy reads it from there
    assert oct(properties.stat().st_mode & 0o777) == "0o600"
    assert f"s3proxy.credential={object_store.secret_key}\n" in properties.read_text()
    assert len(object_store.secret_key) >= 32

    command_line = Path(f"/proc/{object_store.pid}/cmdline").read_bytes().decode().split("\0")
    assert "org.gaul.s3proxy.Main" in command_line  # the store's own process
    everyone = [p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline") if _readable(p)]
    assert not [c for c in everyone if object_store.secret_key.encode() in c]
    # refused and accepted requests are in its log by now; the secret is not
    refused = pafs.S3FileSystem(
        access_key=object_store.access_key, secret_key="wrong", endpoint_override=object_store.endpoint
    )
    with pytest.raises(OSError):
        refused.get_file_info(object_store.bucket)
    log = object_store.log_path.read_text()
    assert "S3Proxy" in log or "s3proxy" in log
    assert object_store.secret_key not in log


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()
        return True
    except OSError:  # a process that ended meanwhile
        return False


def test_a_restarted_store_keeps_its_credentials_its_bucket_and_its_objects(tmp_path: Path) -> None:
    spec = ObjectStoreSpec.scratch(tmp_path / "store", bucket="kept")
    first = start_object_store(spec, tmp_path / "s3proxy.log")
    try:
        options = {"endpoint_override": first.endpoint, "region": "us-east-1"}
        filesystem = pafs.S3FileSystem(access_key=first.access_key, secret_key=first.secret_key, **options)
        pq.write_table(pa.table({"id": [7, 8, 9]}), "kept/p/x.parquet", filesystem=filesystem)
    finally:
        assert first.stop()
    second = start_object_store(spec, tmp_path / "s3proxy.log")
    try:
        assert (second.access_key, second.secret_key) == (first.access_key, first.secret_key)
        filesystem = pafs.S3FileSystem(access_key=second.access_key, secret_key=second.secret_key, **options)
        assert pq.read_table("kept/p/x.parquet", filesystem=filesystem).column("id").to_pylist() == [7, 8, 9]
    finally:
        assert second.stop()
    assert not second.stop()  # stopped: its process group is gone


def test_spark_writes_parquet_to_s3a_and_reads_it_back_and_pyarrow_reads_what_spark_wrote(
    object_store: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = f"s3a://{object_store.bucket}/{prefix('spark')}/table"
    # by a host name, as a cluster names its store: the bucket must be in the path (http://host/bucket/key), as no
    # host khipu.localhost exists; for an IP address the AWS SDK would choose that by itself
    by_name = f"http://localhost:{object_store.spec.port}"
    seen = run_job(object_store, "write-read", table, "1000", endpoint=by_name)
    assert seen["ids"] == list(range(1000)) and seen["keys"] == 7

    for name, value in object_store.environment().items():
        monkeypatch.setenv(name, value)
    location = Location.of(table)
    written = location.files()  # Parquet parts; _SUCCESS and Spark's bookkeeping start with '_'
    assert written and all(path.endswith(".parquet") for path in written)
    read = pq.read_table(location.path, filesystem=location.filesystem())
    assert sorted(read.column("id").to_pylist()) == list(range(1000))
    assert sorted(set(read.column("key").to_pylist())) == list(range(7))

    settings = json.dumps(seen["settings"])
    assert object_store.secret_key not in settings and object_store.access_key not in settings
    assert seen["settings"]["spark.hadoop.fs.s3a.endpoint"] == by_name
    assert not [line for line in seen["command_lines"] if object_store.secret_key in line]
    assert any("SparkSubmit" in line for line in seen["command_lines"])  # the driver's JVM was among them


def test_a_streaming_query_with_its_checkpoint_on_s3a_resumes_where_it_stopped(
    object_store: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in object_store.environment().items():
        monkeypatch.setenv(name, value)
    root = Location.of(f"s3a://{object_store.bucket}/{prefix('stream')}")
    files = {n: list(range(n * 100, n * 100 + 10 + n)) for n in range(4)}  # sizes differ: a file is its batch

    def put(n: int) -> None:
        (root / f"in/part-{n}.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in files[n]))

    put(0)
    put(1)
    first = run_job(object_store, "stream", (root / "in").spark_url, (root / "checkpoint").spark_url)["batches"]
    # the checkpoint is on the store: Spark committed batches 0 and 1 there
    assert sorted(Path(p).name for p in (root / "checkpoint" / "commits").files()) == ["0", "1"]

    put(2)
    put(3)
    second = run_job(object_store, "stream", (root / "in").spark_url, (root / "checkpoint").spark_url)["batches"]

    assert [b["batch_id"] for b in first] == [0, 1]
    assert [b["batch_id"] for b in second] == [2, 3]  # resumed after the last committed batch, none repeated
    assert sorted(map(tuple, (b["ids"] for b in first))) == [tuple(files[0]), tuple(files[1])]
    assert sorted(map(tuple, (b["ids"] for b in second))) == [tuple(files[2]), tuple(files[3])]  # only new files
    assert sorted(Path(p).name for p in (root / "checkpoint" / "commits").files()) == ["0", "1", "2", "3"]
