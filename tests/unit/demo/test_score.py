"""Scoring verdicts against the ground truth: the expected verdict per hop, and messages no trace reveals."""

from __future__ import annotations

from khipu.demo.ledger import GroundTruth, HopTruth, MessageTruth
from khipu.demo.score import observable_messages, score, unseen_outputs, untraced_messages
from khipu.registry.model import HopKind

SRC, READ, OUT = "p -> local/in", "local/in -> proc", "proc -> local/out"
S1, S2 = "local/out -> s1", "local/out -> s2"


def message(message_id: str, *hops: tuple[str, HopKind, int, set[str], int], sampled: bool = True) -> MessageTruth:
    rows = {
        h: HopTruth(message_id, h, kind, count, frozenset(f), traces, source=h == SRC)
        for h, kind, count, f, traces in hops
    }
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


def test_a_processor_output_no_trace_of_it_reached_expects_a_drop_there_and_no_verdict_past_it() -> None:
    """The processor wrote it on, but its SENT trace was lost, s1 skipped the record and s2's RECEIVED trace was
    lost: the trace topic shows the processor get it and commit past it with nothing on its output, as a drop
    does (test_detector's sampling test failed on this once: sampled-00000070)."""
    unseen = message(
        "unseen", (SRC, W, 1, set(), 1), (READ, R, 1, set(), 1), (OUT, W, 1, {"trace_loss"}, 0),
        (S1, R, 0, {"consumer_skip"}, 0), (S2, R, 1, {"trace_loss"}, 0),
    )  # fmt: skip
    # one trace on the output (s2's receipt): the detector sees the message there
    seen = message(
        "seen", (SRC, W, 1, set(), 1), (READ, R, 1, set(), 1), (OUT, W, 1, {"trace_loss"}, 0),
        (S1, R, 0, {"consumer_skip"}, 0), (S2, R, 1, set(), 1),
    )  # fmt: skip
    # no trace on the source's topic, but the processor's output implies it: not unseen
    implied = message(
        "implied", (SRC, W, 1, {"trace_loss"}, 0), (READ, R, 1, {"trace_loss"}, 0), (OUT, W, 1, set(), 1),
        (S1, R, 1, set(), 1), (S2, R, 1, set(), 1),
    )  # fmt: skip
    truth = GroundTruth({"unseen": unseen, "seen": seen, "implied": implied})
    assert unseen_outputs(unseen) == {"local/out"}
    assert unseen_outputs(seen) == unseen_outputs(implied) == frozenset()

    detector = [  # what the streaming detector says of them
        verdict("unseen", SRC, "DELIVERED"),
        verdict("unseen", READ, "DELIVERED"),
        verdict("unseen", OUT, "LOST", "dropped_in_processor"),
        verdict("seen", SRC, "DELIVERED"),
        verdict("seen", READ, "DELIVERED"),
        verdict("seen", OUT, "TRACE_LOST"),
        verdict("seen", S1, "LOST", "skipped_by_consumer"),
        verdict("seen", S2, "DELIVERED"),
        verdict("implied", SRC, "TRACE_LOST"),
        verdict("implied", READ, "TRACE_LOST"),
        *(verdict("implied", h, "DELIVERED") for h in (OUT, S1, S2)),
    ]
    result = score(truth, detector)
    assert result.exact, (result.wrong, result.missing, result.extra)
    assert result.expected == len(detector)


def test_a_duplicate_is_scored_by_the_offsets_its_arrived_traces_name() -> None:
    """A rewound group read a retried id at both its offsets twice; two of the four traces were lost, one per
    offset: the traces show the id read once at each of two offsets, which is what the detector calls a producer
    retry (test_detector's sampling test failed on this once too: sampled-00000384 at demo-sink-audit)."""
    rows = ((SRC, W, 2, {"producer_retry"}, 2), (READ, R, 4, {"offset_rewind", "trace_loss"}, 2))

    def truth(reread: bool | None) -> GroundTruth:
        m = message("m", *rows)
        read = m.hops[READ]
        hops = {**m.hops, READ: HopTruth(read.message_id, READ, R, 4, read.faults, 2, reread_traced=reread)}
        return GroundTruth({"m": MessageTruth("m", True, hops)})

    said = [verdict("m", SRC, "DUPLICATE", "producer_retry"), verdict("m", READ, "DUPLICATE", "producer_retry")]
    assert score(truth(False), said).exact
    assert not score(truth(True), said).exact  # one offset's two traces arrived: a rewind the traces show
    assert not score(truth(None), said).exact  # not known where the lost ones were: the fault says rewind


def test_a_processor_that_read_its_input_again_and_wrote_it_again_is_a_replay_at_its_write() -> None:
    """After a real rebalance (a broker outage longer than the session timeout) the processor reads again what it
    had not committed and writes it again: its write shows the id at two offsets, and its input read one offset
    read twice; the detector calls that write's duplicate a replay (``processor_reread_input``), not a retry."""
    m = message("m", (SRC, W, 1, set(), 1), (READ, R, 2, set(), 2), (OUT, W, 2, set(), 2))
    read = m.hops[READ]
    hops = {**m.hops, READ: HopTruth(read.message_id, READ, R, 2, read.faults, 2, reread_traced=True)}
    truth = GroundTruth({"m": MessageTruth("m", True, hops)})
    said = [
        verdict("m", SRC, "DELIVERED"),
        verdict("m", READ, "DUPLICATE", "rewind_replay"),
        verdict("m", OUT, "DUPLICATE", "rewind_replay"),
    ]
    result = score(truth, said)
    assert result.exact, (result.wrong, result.missing, result.extra)
    assert not score(truth, [*said[:2], verdict("m", OUT, "DUPLICATE", "producer_retry")]).exact


def test_a_retried_write_read_again_at_one_offset_is_rewind_replay_at_the_read_as_decide_rules() -> None:
    """The ledger of what the reviewer saw after a broker freeze: the enricher wrote the id twice (out@0, out@1) and
    the sink read out@0 once and out@1 twice (its group re-read it). Both causes apply at the sink's hop; the re-read
    comes first, as decide's table says (tests/unit/detector/test_decide.py, case 64): rewind_replay there, and a
    producer retry at the write (the retry's own hop)."""
    from khipu.demo.ledger import build_truth

    def event(kind: str, hop: str, topic: str, offset: int, **extra: object) -> dict[str, object]:
        return {"event": kind, "message_id": "m", "hop": hop, "topic": topic, "partition": 0, "offset": offset,
                **extra}  # fmt: skip

    sink = "local/out -> sink"
    truth = build_truth([
        event("written", SRC, "in", 0, sampled=True, source=True),
        event("received", READ, "in", 0),
        event("written", OUT, "out", 0), event("written", OUT, "out", 1),
        event("received", sink, "out", 0), event("received", sink, "out", 1), event("received", sink, "out", 1),
    ])  # fmt: skip
    rules = [
        verdict("m", SRC, "DELIVERED"),
        verdict("m", READ, "DELIVERED"),
        verdict("m", OUT, "DUPLICATE", "producer_retry"),
        verdict("m", sink, "DUPLICATE", "rewind_replay"),
    ]
    assert score(truth, rules).exact
    retry_at_the_sink = [*rules[:3], verdict("m", sink, "DUPLICATE", "producer_retry")]
    assert score(truth, retry_at_the_sink).wrong == {
        ("m", sink): (("DUPLICATE", "rewind_replay"), ("DUPLICATE", "producer_retry"))
    }
