"""Files Khipu writes that hold stream data or secrets: readable and writable by their owner only."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

OWNER_ONLY = 0o600


def owner_only(path: Path) -> None:
    """``path`` readable and writable by its owner only: created so if missing, made so if it exists with more (a
    file an earlier release created 0644). A file of another owner is left as it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=OWNER_ONLY, exist_ok=True)
    found = path.stat()
    if found.st_mode & 0o077 and found.st_uid == os.getuid():
        path.chmod(OWNER_ONLY)


def write_owner_only(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, owner-only before anything is written into it."""
    owner_only(path)
    path.write_text(text)


def ensure_token(path: Path) -> str:
    """The secret token kept in ``path`` (owner-only), drawn there the first time."""
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    if not found:
        found = secrets.token_urlsafe(24)
        write_owner_only(path, found + "\n")
    return found
