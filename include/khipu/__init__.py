"""Khipu: per-message tracing and loss detection for Kafka pipelines."""

from __future__ import annotations

__version__ = "0.1.0"
