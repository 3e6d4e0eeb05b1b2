"""KHIPU_DATA_URL alone moves the local stack's data into its own object store: the stack hands its processes the
store's endpoint and credentials then, and nothing otherwise."""

from __future__ import annotations

import stat
from pathlib import Path

from khipu.localstack.object_store import ObjectStoreSpec
from khipu.localstack.stack import data_environment
from khipu.settings import KhipuSettings


def test_local_data_needs_nothing_and_an_object_store_url_gets_the_stacks_store(tmp_path: Path) -> None:
    spec = ObjectStoreSpec(tmp_path / "s3proxy", port=19000)
    spec.directory.mkdir()
    local = KhipuSettings.from_env({"KHIPU_STATE_DIR": str(tmp_path)})
    assert data_environment(local, spec) == {}
    assert not spec.credentials_path.exists()  # nothing drawn for a stack that keeps its data in folders

    remote = KhipuSettings.from_env({"KHIPU_STATE_DIR": str(tmp_path), "KHIPU_DATA_URL": "s3a://khipu/stack"})
    env = data_environment(remote, spec)
    assert env["KHIPU_S3_ENDPOINT"] == "http://127.0.0.1:19000"
    assert env["AWS_ACCESS_KEY_ID"] and len(env["AWS_SECRET_ACCESS_KEY"]) >= 30
    assert stat.S_IMODE(spec.credentials_path.stat().st_mode) == 0o600
    assert data_environment(remote, spec) == env  # the same credentials the store was started with, every time


def test_an_object_store_of_ones_own_is_left_to_its_own_environment(tmp_path: Path) -> None:
    spec = ObjectStoreSpec(tmp_path / "s3proxy")
    settings = KhipuSettings.from_env(
        {"KHIPU_STATE_DIR": str(tmp_path), "KHIPU_DATA_URL": "s3a://b/p", "KHIPU_S3_ENDPOINT": "https://minio:9000"}
    )
    assert data_environment(settings, spec) == {}
