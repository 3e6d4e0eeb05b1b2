"""Exactly once under SIGKILL: the resend task killed at random points, 100+ times, then run again.

Each trial gives a separate process (the resend task) two fresh confirmed losses (a group's skip on the out
topic, and a processor's drop whose original is its input record), kills it with SIGKILL after a random
delay spread over how long a run takes, and then runs the resend again as a restarted task would. At
the end the destination topic must hold exactly one resent record per confirmed loss, and each loss's
ledger one produced attempt that names that record. Where the kills landed is printed.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from khipu.registry.model import ResendMode
from khipu.resend.ledger import LEASE_MS
from khipu.resend.run import ResendSelection
from khipu.tracing.headers import HEADER_RESEND_ID, TraceContext
from khipu.verdicts.model import Cause, VerdictKind
from tests.integration.resend import killable
from tests.integration.resend.pipeline import Pipeline, message_id_of, registry_text, resent_copies

pytestmark = pytest.mark.integration
TRIALS = 100


def write_originals(pipeline: Pipeline, count: int) -> tuple[list[int], list[tuple[int, int]]]:
    """``count`` records on in[0] (the processor's inputs) and on out (the skipped ones): their positions."""
    producer = Producer({**pipeline.broker.connection().client_config(), "enable.idempotence": True})
    landed: dict[tuple[str, int], tuple[int, int]] = {}  # (topic, n) -> (partition, offset)
    failed: list[Any] = []

    def remember(error: Any, message: Any) -> None:  # a delivery report carries no headers: n is the key
        if error is not None:
            failed.append(error)
        else:
            landed[(message.topic(), int(message.key()))] = (message.partition(), message.offset())

    for n in range(count):
        for topic, message_id in ((pipeline.inp, f"drop-{n}"), (pipeline.out, f"skip-{n}")):
            headers = TraceContext(message_id, "orders", 100.0).as_headers()
            producer.produce(
                topic, value=f"order-{n}".encode(), key=str(n).encode(), headers=headers, on_delivery=remember
            )
    assert producer.flush(30) == 0 and failed == []
    inputs = [landed[(pipeline.inp, n)][1] for n in range(count)]
    skipped = [landed[(pipeline.out, n)] for n in range(count)]
    return inputs, skipped


def test_a_resend_task_killed_at_random_points_leaves_exactly_one_copy_per_confirmed_loss(
    pipeline: Pipeline, tmp_path: Any
) -> None:
    hops = pipeline.hops
    inputs, skipped = write_originals(pipeline, TRIALS + 1)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.integration.resend.killable"])
    text = registry_text(pipeline.inp, pipeline.out)
    bootstrap = pipeline.broker.bootstrap_servers
    rng = random.Random(20261123)

    def losses(n: int) -> list[str]:
        pipeline.verdict(f"drop-{n}", hops["read_in"], VerdictKind.DELIVERED, partition=0, offset=inputs[n])
        pipeline.verdict(f"drop-{n}", hops["write_out"], VerdictKind.CONFIRMED_LOST, cause=Cause.DROPPED_IN_PROCESSOR)
        partition, offset = skipped[n]
        pipeline.verdict(
            f"skip-{n}", hops["s1"], VerdictKind.CONFIRMED_LOST, cause=Cause.SKIPPED_BY_CONSUMER,
            partition=partition, offset=offset,
        )  # fmt: skip
        return [f"drop-{n}", f"skip-{n}"]

    def start(message_ids: list[str]) -> tuple[Any, Any]:
        parent, child = context.Pipe()
        task = context.Process(target=killable.resend, args=(pipeline.store.url, text, bootstrap, message_ids, child))
        task.start()
        assert parent.poll(30) and parent.recv() == "started"
        return task, parent

    # a run left alone: how long one takes, so that the kills spread over all of it
    task, said = start(losses(TRIALS))
    began = time.monotonic()
    assert said.poll(60) and said.recv() == "done"
    run_s = time.monotonic() - began
    task.join(10)

    landed_at: Counter[str] = Counter()
    for n in range(TRIALS):
        ids = losses(n)
        task, _ = start(ids)
        time.sleep(rng.uniform(0, run_s * 1.2))
        task.kill()  # SIGKILL: no cleanup, wherever it is
        task.join(10)
        for message_id, hop in ((ids[0], hops["write_out"]), (ids[1], hops["s1"])):
            entries = pipeline.store.resends.attempts(message_id, hop)
            landed_at[entries[-1]["state"] if entries else "nothing recorded"] += 1
        restarted = pipeline.resender(now=int(time.time() * 1000) + LEASE_MS).run(  # the killed run's claim lapsed
            ResendSelection(frozenset({ResendMode.AUTO}), message_ids=tuple(ids))
        )
        assert {o.state for o in restarted.outcomes} <= {"produced", "waiting"}, restarted.as_dict()
        landed_at["found in the topic on restart"] += sum("found there" in o.detail for o in restarted.outcomes)
    print(f"\nresend killed at random over {TRIALS} trials (run {run_s * 1000:.0f} ms): ledger state at the kill "
          f"per loss {dict(landed_at)}")  # fmt: skip

    copies = Counter(message_id_of(m) for m in resent_copies(pipeline))
    expected = {f"{kind}-{n}" for kind in ("drop", "skip") for n in range(TRIALS + 1)}
    assert set(copies) == expected
    assert {message_id: n for message_id, n in copies.items() if n != 1} == {}  # exactly one copy each
    for message in resent_copies(pipeline):
        message_id = message_id_of(message)
        hop = hops["write_out"] if message_id.startswith("drop") else hops["s1"]
        (entry,) = pipeline.store.resends.attempts(message_id, hop)
        assert (entry["state"], entry["produced_partition"], entry["produced_offset"]) == (
            "produced", message.partition(), message.offset()
        )  # fmt: skip
        assert dict(message.headers())[HEADER_RESEND_ID] == entry["resend_id"].encode()
    assert landed_at["intended"] >= 10  # most kills landed inside an attempt, not before or after the run
