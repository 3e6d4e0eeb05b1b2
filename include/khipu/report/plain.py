"""Reports as JSON-ready values, the same for the API and ``--json``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any


def plain(value: Any) -> Any:
    """Dataclasses as dicts of their fields and computed properties (``loss_rate``, ``found``, ...), mappings and
    sequences item by item, bytes as hex; anything else as it is."""
    if is_dataclass(value) and not isinstance(value, type):
        shown = {item.name: plain(getattr(value, item.name)) for item in fields(value)}
        for name in dir(type(value)):
            if isinstance(getattr(type(value), name, None), property):
                shown[name] = plain(getattr(value, name))
        return shown
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, bytes):
        return value.hex()
    return value
