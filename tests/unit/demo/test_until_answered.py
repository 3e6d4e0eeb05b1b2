"""The demo's applications ask the cluster again through an outage and give up only on what asking again cannot fix.

The errors are confluent-kafka's own ``KafkaError`` values, raised by a callable standing in for the cluster: a
broker that answers "Waiting for coordinator" and then answers is a timing a real broker gives only now and then
(the outage tests meet it on real parts)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from khipu.demo import pipeline
from khipu.demo.pipeline import until_answered


def answers_after(errors: list[int], answer: str) -> tuple[Callable[[], str], list[int]]:
    asked: list[int] = []

    def call() -> str:
        asked.append(1)
        if len(asked) <= len(errors):
            raise KafkaException(KafkaError(errors[len(asked) - 1]))
        return answer

    return call, asked


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "_RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(pipeline, "_RETRY_MAX_S", 0.02)


def test_transient_errors_are_asked_again_until_answered() -> None:
    call, asked = answers_after([KafkaError._WAIT_COORD, KafkaError.NOT_LEADER_FOR_PARTITION], "end")
    assert until_answered(call, "sink", "the end", threading.Event()) == "end"
    assert len(asked) == 3


def test_an_error_asking_again_cannot_fix_gives_up_at_once_naming_it() -> None:
    call, asked = answers_after([KafkaError.GROUP_AUTHORIZATION_FAILED], "end")
    with pytest.raises(pipeline._GaveUp, match="sink: the end refused"):
        until_answered(call, "sink", "the end", threading.Event())
    assert len(asked) == 1


def test_a_stopping_demo_gives_up_asking() -> None:
    stop = threading.Event()
    stop.set()
    call, asked = answers_after([KafkaError._WAIT_COORD] * 5, "end")
    with pytest.raises(pipeline._GaveUp, match="not answered before the demo stopped"):
        until_answered(call, "sink", "the end", stop)
    assert len(asked) == 1


def test_metadata_is_refreshed_before_each_retry_and_past_its_limit_it_gives_up_naming_the_error() -> None:
    refreshed: list[int] = []
    call, asked = answers_after([KafkaError.NOT_LEADER_FOR_PARTITION] * 2, "end")
    assert until_answered(call, "sink", "the end", threading.Event(), refresh=lambda: refreshed.append(1)) == "end"
    assert (len(asked), len(refreshed)) == (3, 2)  # a stale leader: the metadata asked again before each retry
    call, asked = answers_after([KafkaError.NOT_LEADER_FOR_PARTITION] * 1_000, "end")
    with pytest.raises(pipeline._GaveUp, match=r"the end not answered within 0 s \(.*[Ll]eader"):
        until_answered(call, "sink", "the end", threading.Event(), limit_s=0.1)
    assert 2 <= len(asked) < 20  # retries of 10-20 ms until 100 ms had gone by, then no more
