"""A group coordinator that is still loading (a broker just restarted) is asked again; other errors are not; and
which coordinator a group has.

The coordinator's answer is faked in the first tests: a real broker's consumer client waits out a loading coordinator
itself, so the answers that reach KafkaAdmin's own retry come only in moments no test can time. The real loading
coordinator is met by every fresh broker's first start (tests/integration/test_broker.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable
from khipu.kafka.admin import group_partition, one_group_per_coordinator


class Answers(KafkaAdmin):
    """A KafkaAdmin whose coordinator answers each request with the next of ``answers`` (an error code, or offsets);
    nothing listens at its address."""

    def __init__(self, answers: list[Any], timeout_s: float = 5.0) -> None:
        super().__init__(KafkaConnection("127.0.0.1:9", cluster="local"), timeout_s=timeout_s)
        self.answers, self.asked = answers, 0

    def _committed_offsets(self, group: str, positions: Any) -> dict[tuple[str, int], int]:
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


@pytest.mark.parametrize(
    ("group", "partitions", "expected"),
    [
        ("hello", 50, 99162322 % 50),  # Java: "hello".hashCode() == 99162322
        ("", 10, 0),  # hashCode 0
        ("polygenelubricants", 7, 0),  # hashCode Integer.MIN_VALUE, which Kafka's Utils.abs makes 0
        ("Aa", 10, 2112 % 10),  # "Aa" and "BB" share hashCode 2112
        ("BB", 10, 2112 % 10),
        ("é", 100, 233 % 100),  # one UTF-16 unit
        ("😀", 1000, (0xD83D * 31 + 0xDE00) % 1000),  # two UTF-16 units (a surrogate pair), as Java counts them
        ("khipu-detector", 50, 28),  # hashCode -1930674078 (negative: its absolute value is taken), from Java 17
        ("demo-enricher", 10, 4),  # hashCode 348605724, from Java 17
        ("khipu-detector", 1, 0),
    ],
)
def test_a_groups_coordinator_partition_is_javas_string_hash_as_kafka_takes_it(
    group: str, partitions: int, expected: int
) -> None:
    assert group_partition(group, partitions) == expected


def test_one_group_per_coordinator_names_a_group_for_each_partition_in_order() -> None:
    groups = one_group_per_coordinator(10)
    assert len(set(groups)) == 10
    assert [group_partition(g, 10) for g in groups] == list(range(10))
    with pytest.raises(ValueError, match="at least one partition"):
        group_partition("g", 0)
