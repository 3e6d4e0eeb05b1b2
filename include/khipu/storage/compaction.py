"""Compaction: an archive hour's micro-batch files merged into a bounded number of files, with no rename.

An archive hour is a folder ``hour=H`` with a folder per micro-batch that wrote in it (``batch_id=N/part-0.parquet``,
committed by :mod:`khipu.storage.batches`): about 1,800 small files an hour at a 2 s trigger. Compacting a closed
hour rewrites it as

    hour=H/batch_id=-2/part-<generation>-<b>-of-<P>.parquet      b = 0 .. P-1

P files of about ``target_bytes`` each (P = the hour's bytes / target, rounded up; at least 1, at most
:data:`MAX_PARTS`). File ``b`` holds every row whose message id hashes to bucket ``b`` (:func:`key_buckets`), each
row once (a row written twice is kept once: :func:`distinct_rows`), in the order and row groups the archive's
:class:`CompactionSpec` says (the verdict archive: sorted by message id and hop in row groups of 8,192, as a
micro-batch's file; the trace archive: batch after batch, as the detector wrote them). What an hour's rows are does
not change; how many files hold them does.

**The names.** ``batch_id=-2`` is an integer partition value like a micro-batch's, so Spark's partition discovery
(reconciliation reads an archive with ``basePath``: ``hour`` and ``batch_id`` columns) reads a compacted hour as it
read the micro-batches. No detector batch has a negative id (a batch's id is ``epoch_s * 10**8 + n``; the trace
archive's retention writes ``batch_id=-1`` for an hour it reduced to what a pending resend needs). The bucket in a
file's name lets a reader of a few messages open only their files (:func:`select_parts`): a point lookup in a
compacted hour reads one file of it. A generation is a name no earlier run used (random), so that a run never
overwrites a file another run wrote.

**The protocol** (crash-safe on an object store, which cannot rename; a local folder the same):

1. list the hour once (:func:`list_hour`); every Parquet file under its batch folders is an input, an earlier
   generation's parts included;
2. stream the inputs into P local spill files, by bucket (memory: one record batch, then one bucket);
3. per bucket: read its spill, keep each row once, sort, and write its part whole
   (:meth:`~khipu.storage.location.Location.write_bytes`: a reader sees the whole file or none);
4. only when every part is written, delete the inputs: each batch folder the listing found (whole: nothing writes
   into a batch folder of a closed hour again, see below), then each earlier generation's part, by name.

A crash before step 4 ends leaves the hour holding some rows twice (in the new parts and in inputs not yet
deleted); every reader counts a trace or a verdict found twice once, and the hour still needs compaction (it
holds a batch folder, or two generations: :attr:`HourListing.compacted` is false), so the next run reads all of
it and writes each row once. A crash during step 3 leaves part of a generation: copies again, removed the same
way. No step deletes a file whose rows are not in whole files written before it; two runs at once (the retention
DAG runs one at a time) leave copies, never a loss, as each deletes only what it listed.

**Which hours** is the caller's (:mod:`khipu.retention.compaction`): only closed ones, where no micro-batch will
write again: the detector has read past the hour's end by a margin, and the batch the archive's commit record
names (the only one Spark may replay) wrote nothing in it.
"""

from __future__ import annotations

import math
import re
import tempfile
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from khipu.storage.location import Location
from khipu.storage.parquet import parquet_bytes

BATCH_PREFIX = "batch_id="
COMPACTED_BATCH_ID = -2  # the compacted parts' folder: an integer partition value no detector batch has
COMPACTED_FOLDER = f"{BATCH_PREFIX}{COMPACTED_BATCH_ID}"
PART = re.compile(r"part-(?P<generation>[0-9a-f]+)-(?P<bucket>\d{5})-of-(?P<parts>\d{5})\.parquet")
MAX_PARTS = 1_000  # files a compacted hour has at most (each spill file is open at once while the hour is read)
READ_ROWS = 65_536  # rows read at a time from the inputs

_BASE = np.uint64(0x100000001B3)  # the polynomial hash's base (FNV's prime)
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))  # splitmix64's finaliser
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # combines the probe columns' hashes of a row


class CompactionError(ValueError):
    """An hour that cannot be compacted as asked: names what was wrong and what was expected."""


