from __future__ import annotations

from pathlib import Path

import pytest

from khipu.storage.location import Location, StorageError

# (what a setting holds, the location it names: url, spark_url, path in its file system)
NAMED = [
    ("/var/lib/khipu/archive", "file:///var/lib/khipu/archive", "/var/lib/khipu/archive", "/var/lib/khipu/archive"),
    ("/var/lib/khipu/archive/", "file:///var/lib/khipu/archive", "/var/lib/khipu/archive", "/var/lib/khipu/archive"),
    ("file:///srv/k/a", "file:///srv/k/a", "/srv/k/a", "/srv/k/a"),
    ("file:/srv/k/a", "file:///srv/k/a", "/srv/k/a", "/srv/k/a"),
    ("s3a://khipu-data/prod/archive", "s3a://khipu-data/prod/archive", "s3a://khipu-data/prod/archive",
     "khipu-data/prod/archive"),
    ("s3://khipu-data/prod/archive/", "s3a://khipu-data/prod/archive", "s3a://khipu-data/prod/archive",
     "khipu-data/prod/archive"),
    ("gs://b/p", "gs://b/p", "gs://b/p", "b/p"),
    ("abfs://container@account.dfs.core.windows.net/p", "abfs://container@account.dfs.core.windows.net/p",
     "abfs://container@account.dfs.core.windows.net/p", "container@account.dfs.core.windows.net/p"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "url", "spark_url", "path"), NAMED)
def test_a_setting_names_one_location(value: str, url: str, spark_url: str, path: str) -> None:
    location = Location.of(value, "KHIPU_ARCHIVE")
    assert (location.url, location.spark_url, location.path) == (url, spark_url, path)
    assert location.is_local == url.startswith("file:")


REFUSED = [
    ("", "expected a local folder"),
    ("relative/archive", "an absolute path"),
    ("hdfs://namenode/khipu", "an object store prefix"),
    ("s3a://bucket-only", "a bucket and a prefix"),
    ("s3a://bucket/", "a bucket and a prefix"),
    ("s3a://AKIA:secret@bucket/p", "never the URL"),
    ("s3a://bucket/p?endpoint=x", "never the URL"),
    ("file://otherhost/p", "a file URL on this host"),
]


@pytest.mark.parametrize(("value", "expected"), REFUSED)
def test_a_bad_location_is_refused_naming_the_setting_and_what_is_expected(value: str, expected: str) -> None:
    with pytest.raises(StorageError) as raised:
        Location.of(value, "KHIPU_ARCHIVE")
    message = str(raised.value)
    assert "'KHIPU_ARCHIVE'" in message
    assert expected in message
    assert "secret" not in message


def test_names_under_a_location_stay_under_it() -> None:
    root = Location.of("s3a://b/k")
    assert (root / "hour=2026-12-06-10" / "batch_id=3").url == "s3a://b/k/hour=2026-12-06-10/batch_id=3"
    for escape in ("../other", "/abs", ""):
        with pytest.raises(ValueError, match="a relative name"):
            root / escape


def test_a_local_file_is_replaced_whole_and_listings_skip_work_in_progress(tmp_path: Path) -> None:
    root = Location.of(tmp_path / "root")
    (root / "a/part-0.parquet").write_bytes(b"first")
    (root / "a/part-0.parquet").write_bytes(b"second")
    (root / "a/.part-1.tmp").write_bytes(b"in progress")
    (root / "_commit/record.json").write_text("{}")
    assert (root / "a/part-0.parquet").read_bytes() == b"second"
    assert root.files(recursive=True) == [str(tmp_path / "root/a/part-0.parquet")]
    assert sorted(p.name for p in (tmp_path / "root/a").iterdir()) == [".part-1.tmp", "part-0.parquet"]
    assert root.child_folders() == ["_commit", "a"]
    (root / "a").delete()
    assert not (tmp_path / "root/a").exists()
    with pytest.raises(FileNotFoundError):
        (root / "a/part-0.parquet").read_bytes()
