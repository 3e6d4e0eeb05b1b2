"""A resend from a message's page: the confirmed losses a message offers, the DAG conf for one, and whether a real
run may follow the run named (numbered cases, each with the reason its answer is right)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from khipu.report.message import HopLine, MessageReport
from khipu.report.resending import (
    Loss,
    NotThisLoss,
    RunSeen,
    confirmed_losses,
    loss_of,
    read_run,
    real_run_refusal,
    run_conf,
)

LOSS = Loss("m-1", "orders", "local/out -> s1")
OTHER_HOP = Loss("m-1", "orders", "local/out -> s2")


def hop(name: str, verdict: str | None) -> HopLine:
    return HopLine(name, "read", True, None if verdict is None else {"verdict": verdict})


def test_a_message_offers_its_confirmed_losses_in_route_order() -> None:
    report = MessageReport(
        "m-1",
        "orders",
        {},
        (
            hop("p -> local/in", "DELIVERED"),
            hop("local/out -> s1", "CONFIRMED_LOST"),
            hop("local/out -> s2", "LOST"),  # provisional: not confirmed yet
            hop("local/out -> s3", "CONFIRMED_LOST"),
            hop("local/out -> s4", "RESENT"),  # settled
            hop("local/out -> s5", None),
        ),
    )
    assert confirmed_losses(report) == [LOSS, Loss("m-1", "orders", "local/out -> s3")]
    assert confirmed_losses(MessageReport("m-1", None, {}, (hop("x", "CONFIRMED_LOST"),))) == []  # no stream known


def test_a_runs_conf_names_one_loss_and_reads_back() -> None:
    for dry_run in (True, False):
        conf = run_conf(LOSS, dry_run=dry_run)
        assert conf == {"streams": ["orders"], "hop": LOSS.hop, "message_ids": ["m-1"], "dry_run": dry_run}
        assert loss_of(conf) == (LOSS, dry_run)
    assert loss_of({"streams": ["orders"], "hop": LOSS.hop, "message_ids": ["m-1"]}) == (LOSS, True)  # the default
    for conf in (
        {"streams": ["orders", "refunds"], "hop": LOSS.hop, "message_ids": ["m-1"]},  # several streams
        {"streams": ["orders"], "hop": LOSS.hop, "message_ids": ["m-1", "m-2"]},  # several messages
        {"streams": ["orders"], "hop": "", "message_ids": ["m-1"]},  # every hop
        {"streams": ["orders"], "hop": LOSS.hop, "message_ids": ["m-1"], "since": "2026-11-01T00:00:00Z"},
        {"streams": [], "message_ids": []},  # everything
    ):
        assert loss_of(conf) is None, conf


def outcome(state: str, hop: str = LOSS.hop, message_id: str = "m-1") -> dict[str, Any]:
    return {"message_id": message_id, "stream": "orders", "hop": hop, "attempt": 1, "state": state,
            "source": "local/out[1]@4", "destination": "local/out for s1 only", "detail": f"{state} it"}  # fmt: skip


def run(state: str, *outcomes: dict[str, Any], dry_run: bool = True, loss: Loss = LOSS) -> RunSeen:
    result = {"dry_run": dry_run, "summary": "1 considered", "outcomes": list(outcomes)} if state == "success" else None
    return RunSeen("run-1", state, run_conf(loss, dry_run=dry_run), result)


class Case(NamedTuple):
    number: int
    run: RunSeen
    refusal: str | None
    reason: str


CASES = [
    Case(1, run("success", outcome("would_resend")), None, "a dry run of this loss said it would resend it"),
    Case(2, run("running"), "dry run run-1 has not succeeded (it is running)", "its answer is not known yet"),
    Case(3, run("failed"), "dry run run-1 has not succeeded (it is failed)", "a refused request fails the task"),
    Case(4, run("success", outcome("waiting")), "dry run run-1 would not resend it (waiting: waiting it)",
         "an attempt is out, waiting to arrive: another copy would reach the group twice"),
    Case(5, run("success"), "dry run run-1 would not resend it (nothing about this loss)",
         "the run said nothing of it (no longer confirmed lost)"),
    Case(6, run("success", outcome("would_resend", hop=OTHER_HOP.hop)),
         "dry run run-1 would not resend it (nothing about this loss)", "what it said was about another hop"),
    Case(7, run("success", outcome("produced"), dry_run=False),
         "run run-1 is not a dry run: a real resend follows a dry run", "a real run is never followed by another"),
    Case(8, run("success", outcome("would_resend", hop=OTHER_HOP.hop), loss=OTHER_HOP),
         f"dry run run-1 was for {OTHER_HOP.hop}, not {LOSS.hop}", "a dry run of the message's other loss"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[f"{c.number}" for c in CASES])
def test_a_real_run_follows_a_dry_run_of_the_same_loss_that_would_resend_it(case: Case) -> None:
    seen = read_run(case.run, "m-1")
    assert real_run_refusal(seen, LOSS) == case.refusal, case.reason
    if seen.loss == LOSS and seen.dry_run:  # what the page offers: the button for a real run, or the refusal
        assert seen.would_resend == (case.refusal is None), case.reason


def test_a_runs_outcomes_for_its_loss_only_and_its_state() -> None:
    seen = read_run(run("success", outcome("would_resend"), outcome("would_resend", message_id="m-9")), "m-1")
    assert [o["message_id"] for o in seen.outcomes] == ["m-1"] and seen.summary == "1 considered" and seen.finished
    assert not read_run(run("queued"), "m-1").finished


def test_a_run_of_another_message_is_not_shown_on_this_ones_page() -> None:
    with pytest.raises(NotThisLoss, match="is not a resend of message 'm-2'"):
        read_run(run("success", outcome("would_resend")), "m-2")
    with pytest.raises(NotThisLoss):
        read_run(RunSeen("run-9", "success", {"streams": [], "message_ids": []}), "m-1")  # an all-streams run
