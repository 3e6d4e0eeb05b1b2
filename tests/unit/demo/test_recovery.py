"""Scoring a resend against the demo's ground truth: each injected loss RESENT, delivered to exactly the groups
that missed it, once, with one resent record in the topics; and the verdicts still scored exactly."""

from __future__ import annotations

from typing import Any

from khipu.demo.ledger import build_truth
from khipu.demo.recovery import missed_by, recovery_report
from khipu.demo.score import score
from tests.routes import FAN_OUT, PROC_IN, PROC_OUT, S1, S2, SRC

STREAM = FAN_OUT
READ, OUT = PROC_IN, PROC_OUT


def ev(event: str, mid: str, hop: str, offset: int = 0, **extra: Any) -> dict[str, Any]:
    topic = "in" if hop in (SRC, READ) else "out"
    return {"event": event, "message_id": mid, "hop": hop, "topic": topic, "partition": 0, "offset": offset, **extra}


def the_demo(resent_to: dict[str, list[str]]) -> list[dict[str, Any]]:
    """m-skip: s1 skipped it (out@1); m-drop: proc dropped it; m-ok: clean. ``resent_to``: message -> groups whose
    sink received a resent record of it."""
    events = [
        ev("written", "m-skip", SRC, 0, source=True, sampled=True), ev("received", "m-skip", READ, 0),
        ev("written", "m-skip", OUT, 1), ev("received", "m-skip", S2, 1),
        {"event": "skipped", "hop": S1, "topic": "out", "partition": 0, "from_offset": 1, "to_offset": 2,
         "fault": "consumer_skip"},
        ev("written", "m-drop", SRC, 1, source=True, sampled=True), ev("received", "m-drop", READ, 1),
        {"event": "dropped", "message_id": "m-drop", "hop": OUT, "fault": "processor_drop"},
        ev("written", "m-ok", SRC, 2, source=True, sampled=True), ev("received", "m-ok", READ, 2),
        ev("written", "m-ok", OUT, 3), ev("received", "m-ok", S1, 3), ev("received", "m-ok", S2, 3),
    ]  # fmt: skip
    for message_id, groups in resent_to.items():
        events += [ev("received", message_id, f"local/out -> {g}", 9, resend_id=f"r1-{message_id}") for g in groups]
    return events


VERDICTS = [
    {"message_id": "m-skip", "hop": S1, "verdict": "RESENT", "cause": "skipped_by_consumer"},
    {"message_id": "m-drop", "hop": OUT, "verdict": "RESENT", "cause": "dropped_in_processor"},
]


def test_a_resend_to_exactly_those_who_missed_it_is_exact() -> None:
    truth = build_truth(the_demo({"m-skip": ["s1"], "m-drop": ["s1", "s2"]}))
    assert truth.resent_receipts == {("m-skip", S1): 1, ("m-drop", S1): 1, ("m-drop", S2): 1}
    assert truth.messages["m-skip"].hops[S1].count == 0  # the original truth stays: the skip happened
    report = recovery_report(truth, VERDICTS, STREAM, {"m-skip": 1, "m-drop": 1})
    assert report.exact and (report.losses, report.resent) == (2, 2), report.lines()


def test_what_went_wrong_is_each_named() -> None:
    truth = build_truth(the_demo({"m-skip": ["s1", "s2"], "m-drop": ["s1"]}))  # s2 got m-skip twice over; m-drop
    verdicts = [VERDICTS[0], {**VERDICTS[1], "verdict": "CONFIRMED_LOST"}]
    report = recovery_report(truth, verdicts, STREAM, {"m-skip": 2})
    assert not report.exact
    assert report.not_resent == {("m-drop", OUT): "CONFIRMED_LOST"}
    assert report.wrong_receivers == {
        ("m-skip", S1): (["s1"], {"s1": 1, "s2": 1}),
        ("m-drop", OUT): (["s1", "s2"], {"s1": 1}),
    }
    assert report.wrong_copies == {"m-skip": 2, "m-drop": 0}
    assert any("missed by s1, s2" in line for line in report.lines())


def test_missed_by_is_the_group_of_a_read_hop_and_every_reader_of_a_write_hops_topic() -> None:
    assert missed_by(STREAM, S1) == ["s1"]
    assert missed_by(STREAM, OUT) == ["s1", "s2"]


def test_resent_verdicts_score_as_the_losses_they_were_and_hops_reached_only_by_the_resend_as_delivered() -> None:
    truth = build_truth(the_demo({"m-skip": ["s1"], "m-drop": ["s1", "s2"]}))
    delivered = [
        {"message_id": m, "hop": h, "verdict": "DELIVERED", "cause": None}
        for m, h in [("m-skip", SRC), ("m-skip", READ), ("m-skip", OUT), ("m-skip", S2), ("m-drop", SRC),
                     ("m-drop", READ), ("m-ok", SRC), ("m-ok", READ), ("m-ok", OUT), ("m-ok", S1), ("m-ok", S2)]
    ]  # fmt: skip
    after_resend = [*delivered, *VERDICTS, *({"message_id": "m-drop", "hop": h, "verdict": "DELIVERED",
                                             "cause": None} for h in (S1, S2))]  # fmt: skip
    result = score(truth, after_resend)
    assert result.exact, (result.wrong, result.missing, result.extra)
    unrecovered = score(truth, [*delivered, *VERDICTS])  # the resent record reached the sinks: their verdicts too
    assert unrecovered.missing == {("m-drop", S1): ("DELIVERED", None), ("m-drop", S2): ("DELIVERED", None)}
