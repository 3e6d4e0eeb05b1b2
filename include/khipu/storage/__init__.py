"""Where Khipu keeps its files: a local folder or an object store, named by one URL (``file://``, ``s3a://``).

The trace archive, the verdict archive, the detector's checkpoint and reconciliation's working data each live
at a :class:`Location`; Spark reaches it through Hadoop (``s3a://``), every other reader and writer through
pyarrow's file systems. Object stores have no atomic rename: see :mod:`khipu.storage.location` for how a
write is committed.
"""
