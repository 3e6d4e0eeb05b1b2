"""Offset-watermark snapshots: per group and partition, the committed offset next to the log's start and end."""
