"""Sampling is a pure function of the id: consistent across hops and close to the asked rate."""

from __future__ import annotations

import random
import zlib

import pytest

from khipu.trace.sampling import MessageIds, is_sampled, sampling_bucket, sampling_threshold

IDS = [f"order-{n}" for n in range(40_000)]


def test_same_id_gets_the_same_decision_every_time() -> None:
    first = [is_sampled(i, 10) for i in IDS[:2000]]
    again = [is_sampled(i, 10) for i in IDS[:2000]]
    assert first == again


@pytest.mark.parametrize("percent", [1.0, 10.0, 50.0])
def test_sampled_share_is_close_to_the_rate_even_for_sequential_ids(percent: float) -> None:
    share = sum(is_sampled(i, percent) for i in IDS) / len(IDS) * 100
    assert abs(share - percent) < max(0.35, percent * 0.05)


def test_a_message_sampled_at_a_low_rate_is_sampled_at_every_higher_rate() -> None:
    for message_id in IDS[:5000]:
        if is_sampled(message_id, 1):
            assert is_sampled(message_id, 10)


def test_zero_and_hundred_percent_are_none_and_all() -> None:
    assert not any(is_sampled(i, 0) for i in IDS[:1000])
    assert all(is_sampled(i, 100) for i in IDS[:1000])


def test_bucket_of_an_application_id_follows_the_documented_hash() -> None:
    expected = ((zlib.crc32(b"order-7") * 0x9E3779B1) & 0xFFFFFFFF) * 10_000 >> 32
    assert sampling_bucket("order-7") == expected


def test_generated_id_carries_its_bucket_and_is_decided_by_it() -> None:
    assert sampling_bucket("k.0042.abc.1") == 42
    assert is_sampled("k.0042.abc.1", 0.43) and not is_sampled("k.0042.abc.1", 0.42)
    assert sampling_bucket("k.42.abc") == ((zlib.crc32(b"k.42.abc") * 0x9E3779B1) & 0xFFFFFFFF) * 10_000 >> 32


def test_generated_ids_are_unique_across_producers_and_sampled_at_the_asked_rate() -> None:
    first, second = MessageIds(random.Random(1)), MessageIds(random.Random(1))
    drawn = [first.new_if_sampled(sampling_threshold(5.0)) for _ in range(40_000)]
    kept = [i for i in drawn if i is not None]
    assert abs(len(kept) / 40_000 * 100 - 5.0) < 0.4
    assert all(is_sampled(i, 5.0) for i in kept)  # every later hop agrees with the producer's draw
    assert not {first.new() for _ in range(100)} & {second.new() for _ in range(100)}
