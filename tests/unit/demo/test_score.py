"""Scoring verdicts against the ground truth: the expected verdict per hop, and messages no trace reveals."""

from __future__ import annotations

from khipu.demo.ledger import GroundTruth, HopTruth, MessageTruth
from khipu.demo.score import observable_messages, score, untraced_messages
from khipu.registry.model import HopKind

SRC, READ, OUT = "p -> local/in", "local/in -> proc", "proc -> local/out"


def message(message_id: str, *hops: tuple[str, HopKind, int, set[str], int], sampled: bool = True) -> MessageTruth:
    rows = {h: HopTruth(message_id, h, kind, count, frozenset(f), traces) for h, kind, count, f, traces in hops}
    return MessageTruth(message_id, sampled, rows)


W, R = HopKind.WRITE, HopKind.READ
TRUTH = GroundTruth(
    {
        "ok": message("ok", (SRC, W, 1, set(), 1), (READ, R, 1, set(), 1), (OUT, W, 1, set(), 1)),
        "skip": message("skip", (SRC, W, 1, set(), 1), (READ, R, 0, {"consumer_skip"}, 0)),
        "tl": message("tl", (SRC, W, 1, set(), 1), (READ, R, 1, {"trace_loss"}, 0), (OUT, W, 1, set(), 1)),
        "dup": message("dup", (SRC, W, 1, set(), 1), (READ, R, 2, {"offset_rewind"}, 2), (OUT, W, 1, set(), 1)),
        # both traces lost, then dropped by the processor: nothing carries its id
        "dark": message(
            "dark", (SRC, W, 1, {"trace_loss"}, 0), (READ, R, 1, {"trace_loss"}, 0), (OUT, W, 0, {"processor_drop"}, 0)
        ),
        "unsampled": message("unsampled", (SRC, W, 1, set(), 0), sampled=False),
    }
)


def verdict(message_id: str, hop: str, kind: str, cause: str | None = None) -> dict[str, str | None]:
    return {"message_id": message_id, "hop": hop, "verdict": kind, "cause": cause}


RIGHT = [
    *(verdict("ok", h, "DELIVERED") for h in (SRC, READ, OUT)),
    verdict("skip", SRC, "DELIVERED"),
    verdict("skip", READ, "LOST", "skipped_by_consumer"),
    verdict("tl", SRC, "DELIVERED"),
    verdict("tl", READ, "TRACE_LOST"),
    verdict("tl", OUT, "DELIVERED"),
    verdict("dup", SRC, "DELIVERED"),
    verdict("dup", READ, "DUPLICATE", "rewind_replay"),
    verdict("dup", OUT, "DELIVERED"),
]


def test_a_message_whose_every_trace_was_lost_expects_no_verdict_and_is_listed() -> None:
    assert untraced_messages(TRUTH) == {"dark"}
    assert observable_messages(TRUTH) == {"ok", "skip", "tl", "dup"}
    result = score(TRUTH, RIGHT)
    assert result.exact and result.matched == result.expected == len(RIGHT)
    assert result.untraced == {"dark"}


def test_wrong_missing_and_extra_verdicts_are_each_reported() -> None:
    verdicts = [v for v in RIGHT if v["message_id"] != "tl"]  # tl's three are missing
    verdicts[4] = verdict("skip", READ, "TRACE_LOST")  # wrong
    verdicts.append(verdict("skip", OUT, "LOST", "dropped_in_processor"))  # extra: skip never got there
    result = score(TRUTH, verdicts)
    assert result.wrong == {("skip", READ): (("LOST", "skipped_by_consumer"), ("TRACE_LOST", None))}
    assert set(result.missing) == {("tl", SRC), ("tl", READ), ("tl", OUT)}
    assert result.extra == {("skip", OUT): ("LOST", "dropped_in_processor")}
    assert not result.exact and result.matched == len(RIGHT) - 4


def test_final_verdicts_are_scored_by_what_their_evidence_says() -> None:
    from khipu.demo.score import said

    assert said({"verdict": "CONFIRMED_LOST", "cause": "skipped_by_consumer"}) == ("LOST", "skipped_by_consumer")
    retracted = {"verdict": "RETRACTED", "cause": None, "evidence_kind": "TRACE_LOST"}
    assert said(retracted) == ("TRACE_LOST", None)  # the hop was passed; only its trace was late or lost
    assert said({"verdict": "DUPLICATE", "cause": "rewind_replay"}) == ("DUPLICATE", "rewind_replay")
