"""The short hash of a record key that a SENT trace carries, never the key itself.

Compaction keeps the newest record of each key: to tell a record compaction removed (a later record of its key
exists) from one that was lost, the detector compares the hash a SENT trace carries with the hashes of the keys
still in the log. The hash is the first 8 bytes of the SHA-256 of the key's bytes as written (after the
application's serializer), as 16 lowercase hex digits: any language computes it the same way. It is not a secret:
a key that can be guessed (a small number, an e-mail address) can be confirmed from its hash.
"""

from __future__ import annotations

import hashlib
import re

KEY_HASH_PATTERN = re.compile(r"^[0-9a-f]{16}$")
KEY_HASH_RULE = "16 lowercase hex digits (the first 8 bytes of the SHA-256 of the record key)"


def key_hash(key: bytes | str | None) -> str | None:
    """The hash of a record key as written (``str`` is taken as its UTF-8 bytes); None for a record without one."""
    if key is None:
        return None
    data = key.encode() if isinstance(key, str) else bytes(key)
    return hashlib.sha256(data).hexdigest()[:16]
