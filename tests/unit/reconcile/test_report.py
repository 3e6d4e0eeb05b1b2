"""The reconciliation report at volume: every change counted, only the first of each kind named."""

from __future__ import annotations

import pytest

from khipu.reconcile import run
from khipu.reconcile.run import ReconcileReport, _Tally
from khipu.reconcile.window import ReconcileWindow
from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu.verdicts.settle import Change

WINDOW = ReconcileWindow(3_600_000, 7_200_000)


def change(message_id: str, kind: VerdictKind) -> Change:
    verdict = Verdict(
        message_id,
        "orders",
        "local/in -> s1",
        "read",
        kind,
        Cause.SKIPPED_BY_CONSUMER if kind is VerdictKind.CONFIRMED_LOST else None,
        1,
        "in",
        0,
        1,
        "s1",
        "s1",
        None,
        None,
        None,
        9_000_000,
        "why",
    )
    return Change(verdict, "reconciled")


def test_a_report_counts_every_change_and_names_the_first_of_each_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "LISTED_CHANGES", 2)
    tally = _Tally()
    tally.add([change(f"lost-{n}", VerdictKind.CONFIRMED_LOST) for n in range(5)])
    tally.add([change("late-0", VerdictKind.RETRACTED), change("lost-5", VerdictKind.CONFIRMED_LOST)])
    report = ReconcileReport(WINDOW, False, changes=tuple(tally.listed), counted=dict(tally.counted))

    assert report.by_kind == {"CONFIRMED_LOST": 6, "RETRACTED": 1}
    assert [c.verdict.message_id for c in report.confirmed_losses] == ["lost-0", "lost-1"]
    summary = report.summary()
    assert summary["changes"] == 7 and summary["listed_at_most"] == 2
    assert [line["message_id"] for line in summary["retracted"]] == ["late-0"]


def test_a_report_without_a_tally_counts_the_changes_it_holds() -> None:
    report = ReconcileReport(
        WINDOW, True, changes=(change("a", VerdictKind.RETRACTED), change("b", VerdictKind.RETRACTED))
    )
    assert report.by_kind == {"RETRACTED": 2} and report.summary()["changes"] == 2


@pytest.mark.parametrize(
    ("archive_bytes", "parallelism", "expected", "why"),
    [
        (1_000, 2, 2, "a small window: a partition a core"),
        (0, 8, 8, "nothing read: still a partition a core"),
        (64 << 20, 2, 2, "one partition's worth: the cores win"),
        (5 << 30, 2, 80, "five hours at 25,000 traces/s (about 5 GiB): 64 MiB each"),
        ((5 << 30) + 1, 2, 81, "a byte over: one partition more, never fewer than the bytes need"),
    ],
)
def test_shuffle_partitions_follow_the_bytes_read(
    archive_bytes: int, parallelism: int, expected: int, why: str
) -> None:
    assert run.shuffle_partitions(archive_bytes, parallelism) == expected, why
