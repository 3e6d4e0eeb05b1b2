"""A group coordinator that is still loading (a broker just restarted) is asked again; other errors are not.

The coordinator's answer is faked here: a real broker gives COORDINATOR_LOAD_IN_PROGRESS only in the moments after
it starts, under load (a fresh-clone suite run met it once, test_broker.py's restart), which no test can time."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable


class Answers(KafkaAdmin):
    """A KafkaAdmin whose coordinator answers each request with the next of ``answers`` (an error code, or offsets);
    nothing listens at its address."""

    def __init__(self, answers: list[Any], timeout_s: float = 5.0) -> None:
        super().__init__(KafkaConnection("127.0.0.1:9", cluster="local"), timeout_s=timeout_s)
        self.answers, self.asked = answers, 0

    def _committed_offsets(self, group: str) -> dict[tuple[str, int], int | None]:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return dict(answer)


def test_a_loading_coordinator_is_asked_again_until_it_answers() -> None:
    loading, moving = KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR
    admin = Answers([loading, loading, moving, {("kept", 0): 3}])
    assert admin.committed_offsets("g") == {("kept", 0): 3}
    assert admin.asked == 4


def test_another_error_is_not_asked_again() -> None:
    admin = Answers([KafkaError.GROUP_AUTHORIZATION_FAILED, {("kept", 0): 3}])
    with pytest.raises(KafkaUnavailable, match="fetch the committed offsets of group 'g'"):
        admin.committed_offsets("g")
    assert admin.asked == 1


def test_a_coordinator_that_keeps_loading_is_given_up_on_within_the_timeout() -> None:
    admin = Answers([KafkaError.COORDINATOR_LOAD_IN_PROGRESS], timeout_s=1.5)
    began = time.monotonic()
    with pytest.raises(KafkaUnavailable, match="oordinator load in progress"):
        admin.committed_offsets("g")
    assert time.monotonic() - began < 1.6 and admin.asked >= 3
