"""Emitter settings are validated at construction with errors naming the setting."""

from __future__ import annotations

from typing import Any

import pytest

from khipu.tracing import TraceEmitterConfig, TracingConfigError


def config(**changes: Any) -> TraceEmitterConfig:
    values: dict[str, Any] = {"bootstrap_servers": "127.0.0.1:9092", "location": "orders-api", "cluster": "local"}
    values.update(changes)
    return TraceEmitterConfig(**values)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"bootstrap_servers": " "},
            "tracing setting 'bootstrap_servers': got ' '; expected 'host:port[,host:port...]'",
        ),
        ({"location": "orders api"}, "tracing setting 'location': got 'orders api'; expected 1-249 characters"),
        ({"topic": ""}, "tracing setting 'topic': got ''; expected 1-249 characters"),
        ({"queue_max_traces": 0}, "tracing setting 'queue_max_traces': got 0; expected an integer in [1, 10000000]"),
        (
            {"batch_linger_ms": 0},
            "tracing setting 'batch_linger_ms': got 0; expected an integer of milliseconds in [1, 5000]",
        ),
        ({"batch_linger_ms": 2.5}, "tracing setting 'batch_linger_ms': got 2.5; expected an integer of milliseconds"),
        ({"delivery_timeout_ms": 10}, "tracing setting 'delivery_timeout_ms': got 10; expected an integer >= 1000"),
        (
            {"commit_flush_timeout_s": -1},
            "tracing setting 'commit_flush_timeout_s': got -1; expected a number of seconds",
        ),
        (
            {"mark_interval_s": 0},
            "tracing setting 'mark_interval_s': got 0; expected a number of seconds in [0.1, 3600]",
        ),
        ({"mark_memory_s": -1}, "tracing setting 'mark_memory_s': got -1; expected a number of seconds in [0, 3600]"),
        ({"mark_memory_s": True}, "tracing setting 'mark_memory_s': got True; expected a number of seconds"),
        (
            {"producer_config": {"acks": "0"}},
            "tracing setting 'producer_config.acks': got '<set>'; expected not set here",
        ),
    ],
)
def test_invalid_setting_is_named_with_its_value(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(TracingConfigError) as caught:
        config(**changes)
    assert str(caught.value).startswith(message)


def test_security_settings_are_not_shown_in_the_repr() -> None:
    shown = repr(config(producer_config={"sasl.password": "hunter2"}))
    assert "hunter2" not in shown


def test_from_env_reads_the_trace_cluster_and_requires_it() -> None:
    built = TraceEmitterConfig.from_env(
        "app", {"KHIPU_TRACE_BOOTSTRAP_SERVERS": "h:1", "KHIPU_CLUSTER": "east", "KHIPU_TRACE_TOPIC": "t.traces"}
    )
    assert (built.bootstrap_servers, built.cluster, built.topic, built.location) == ("h:1", "east", "t.traces", "app")
    with pytest.raises(TracingConfigError, match="KHIPU_TRACE_BOOTSTRAP_SERVERS"):
        TraceEmitterConfig.from_env("app", {})
