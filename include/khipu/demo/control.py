"""Steering a running demo from outside: pause a consumer group (it stays a member, stops reading and
committing: a stall) and resume it; change fault rates while it runs (raise the loss rate above a
stream's threshold, then set it back). The state is a small JSON file next to the ledger."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class DemoControl:
    """Reads and writes ``{"paused": [group, ...], "faults": {name: rate}}``; readers look at the file at most
    once a second. ``faults`` overrides the rates the demo started with, fault by fault."""

    def __init__(self, path: Path, check_interval_s: float = 1.0) -> None:
        self.path = path
        self._interval = check_interval_s
        self._checked = 0.0
        self._mtime: float | None = None
        self._paused: frozenset[str] = frozenset()
        self._faults: dict[str, float] = {}
        self._lock = threading.Lock()  # the demo's threads share one control

    def _refresh(self) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._checked < self._interval:
                return
            self._checked = now
            try:
                mtime = self.path.stat().st_mtime
            except FileNotFoundError:
                self._mtime, self._paused, self._faults = None, frozenset(), {}
                return
            if mtime != self._mtime:
                self._mtime = mtime
                data = self._data()
                self._paused = _groups(data)
                self._faults = _rates(data)

    def paused(self) -> frozenset[str]:
        self._refresh()
        return self._paused

    def fault_overrides(self) -> dict[str, float]:
        """Fault rates set while the demo runs (name -> probability); the others keep their start values."""
        self._refresh()
        return dict(self._faults)

    def set_faults(self, rates: Mapping[str, float], reset: bool = False) -> dict[str, float]:
        """Override these fault rates (``reset``: drop every override first); returns the overrides now."""
        data = self._data()
        faults = {} if reset else _rates(data)
        faults.update(rates)
        self._write({"paused": sorted(_groups(data)), "faults": faults})
        return faults

    def is_paused(self, group: str) -> bool:
        return group in self.paused()

    def set_paused(self, group: str, paused: bool) -> frozenset[str]:
        data = self._data()
        groups = set(_groups(data))
        groups.add(group) if paused else groups.discard(group)
        self._write({"paused": sorted(groups), "faults": _rates(data)})
        return frozenset(groups)

    def _data(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(data))
        os.replace(temporary, self.path)


def _groups(data: Mapping[str, Any]) -> frozenset[str]:
    paused = data.get("paused", [])
    return frozenset(g for g in paused if isinstance(g, str)) if isinstance(paused, list) else frozenset()


def _rates(data: Mapping[str, Any]) -> dict[str, float]:
    faults = data.get("faults", {})
    if not isinstance(faults, dict):
        return {}
    return {
        str(name): float(rate)
        for name, rate in faults.items()
        if isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0.0 <= rate <= 1.0
    }
