"""spark/detector.py's arguments become a valid job, with the library's defaults."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from khipu.detector.model import DetectorConfig

ENTRY = Path(__file__).resolve().parents[3] / "spark" / "detector.py"


def load_entry():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("detector_entry", ENTRY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_are_the_detector_configs_and_the_state_folder() -> None:
    job, master = load_entry().parse_args([])
    assert job.detector == DetectorConfig()
    assert job.checkpoint_dir.parts[-2:] == ("detector", "checkpoint")
    assert (job.source, job.lost_topic, job.trace_topic, master) == (
        "khipu_kafka",
        "khipu.lost",
        "khipu.traces",
        "local[*]",
    )


def test_arguments_override_and_an_empty_lost_topic_turns_it_off() -> None:
    job, _ = load_entry().parse_args(["--grace-ms", "5000", "--lost-topic", "", "--trigger-seconds", "2"])
    assert (job.detector.grace_ms, job.lost_topic, job.trigger_seconds) == (5000, None, 2.0)
