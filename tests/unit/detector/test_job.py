"""Where a directly started detector or reconcile driver listens."""

from __future__ import annotations

import os

import pytest

from khipu.detector.job import driver_settings

LOOPBACK = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local[*]", LOOPBACK),
        ("local[2]", LOOPBACK),
        ("spark://127.0.0.1:7077", LOOPBACK),
        ("spark://localhost:7077", LOOPBACK),
        ("spark://spark-master.internal:7077", {}),  # executors elsewhere must reach the driver
        ("yarn", {}),
    ],
)
def test_a_driver_on_this_machine_only_listens_on_loopback(
    master: str, expected: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "")  # so that the test's end restores what was there
    monkeypatch.delenv("SPARK_LOCAL_IP")
    assert driver_settings(master) == expected
    assert ("SPARK_LOCAL_IP" in os.environ) == bool(expected)  # the web UI follows it


def test_an_address_the_environment_chose_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    driver_settings("local[*]")
    assert os.environ["SPARK_LOCAL_IP"] == "10.1.2.3"
