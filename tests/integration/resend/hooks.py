"""Recovery hooks a test registry names (``resend.hook``): what a stream owner writes to rebuild a payload."""

from __future__ import annotations

import json
from collections.abc import Mapping


def order_from_database(message_id: str, attributes: Mapping[str, str]) -> str:
    """Rebuilds the order as a row read back from a database would (here: from its recovery attributes)."""
    return json.dumps({"order_id": attributes.get("order_id"), "rebuilt_for": message_id})


def row_is_gone(message_id: str, attributes: Mapping[str, str]) -> bytes:
    raise LookupError(f"no row for {message_id}")
