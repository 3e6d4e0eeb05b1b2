"""The fault plan is deterministic, close to its rates, and its settings are validated."""

from __future__ import annotations

import pytest

from khipu.demo.faults import DemoConfigError, Fault, FaultPlan, FaultRates


def test_same_seed_and_key_give_the_same_decision() -> None:
    plan = FaultPlan(FaultRates(consumer_skip=0.3), seed=4)
    keys = [f"m-{n}" for n in range(500)]
    assert [plan.injects(Fault.CONSUMER_SKIP, k) for k in keys] == [plan.injects(Fault.CONSUMER_SKIP, k) for k in keys]


def test_different_seeds_strike_different_messages() -> None:
    keys = [f"m-{n}" for n in range(500)]
    first = {k for k in keys if FaultPlan(FaultRates(delay=0.2), seed=1).injects(Fault.DELAY, k)}
    second = {k for k in keys if FaultPlan(FaultRates(delay=0.2), seed=2).injects(Fault.DELAY, k)}
    assert first != second


def test_strike_share_follows_the_rate_and_zero_never_strikes() -> None:
    plan = FaultPlan(FaultRates(processor_drop=0.05))
    keys = [f"m-{n}" for n in range(20_000)]
    share = sum(plan.injects(Fault.PROCESSOR_DROP, k) for k in keys) / len(keys)
    assert 0.04 < share < 0.06
    assert not any(plan.injects(Fault.CONSUMER_SKIP, k) for k in keys)


def test_faults_parse_from_name_rate_items() -> None:
    rates = FaultRates.parse(["consumer_skip=0.01", "trace_loss=0.5"])
    assert rates.consumer_skip == 0.01 and rates.trace_loss == 0.5 and rates.delay == 0.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("skip=0.1", "demo setting 'fault': got 'skip=0.1'; expected 'name=rate' with name one of: consumer_skip"),
        ("delay", "demo setting 'fault': got 'delay'; expected 'name=rate'"),
        ("delay=often", "demo setting 'faults.delay': got 'often'; expected a probability in [0, 1]"),
        ("delay=1.5", "demo setting 'faults.delay': got 1.5; expected a probability in [0, 1]"),
    ],
)
def test_bad_fault_spec_names_what_was_wrong(spec: str, message: str) -> None:
    with pytest.raises(DemoConfigError) as caught:
        FaultRates.parse([spec])
    assert str(caught.value).startswith(message)
