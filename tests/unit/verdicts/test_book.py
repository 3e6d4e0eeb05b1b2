"""The verdict's history lines (khipu.verdicts.book.history_entry): each says when what it records happened."""

from __future__ import annotations

import dataclasses

from khipu.verdicts.book import history_entry
from khipu.verdicts.model import VerdictKind
from khipu.verdicts.settle import Change
from tests.unit.verdicts.test_settle import hop

STORED_AT = 9_000_000  # when the writer stores the batch: seconds after the verdict was judged


def test_a_first_decision_is_dated_when_it_was_judged_a_change_when_it_was_stored() -> None:
    """The message page read 'decided 09:44:16Z' beside a history saying 09:44:19Z: the writer dated a first
    decision with its own clock, seconds after the detector judged it (issue 38)."""
    lost = hop(VerdictKind.LOST)
    first = history_entry(Change(lost, "judged"), STORED_AT)
    assert first is not None and first["at_ms"] == lost.decided_ms != STORED_AT
    confirmed = dataclasses.replace(lost, kind=VerdictKind.CONFIRMED_LOST, decided_by="reconciliation")
    changed = history_entry(Change(confirmed, "still missing", previous=lost), STORED_AT)
    assert changed is not None and changed["at_ms"] == STORED_AT  # when it became CONFIRMED_LOST
    assert (changed["from_verdict"], changed["to_verdict"]) == ("LOST", "CONFIRMED_LOST")
    assert history_entry(Change(lost, "again", previous=lost), STORED_AT) is None  # nothing changed: no line
