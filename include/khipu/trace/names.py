"""The names Khipu accepts for streams, locations, clusters, topics and groups: Kafka's own rule for topic
names, used for every name (the registry, the trace format, the tracing library and the settings check them)."""

from __future__ import annotations

import re

MAX_NAME_CHARS = 249  # Kafka's own limit for topic names
NAME_PATTERN = re.compile(rf"^[A-Za-z0-9._-]{{1,{MAX_NAME_CHARS}}}$")
NAME_RULE = f"1-{MAX_NAME_CHARS} characters of letters, digits, '.', '_' or '-'"
DEFAULT_TRACE_TOPIC = "khipu.traces"  # where traces go unless KHIPU_TRACE_TOPIC (or a connection) says otherwise
