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


def test_fault_rates_set_while_running_override_the_start_rates_and_survive_pausing(tmp_path: Path) -> None:
    from khipu.demo.faults import Fault, FaultPlan, FaultRates
    from khipu.demo.pipeline import SteeredPlan

    writer = DemoControl(tmp_path / "control.json")
    reader = DemoControl(tmp_path / "control.json", check_interval_s=0)
    plan = SteeredPlan(FaultPlan(FaultRates(consumer_skip=0.0, delay=1.0)), reader)
    ids = [f"m{i}" for i in range(200)]
    assert not any(plan.injects(Fault.CONSUMER_SKIP, i) for i in ids)
    assert writer.set_faults({"consumer_skip": 1.0}) == {"consumer_skip": 1.0}
    writer.set_paused("sink", True)  # pausing keeps the rates, setting rates keeps the pause
    assert all(plan.injects(Fault.CONSUMER_SKIP, i) for i in ids) and reader.is_paused("sink")
    assert all(plan.injects(Fault.DELAY, i) for i in ids)  # not overridden: the start rate
    assert writer.set_faults({"delay": 0.0}) == {"consumer_skip": 1.0, "delay": 0.0}
    assert not any(plan.injects(Fault.DELAY, i) for i in ids)
    assert writer.set_faults({}, reset=True) == {}
    assert not any(plan.injects(Fault.CONSUMER_SKIP, i) for i in ids) and reader.is_paused("sink")
