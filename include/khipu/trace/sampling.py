"""Consistent sampling: the decision is a function of the message id alone.

Every hop that sees the same id reaches the same decision, so a sampled message is traced along
its whole route and an unsampled one nowhere. The algorithm is part of the trace format
(docs/trace-format.md) so components written in other languages can implement it:

    bucket  = B                                   if the id is Khipu-generated, "k.BBBB.<rest>" (B: 4 ASCII digits)
            = ((crc32(utf8(id)) * 0x9E3779B1) mod 2^32) * 10000 >> 32      otherwise
    sampled = bucket < round(sampling_percent * 100)

Ids that Khipu generates carry their bucket, drawn at random when the message is produced: the
producer decides sampling with one random draw and only builds an id for a sampled message, so
an unsampled message costs almost nothing (bench/tracing_overhead.py).
"""

from __future__ import annotations

import itertools
import random
import secrets
import zlib

SAMPLING_BUCKETS = 10_000
_GENERATED_PREFIX = "k."
_FIBONACCI_32 = 0x9E3779B1


def sampling_bucket(message_id: str) -> int:
    """The id's bucket in [0, 10000): 0.01 % of traffic per bucket."""
    digits = message_id[2:6]
    if message_id.startswith(_GENERATED_PREFIX) and message_id[6:7] == "." and digits.isascii() and digits.isdigit():
        return int(message_id[2:6])
    return ((zlib.crc32(message_id.encode("utf-8")) * _FIBONACCI_32) & 0xFFFFFFFF) * SAMPLING_BUCKETS >> 32


def sampling_threshold(sampling_percent: float) -> int:
    """Buckets below this number are sampled."""
    return max(0, min(SAMPLING_BUCKETS, round(sampling_percent * 100)))


def is_sampled(message_id: str, sampling_percent: float) -> bool:
    """Whether the message with this id is traced at a sampling rate of ``sampling_percent``."""
    return sampling_bucket(message_id) < sampling_threshold(sampling_percent)


class MessageIds:
    """Generates ids for one producer: ``k.<bucket>.<producer prefix>.<counter>``, unique across producers."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._random = (rng or random.Random()).random
        self._prefix = secrets.token_hex(6)
        self._counter = itertools.count()

    def new(self) -> str:
        """An id with a uniformly drawn bucket."""
        return self.with_bucket(int(self._random() * SAMPLING_BUCKETS))

    def new_if_sampled(self, threshold: int) -> str | None:
        """An id when the draw falls below ``threshold`` (see :func:`sampling_threshold`), else ``None``."""
        bucket = int(self._random() * SAMPLING_BUCKETS)
        return self.with_bucket(bucket) if bucket < threshold else None

    def with_bucket(self, bucket: int) -> str:
        """An id carrying ``bucket``, which the caller drew uniformly from [0, 10000)."""
        return f"k.{bucket:04d}.{self._prefix}.{next(self._counter):x}"
