"""Files Khipu writes that hold stream data or secrets: readable and writable by their owner only."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

OWNER_ONLY = 0o600


def create_owner_only(path: Path) -> None:
    """Create ``path`` (empty) readable and writable by its owner only, if it does not exist; an existing file is
    left as it is (its mode is its owner's choice: `make up` tightens the stack's own, :func:`tighten`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_ONLY))
    except FileExistsError:
        pass


def tighten(path: Path) -> None:
    """Make an existing file of this user's owner-only (one an earlier release created 0644); a missing file, or
    one of another owner, is left alone."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return
    if found.st_mode & 0o077 and found.st_uid == os.getuid():
        path.chmod(OWNER_ONLY)


def write_owner_only(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, owner-only from the first byte (a file left by an earlier write
    keeps its mode through ``O_CREAT``, so the mode is set on the open file too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, OWNER_ONLY)
    os.fchmod(fd, OWNER_ONLY)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


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
