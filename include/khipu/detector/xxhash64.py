"""Spark's ``xxhash64`` of strings (XXH64 of their UTF-8 bytes, seed 42), computed with numpy over a whole column.

The detector keeps a message's state in a hash bucket of its id, fixed for a checkpoint (``--buckets``). The
bucket was first computed by Spark's SQL function (``pmod(xxhash64(message_id), buckets)``); the records are now
decoded in Python (:mod:`khipu.detector.parse`), so the same bucket must come out of Python, bit for bit, or a
message's later traces would meet another bucket's state. XXH64 is the published algorithm
(https://github.com/Cyan4973/xxHash, ``doc/xxhash_spec.md``); Spark's ``XXH64.hashUnsafeBytes`` reads the same
little-endian words. ``tests/integration/detector/test_parse.py`` holds this to Spark's own function.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

SPARK_SEED = 42  # the seed of Spark's xxhash64()

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_U64 = npt.NDArray[np.uint64]


def _rotl(x: _U64, bits: int) -> _U64:
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


def _round(acc: _U64, lane: _U64) -> _U64:
    return _rotl(acc + lane * _P2, 31) * _P1


def _merge(acc: _U64, v: _U64) -> _U64:
    return (acc ^ _round(np.zeros_like(v), v)) * _P1 + _P4


def _hash_of_length(data: npt.NDArray[np.uint8], length: int, seed: int) -> _U64:
    """XXH64 of ``n`` byte strings of one ``length``, given as an (n, length) matrix."""
    n = data.shape[0]
    words = length // 8
    lanes = np.ascontiguousarray(data[:, : words * 8]).view("<u8").reshape(n, words).astype(np.uint64)
    s = np.uint64(seed)
    with np.errstate(over="ignore"):
        if length >= 32:
            v1 = np.full(n, s + _P1 + _P2, np.uint64)
            v2 = np.full(n, s + _P2, np.uint64)
            v3 = np.full(n, s, np.uint64)
            v4 = np.full(n, s - _P1, np.uint64)
            stripes = length // 32
            for stripe in range(stripes):
                v1 = _round(v1, lanes[:, 4 * stripe])
                v2 = _round(v2, lanes[:, 4 * stripe + 1])
                v3 = _round(v3, lanes[:, 4 * stripe + 2])
                v4 = _round(v4, lanes[:, 4 * stripe + 3])
            h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
            for v in (v1, v2, v3, v4):
                h = _merge(h, v)
            first_word = stripes * 4
        else:
            h = np.full(n, s + _P5, np.uint64)
            first_word = 0
        h = h + np.uint64(length)
        for word in range(first_word, words):
            h = _rotl(h ^ _round(np.zeros(n, np.uint64), lanes[:, word]), 27) * _P1 + _P4
        at = words * 8
        if length - at >= 4:
            half = np.ascontiguousarray(data[:, at : at + 4]).view("<u4").reshape(n).astype(np.uint64)
            h = _rotl(h ^ (half * _P1), 23) * _P2 + _P3
            at += 4
        for byte in range(at, length):
            h = _rotl(h ^ (data[:, byte].astype(np.uint64) * _P5), 11) * _P1
        h ^= h >> np.uint64(33)
        h *= _P2
        h ^= h >> np.uint64(29)
        h *= _P3
        h ^= h >> np.uint64(32)
    return h


def xxhash64(strings: pa.Array | pa.ChunkedArray, seed: int = SPARK_SEED) -> npt.NDArray[np.int64]:
    """Spark's ``xxhash64(s)`` of each string (as its signed 64-bit result); null strings hash to the seed, as in
    Spark."""
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks() if strings.num_chunks else pa.array([], pa.string())
    binary = strings.cast(pa.large_binary())
    n = len(binary)
    out = np.full(n, seed, np.uint64)
    if not n:
        return out.view(np.int64)
    valid = np.asarray(binary.is_valid(), dtype=bool)
    offsets = np.frombuffer(binary.buffers()[1], np.int64, n + 1, binary.offset * 8)
    data_buffer = binary.buffers()[2]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    for length in np.unique(lengths[valid]):
        rows = np.flatnonzero(valid & (lengths == length))
        at = offsets[rows][:, None] + np.arange(int(length), dtype=np.int64)[None, :]
        out[rows] = _hash_of_length(data[at] if length else np.zeros((len(rows), 0), np.uint8), int(length), seed)
    return out.view(np.int64)


def spark_bucket(strings: pa.Array | pa.ChunkedArray, buckets: int) -> npt.NDArray[np.int32]:
    """``pmod(xxhash64(s), buckets)``: each string's bucket, as the detector has always kept it."""
    return np.mod(xxhash64(strings), buckets).astype(np.int32)  # numpy's mod of a positive divisor is >= 0: pmod
