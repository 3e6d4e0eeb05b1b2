"""Steering a running demo from outside: pause a consumer group (it stays a member, stops reading and
committing: a stall) and resume it. The state is a small JSON file next to the ledger."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


class DemoControl:
    """Reads and writes ``{"paused": [group, ...]}``; readers look at the file at most once a second."""

    def __init__(self, path: Path, check_interval_s: float = 1.0) -> None:
        self.path = path
        self._interval = check_interval_s
        self._checked = 0.0
        self._mtime: float | None = None
        self._paused: frozenset[str] = frozenset()

    def paused(self) -> frozenset[str]:
        now = time.monotonic()
        if now - self._checked >= self._interval:
            self._checked = now
            try:
                mtime = self.path.stat().st_mtime
            except FileNotFoundError:
                self._mtime, self._paused = None, frozenset()
                return self._paused
            if mtime != self._mtime:
                self._mtime = mtime
                self._paused = self._read()
        return self._paused

    def is_paused(self, group: str) -> bool:
        return group in self.paused()

    def set_paused(self, group: str, paused: bool) -> frozenset[str]:
        groups = set(self._read())
        groups.add(group) if paused else groups.discard(group)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"paused": sorted(groups)}))
        os.replace(temporary, self.path)
        return frozenset(groups)

    def _read(self) -> frozenset[str]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return frozenset()
        paused = data.get("paused", []) if isinstance(data, dict) else []
        return frozenset(g for g in paused if isinstance(g, str))
