"""Pausing and resuming demo groups through the control file."""

from __future__ import annotations

from pathlib import Path

from khipu.demo.control import DemoControl


def test_a_paused_group_is_seen_by_a_reader_and_resuming_clears_it(tmp_path: Path) -> None:
    writer = DemoControl(tmp_path / "control.json")
    reader = DemoControl(tmp_path / "control.json", check_interval_s=0)
    assert not reader.is_paused("sink")
    assert writer.set_paused("sink", True) == {"sink"}
    assert reader.is_paused("sink") and not reader.is_paused("other")
    assert writer.set_paused("sink", False) == frozenset()
    assert not reader.is_paused("sink")


def test_a_corrupt_control_file_pauses_nothing(tmp_path: Path) -> None:
    (tmp_path / "control.json").write_text("{not json")
    assert DemoControl(tmp_path / "control.json", check_interval_s=0).paused() == frozenset()
