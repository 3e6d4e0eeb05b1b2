"""All the verdicts of a message: the SQL store's rows and the verdict archive's, the SQL row winning.

The SQL ``verdicts`` table holds the exceptions, the verdict archive (:mod:`khipu.verdicts.archive`) the
plain first-time DELIVERED verdicts. A verdict changed after it was archived is written to SQL, so where
both hold a row for a (message id, hop) the SQL row is the newer one. Every reader that shows or judges
"all the verdicts of a message" reads them through here: the view's message page and API, ``khipu
trace`` and ``khipu history``, reconciliation's verdict book and the resend task's plans.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from khipu.verdicts.archive import VerdictArchive


class MessageRows(Protocol):
    """The SQL store's verdict repository (``store.verdicts``), as :func:`verdicts_of` uses it."""

    def read_messages(self, message_ids: Collection[str]) -> list[dict[str, Any]]: ...


class SqlVerdicts(MessageRows, Protocol):
    """The SQL store's verdict repository, as :func:`all_verdicts` uses it."""

    def read(self, stream: str | None = None, since_ms: int = 0) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class MessageVerdicts:
    """The verdicts of some messages, by message id and hop, and what may be missing from them."""

    rows: list[dict[str, Any]]  # the SQL verdict columns (an archived row has no ``announced_ms``)
    note: str | None = None  # the verdict archive could not be searched whole for some of them (say so)


def merged(sql_rows: Iterable[Mapping[str, Any]], archived_rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (message id, hop): the SQL row where there is one, else the archived one; by message id and
    hop."""
    found = {(str(row["message_id"]), str(row["hop"])): dict(row) for row in archived_rows}
    found.update({(str(row["message_id"]), str(row["hop"])): dict(row) for row in sql_rows})
    return [found[key] for key in sorted(found)]


def verdicts_of(
    sql: MessageRows,
    archive: VerdictArchive | None,
    message_ids: Collection[str],
    hours: Iterable[str] | None = None,
) -> MessageVerdicts:
    """Every verdict of these messages, SQL winning per hop. ``hours`` (YYYY-MM-DD-HH) names the archive hours
    to read; without them the archive's index says where (and the note says when it could not)."""
    sql_rows = sql.read_messages(message_ids)
    if archive is None or not message_ids:
        return MessageVerdicts(merged(sql_rows, []))
    if hours is not None:
        return MessageVerdicts(merged(sql_rows, archive.read_messages(message_ids, hours=hours)))
    found = archive.search(message_ids)
    return MessageVerdicts(merged(sql_rows, found.rows), found.note)


def all_verdicts(
    sql: SqlVerdicts, archive: VerdictArchive | None, stream: str | None = None, since_ms: int = 0
) -> list[dict[str, Any]]:
    """Every verdict decided since ``since_ms`` (of one stream, when given), SQL winning per hop, oldest first:
    for tests, the bench and small stores."""
    archived = archive.read(stream=stream, since_ms=since_ms) if archive is not None else []
    rows = merged(sql.read(stream=stream, since_ms=since_ms), archived)
    return sorted(rows, key=lambda r: (int(r["decided_ms"]), str(r["message_id"]), str(r["hop"])))


def with_first_decisions(
    history: Sequence[Mapping[str, Any]], verdicts: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A message's history with the first decision of each hop that has none (an archived DELIVERED has no
    history row): ``None -> <verdict>`` at its ``decided_ms``, reason "decided"; oldest first."""
    entries = [dict(entry) for entry in history]
    told = {(str(e["message_id"]), str(e["hop"])) for e in entries}
    for row in verdicts:
        if (str(row["message_id"]), str(row["hop"])) not in told:
            entries.append(
                {
                    "message_id": row["message_id"],
                    "hop": row["hop"],
                    "stream": row["stream"],
                    "at_ms": int(row["decided_ms"]),
                    "from_verdict": None,
                    "to_verdict": row["verdict"],
                    "cause": row.get("cause"),
                    "decided_by": row.get("decided_by") or "detector",
                    "reason": "decided",
                }
            )
    return sorted(entries, key=lambda e: int(e["at_ms"]))