@dataclass(frozen=True, slots=True)
class CompactionSpec:
    """How one archive's compacted files are made (declared beside the archive: trace/, verdicts/)."""

    name: str  # "trace archive", "verdict archive": in messages
    schema: pa.Schema  # the archive's columns: every input is read as this (a column an older file lacks: null)
    sort_by: tuple[str, ...]  # the rows' order in a file (none: as the inputs held them, batch after batch)
    row_group_rows: int  # a point lookup decodes a row group of this many rows per file
    key: str = "message_id"  # what a reader looks rows up by: files are bucketed by it
    probe: tuple[str, ...] = ("message_id",)  # columns that seldom repeat together: rows equal in all are compared


@dataclass(frozen=True, slots=True)
class ArchivedFile:
    """A data file of an hour: its name under the hour folder (``batch_id=N/part-0.parquet``) and bytes."""

    name: str
    size: int

    @property
    def folder(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def part(self) -> re.Match[str] | None:
        """A compacted part's name, parsed (None: a micro-batch's file, or another)."""
        if self.folder != COMPACTED_FOLDER or self.name.count("/") != 1:
            return None
        return PART.fullmatch(self.name.split("/", 1)[1])


@dataclass(frozen=True, slots=True)
class HourListing:
    """An archive hour as one listing found it."""

    hour_folder: str  # hour=YYYY-MM-DD-HH
    folders: tuple[str, ...]  # its batch folders (batch_id=…), holding data or not
    files: tuple[ArchivedFile, ...]  # every Parquet file under them

    @property
    def bytes(self) -> int:
        return sum(file.size for file in self.files)

    @property
    def batches(self) -> list[int]:
        """The detector micro-batches (ids >= 0) with data in the hour."""
        return sorted({batch for file in self.files if (batch := _batch_id(file.folder)) is not None and batch >= 0})

    @property
    def generations(self) -> list[str]:
        """The compactions whose parts are in it (two or more: a run stopped before it deleted its inputs)."""
        return sorted({part["generation"] for file in self.files if (part := file.part) is not None})

    @property
    def compacted(self) -> bool:
        """No micro-batch's data left, the parts of one compaction at most, and nothing else in their folder."""
        stray = [f for f in self.files if f.folder == COMPACTED_FOLDER and f.part is None]
        return not self.batches and len(self.generations) <= 1 and not stray


@dataclass(frozen=True, slots=True)
class Compaction:
    """What compacting an hour did: files and bytes before and after, rows read and kept."""

    hour_folder: str
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    rows_before: int  # rows read, copies included
    rows_after: int  # rows written, each once


def list_hour(root: Location, hour_folder: str) -> HourListing:
    """The hour's batch folders and data files (two listings of the hour folder)."""
    folder = root / hour_folder
    base = folder.path.rstrip("/") + "/"
    files = sorted(
        (
            ArchivedFile(info.path.removeprefix(base), int(info.size or 0))
            for info in folder.file_infos(recursive=True)
            if info.path.endswith(".parquet") and info.path.removeprefix(base).startswith(BATCH_PREFIX)
        ),
        key=lambda file: (_batch_id(file.folder) or 0, file.name),
    )  # in batch order (a compaction's parts first): the rows of an archive that keeps them as written stay in order
    return HourListing(hour_folder, tuple(folder.child_folders(BATCH_PREFIX)), tuple(files))


def parts_for(total_bytes: int, target_bytes: int) -> int:
    """How many files an hour of ``total_bytes`` is compacted into: about ``target_bytes`` each."""
    if target_bytes < 1:
        raise CompactionError(f"target_bytes: got {target_bytes}; expected a size in bytes >= 1")
    return min(MAX_PARTS, max(1, math.ceil(total_bytes / target_bytes)))


def compact_hour(
    root: Location,
    listing: HourListing,
    spec: CompactionSpec,
    target_bytes: int,
    *,
    generation: str | None = None,
    spill_dir: Path | None = None,
) -> Compaction:
    """Rewrite the listed hour as parts of about ``target_bytes`` by the protocol of the module's doc; the caller
    has checked the hour is closed. ``spill_dir``: where the hour is spilled by bucket meanwhile (a local folder;
    default: the system's temporary folder)."""
    generation = generation or uuid.uuid4().hex[:12]
    if not re.fullmatch(r"[0-9a-f]+", generation) or generation in listing.generations:
        raise CompactionError(
            f"generation: got {generation!r}; expected lower-case hex not used in {listing.hour_folder} "
            f"({', '.join(listing.generations) or 'none used'})"
        )
    folder = root / listing.hour_folder
    parts = parts_for(listing.bytes, target_bytes)
    written: list[ArchivedFile] = []
    rows_before = rows_after = 0
    if listing.files:
        inputs = ds.dataset(
            [(folder / file.name).path for file in listing.files],
            schema=spec.schema,
            format="parquet",
            filesystem=root.filesystem(),
        )
        with tempfile.TemporaryDirectory(prefix="khipu-compaction-", dir=spill_dir) as work:
            for bucket, spilled in enumerate(_spill(inputs, spec, parts, Path(work))):
                with pa.memory_map(str(spilled)) as source:
                    table = pa.ipc.open_stream(source).read_all()
                spilled.unlink()
                if not table.num_rows:
                    continue
                rows_before += table.num_rows
                table = distinct_rows(table, spec.probe)
                if spec.sort_by:
                    table = table.sort_by([(name, "ascending") for name in spec.sort_by])
                rows_after += table.num_rows
                name = f"{COMPACTED_FOLDER}/part-{generation}-{bucket:05d}-of-{parts:05d}.parquet"
                data = parquet_bytes(table, row_group_size=spec.row_group_rows)
                (folder / name).write_bytes(data)
                written.append(ArchivedFile(name, len(data)))
    # every part is whole: only now do the inputs go (a crash from here leaves copies, which the next run removes)
    for name in sorted(set(listing.folders) | {file.folder for file in listing.files}):
        if name != COMPACTED_FOLDER:
            (folder / name).delete()
    for file in listing.files:
        if file.folder == COMPACTED_FOLDER:
            (folder / file.name).delete()
    return Compaction(
        listing.hour_folder,
        len(listing.files),
        len(written),
        listing.bytes,
        sum(file.size for file in written),
        rows_before,
        rows_after,
    )


def _spill(inputs: ds.Dataset, spec: CompactionSpec, parts: int, work: Path) -> list[Path]:
    """The inputs' rows into one Arrow stream file per bucket of their key (uncompressed: local and short-lived)."""
    paths = [work / f"bucket-{bucket:05d}.arrow" for bucket in range(parts)]
    sinks = [pa.OSFile(str(path), "wb") for path in paths]
    writers = [pa.ipc.new_stream(sink, spec.schema) for sink in sinks]
    try:
        for batch in inputs.to_batches(batch_size=READ_ROWS):
            if not batch.num_rows:
                continue
            if parts == 1:
                writers[0].write_batch(batch)
                continue
            buckets = key_buckets(batch.column(spec.key), parts)
            order = np.argsort(buckets, kind="stable")
            counts = np.bincount(buckets, minlength=parts)
            grouped = batch.take(pa.array(order))
            start = 0
            for bucket in np.flatnonzero(counts):
                writers[bucket].write_batch(grouped.slice(start, int(counts[bucket])))
                start += int(counts[bucket])
    finally:
        for writer, sink in zip(writers, sinks, strict=True):
            writer.close()
            sink.close()
    return paths


def distinct_rows(table: pa.Table, probe: Sequence[str] = ()) -> pa.Table:
    """The table with each row once (equal in every column: a row written twice), in its first place. ``probe``:
    columns whose values seldom repeat together (the message id, a time): rows are hashed by them and only those
    sharing a hash are compared in every column, which is cheap when few do (equal rows always share it)."""
    if not table.num_rows:
        return table
    if not probe:
        first = _first_of_equal(table)
    else:
        hashes = np.zeros(table.num_rows, dtype=np.uint64)
        for name in probe:
            hashes = _mixed(hashes * _GOLDEN + _column_hashes(table.column(name)))
        _, inverse, counts = np.unique(hashes, return_inverse=True, return_counts=True)
        shared = counts[inverse] > 1
        if not shared.any():
            return table
        table = table.combine_chunks()  # Arrow's take from many chunks is slow
        compared = np.flatnonzero(shared)
        kept = compared[_first_of_equal(table.take(pa.array(compared)))]
        first = np.sort(np.concatenate([np.flatnonzero(~shared), kept]))
    return table if len(first) == table.num_rows else table.combine_chunks().take(pa.array(first))


def _first_of_equal(table: pa.Table) -> np.ndarray:
    """The positions (ascending) of each distinct row's first occurrence."""
    keys = {name: _comparable(table.column(name)) for name in table.column_names}
    row = "__row__"
    numbered = pa.table({**keys, row: pa.array(np.arange(table.num_rows, dtype=np.int64))})
    first = numbered.group_by(table.column_names, use_threads=False).aggregate([(row, "min")])
    positions: np.ndarray = np.sort(first.column(f"{row}_min").to_numpy())
    return positions


def _column_hashes(column: pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each value: text by :func:`key_hashes`, a whole number by its value (a null: apart from every
    value); read a chunk of :data:`READ_ROWS` at a time (the hash of text takes 24 bytes per byte of it)."""
    pieces = []
    for chunk in column.chunks:
        for start in range(0, len(chunk), READ_ROWS):
            piece = chunk.slice(start, READ_ROWS)
            if pa.types.is_integer(piece.type) or pa.types.is_boolean(piece.type):
                values = pc.fill_null(piece.cast(pa.int64()), 0).to_numpy().astype(np.uint64)
                valid = np.asarray(piece.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                pieces.append(np.where(valid, _mixed(values + _GOLDEN), np.uint64(0)))
            else:
                pieces.append(key_hashes(_comparable(pa.chunked_array([piece])).cast(pa.string())))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint64)


def _comparable(column: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """A column as a group-by key: a list column as text (``[1,2]``; a null list and a null item told apart)."""
    if not pa.types.is_list(column.type) and not pa.types.is_large_list(column.type):
        return column
    lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    items = pc.fill_null(lists.values.cast(pa.string()), "null")
    text = pa.ListArray.from_arrays(lists.offsets, items, mask=lists.is_null())
    return pc.binary_join_element_wise("[", pc.binary_join(text, ","), "]", "")


def key_hashes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each value's UTF-8 bytes (a null: as ''), the same on every host and in every release:
    numpy over Arrow's buffers (no row-by-row Python; no library hash a new version may change)."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    array = pc.fill_null(array.cast(pa.large_binary()), b"")
    count = len(array)
    if not count:
        return np.zeros(0, dtype=np.uint64)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[array.offset : array.offset + count + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, dtype=np.uint8)
    start, end = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    position = np.arange(end - start, dtype=np.int64) - np.repeat(offsets[:-1] - start, lengths)
    longest = int(lengths.max()) if count else 0
    weights = np.cumprod(np.concatenate([[np.uint64(1)], np.full(max(longest - 1, 0), _BASE)]), dtype=np.uint64)
    terms = (data[start:end].astype(np.uint64) + np.uint64(1)) * weights[position]
    sums = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(terms, dtype=np.uint64)])
    return _mixed(sums[offsets[1:] - start] - sums[offsets[:-1] - start] + lengths.astype(np.uint64))


def _mixed(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of each value (a new array): every input bit moves every output bit."""
    mixed: np.ndarray = values ^ (values >> _SHIFTS[0])
    mixed *= _MIX[0]
    mixed ^= mixed >> _SHIFTS[1]
    mixed *= _MIX[1]
    mixed ^= mixed >> _SHIFTS[2]
    return mixed


def key_buckets(values: pa.Array | pa.ChunkedArray, parts: int) -> np.ndarray:
    """Each value's bucket among ``parts`` (0 .. parts-1): which compacted file of an hour holds its rows."""
    buckets: np.ndarray = (key_hashes(values) % np.uint64(parts)).astype(np.int64)
    return buckets


def select_parts(paths: Iterable[str], keys: Collection[str]) -> list[str]:
    """Of these data files, those that may hold rows of these keys: every micro-batch's file, and of a compacted
    hour only the parts of the keys' buckets (one file per key and generation)."""
    wanted: dict[int, set[int]] = {}
    values = pa.array(sorted(set(keys)), pa.string())
    selected = []
    for path in paths:
        folder, _, name = path.rpartition("/")
        part = PART.fullmatch(name) if folder.rpartition("/")[2] == COMPACTED_FOLDER else None
        if part is None:
            selected.append(path)
            continue
        parts = int(part["parts"])
        if parts not in wanted:
            wanted[parts] = {int(bucket) for bucket in key_buckets(values, parts)}
        if int(part["bucket"]) in wanted[parts]:
            selected.append(path)
    return selected


def _batch_id(folder: str) -> int | None:
    text = folder.removeprefix(BATCH_PREFIX)
    try:
        return int(text) if folder.startswith(BATCH_PREFIX) else None
    except ValueError:
        return None
