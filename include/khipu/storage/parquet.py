"""How Khipu's archives write Parquet: one choice of compression for every file, whoever writes it (a micro-batch,
retention's reduced hour, a compaction)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

COMPRESSION = "zstd"


def parquet_bytes(table: pa.Table, row_group_size: int | None = None) -> bytes:
    """The table as a zstd-compressed Parquet file's bytes (``row_group_size`` rows a row group; None: pyarrow's
    default)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=COMPRESSION, row_group_size=row_group_size)
    return bytes(sink.getvalue().to_pybytes())
