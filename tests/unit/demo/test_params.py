"""A manual trigger's parameters become a validated demo configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.demo.faults import DemoConfigError
from khipu.demo.params import burst_run_id, demo_config_from_params


def build(params: dict[str, object]):  # type: ignore[no-untyped-def]
    return demo_config_from_params(
        params, bootstrap_servers="h:1", trace_topic="t", ledger_dir=Path("/tmp/l"), run_id="r1"
    )


def test_params_map_onto_the_demo_config() -> None:
    config = build({"count": 20, "rate_per_s": 5, "faults": {"delay": 0.5}, "seed": 9, "sampling_percent": 50})
    assert (config.count, config.rate_per_s, config.seed, config.sampling_percent) == (20, 5.0, 9, 50)
    assert config.faults.delay == 0.5 and config.faults.consumer_skip == 0.0
    assert config.ledger_path == Path("/tmp/l/burst-r1.jsonl")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"faults": {"meteor": 0.1}}, "demo setting 'faults': got ['meteor']; expected fault names among:"),
        ({"faults": [1, 2]}, "demo setting 'faults': got [1, 2]; expected an object of fault name -> probability"),
        ({"faults": {"delay": 3}}, "demo setting 'faults.delay': got 3; expected a probability in [0, 1]"),
        ({"count": 0}, "demo setting 'count': got 0; expected an integer >= 1"),
        ({"rate_per_s": 0}, "demo setting 'rate_per_s': got 0.0; expected messages per second"),
    ],
)
def test_bad_params_name_what_was_wrong(params: dict[str, object], message: str) -> None:
    with pytest.raises(DemoConfigError) as caught:
        build(params)
    assert str(caught.value).startswith(message)


def test_bursts_of_runs_a_second_apart_or_a_day_apart_get_ids_of_their_own() -> None:
    # Airflow's run ids of manual triggers: only the time differs, often only in its first digits
    runs = [f"manual__2026-12-{day:02d}T10:{minute:02d}:07.123456+00:00" for day in (6, 7) for minute in (0, 1)]
    runs += ["scheduled__2026-12-06T10:00:00+00:00", "backfill__2026-12-06T10:00:00+00:00"]
    ids = [burst_run_id(run) for run in runs]
    assert len(set(ids)) == len(runs), dict(zip(runs, ids, strict=True))
    assert ids == [burst_run_id(run) for run in runs]  # a retried task writes to the same burst
    for burst in ids:  # the demo config takes it (letters, digits and '-' only)
        config = demo_config_from_params(
            {}, bootstrap_servers="h:1", trace_topic="t", ledger_dir=Path("/l"), run_id=burst
        )
        assert config.ledger_path == Path(f"/l/burst-{burst}.jsonl")


def test_a_thousand_bursts_never_share_an_id() -> None:
    # the old prefix (the run id's last 8 characters) left ~100 values: ten bursts collided with ~37 % chance
    runs = [f"manual__2026-12-06T{n // 3600:02d}:{n // 60 % 60:02d}:{n % 60:02d}.{n * 7919 % 10**6:06d}+00:00"
            for n in range(0, 86_400, 86)]  # fmt: skip
    assert len({burst_run_id(run) for run in runs}) == len(runs) == 1005
