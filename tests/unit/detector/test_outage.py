"""Through an outage the detector's lookups answer "not known" (or make the message wait) and ask again with a
bounded back-off; the writer writes a batch again with a bounded back-off and says so in the heartbeat.

A cluster that holds a request until the client's own wait runs out (what a SIGSTOPped broker does) is faked
here by an admin raising the ``TimeoutError`` that wait raises: a unit test has no broker to freeze (the
integration tests in tests/integration/detector/test_outages.py freeze a real one). The store that does not
answer is a real PostgreSQL URL on a port nothing listens on."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from khipu.detector.committed import (
    THE_STORE,
    ClusterClients,
    CommitHistories,
    CommittedOffsets,
    PointedPositions,
    StreamReadProgress,
)
from khipu.detector.decide import LookupUnavailable
from khipu.detector.model import DETECTOR_QUERY
from khipu.detector.outage import (
    OutageWatch,
    Waiting,
    WaitingReporter,
    backoff_ms,
    describe,
    heartbeat_waiting,
    write_with_retries,
)
from khipu.kafka import KafkaConnection
from khipu.localstack.processes import free_port
from khipu.store import Store


class _FrozenThenBack:
    """An admin whose requests time out until ``back`` is set (a frozen broker's answer, as the client sees it)."""

    def __init__(self) -> None:
        self.asked = 0
        self.back = False

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        self.asked += 1
        if not self.back:
            raise TimeoutError
        return {("orders", 0): 7}


class StandInClients(ClusterClients):
    """ClusterClients with one stand-in admin client for the cluster "local", and no store."""

    def __init__(self, admin: Any) -> None:
        super().__init__({"local": KafkaConnection("127.0.0.1:9")})
        self._admin = admin

    def admin(self, cluster: str) -> Any:
        return self._admin

    def store(self) -> None:
        return None


def test_a_committed_offset_lookup_that_times_out_is_not_known_and_asked_again_with_a_bounded_back_off() -> None:
    admin, now = _FrozenThenBack(), [0]
    lookup = CommittedOffsets(StandInClients(admin), cache_ms=0, clock_ms=lambda: now[0], histories=CommitHistories())
    assert lookup("local", "g", "orders", 0) is None  # not known: the hop waits (never "not committed")
    asked_at = []
    for now[0] in range(0, 150_000, 250):
        before = admin.asked
        assert lookup("local", "g", "orders", 0) is None
        if admin.asked > before:
            asked_at.append(now[0])
    gaps = [b - a for a, b in itertools.pairwise(asked_at)]
    assert gaps[:5] == [2_000, 4_000, 8_000, 16_000, 30_000] and set(gaps[5:]) == {30_000}  # 1 s, doubling, <= 30 s
    assert lookup.clients.take_unanswered() == {"local": admin.asked}  # every ask, for the driver's log
    assert lookup.clients.take_unanswered() == {}  # taken once
    admin.back = True
    now[0] += 30_000
    assert lookup("local", "g", "orders", 0) == 7  # answers again: read at once
    assert lookup.clients.take_unanswered() == {}


def test_a_pointer_lookup_whose_store_does_not_answer_makes_the_message_wait_never_answers_no() -> None:
    clients = ClusterClients({})
    pointed = PointedPositions(
        f"postgresql+psycopg2://nobody@127.0.0.1:{free_port()}/none?connect_timeout=2", clients.not_answered
    )
    with pytest.raises(LookupUnavailable, match="the store did not answer"):
        pointed("loc", "local", "orders", 0, 5)
    with pytest.raises(LookupUnavailable, match="tries; asked again soon"):  # within its back-off: not asked
        pointed("loc", "local", "orders", 0, 5)
    assert clients.take_unanswered() == {THE_STORE: 1}  # the driver is told: asked once, no answer


def test_an_executor_that_cannot_reach_the_store_decides_on_nothing_and_the_driver_is_told() -> None:
    """On a cluster, executors ask the store how far the trace topic is read; one that cannot reach it must
    not decide early, and must not look healthy either: each unanswered ask reaches the driver's log."""
    clients = ClusterClients({})
    progress = StreamReadProgress(
        f"postgresql+psycopg2://nobody@127.0.0.1:{free_port()}/none?connect_timeout=2",
        (DETECTOR_QUERY,),
        clients.not_answered,
    )
    assert progress(1_000) == 0  # read to the start of time: nothing is decided on it
    assert progress.running(1_000) is None  # the same batch: asked once
    assert clients.take_unanswered() == {THE_STORE: 1}
    assert progress(2_000) == 0  # the next batch asks again
    assert clients.take_unanswered() == {THE_STORE: 1}


def test_backoff_doubles_from_1_s_and_never_exceeds_30_s() -> None:
    assert [backoff_ms(n) for n in range(1, 9)] == [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]


def _store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    store.close()
    return url


def test_a_batch_the_store_does_not_take_is_written_again_and_the_heartbeat_says_what_it_waits_for(
    tmp_path: Path,
) -> None:
    url = _store(tmp_path)
    reporter, slept, tries = WaitingReporter(url, DETECTOR_QUERY), [], [0]

    def write() -> str:
        tries[0] += 1
        if tries[0] <= 3:
            raise OperationalError("INSERT", {}, Exception("server closed the connection unexpectedly"))
        return "written"

    assert write_with_retries(write, "batch 7", reporter, sleep=slept.append) == "written"
    assert slept == [1.0, 2.0, 4.0]
    store = Store(url)
    beat = store.heartbeat.latest(DETECTOR_QUERY)
    store.close()
    waiting = heartbeat_waiting(beat)
    assert waiting is not None and waiting.retries == 3 and "batch 7" in waiting.what
    assert "server closed the connection" in waiting.what
    assert beat is not None and beat["caught_up"] is False  # a waiting beat never says the topic was read


def test_a_fault_of_ours_is_raised_at_once_and_an_outage_past_the_limit_is_given_up() -> None:
    slept: list[float] = []

    def broken() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        write_with_retries(broken, "batch 1", sleep=slept.append)
    assert slept == []

    def down() -> None:
        raise OperationalError("SELECT", {}, Exception("connection refused"))

    with pytest.raises(OperationalError):
        write_with_retries(down, "batch 2", give_up_after_s=0.0, sleep=slept.append)


def test_the_watch_reports_a_quiet_query_whose_cluster_does_not_answer_and_nothing_once_it_moves(
    tmp_path: Path,
) -> None:
    url = _store(tmp_path)
    nowhere = KafkaConnection(f"127.0.0.1:{free_port()}", cluster="local")
    progress = [0]
    watch = OutageWatch(WaitingReporter(url, DETECTOR_QUERY), {"local": nowhere, "(traces)": nowhere},
                        lambda: progress[0], quiet_after_s=30, probe_timeout_s=1)  # fmt: skip
    assert list(watch.clusters) == ["(traces)"]  # one probe per cluster, however many names reach it
    assert watch.check(20_000) is None  # quiet for less than 30 s: not asked
    first = watch.check(31_000)
    assert first is not None and first.retries == 1 and f"cluster (traces) ({nowhere.bootstrap_servers})" in first.what
    second = watch.check(36_000)
    assert second is not None and second.retries == 2 and second.since_ms == 31_000
    store = Store(url)
    assert heartbeat_waiting(store.heartbeat.latest(DETECTOR_QUERY)) == second
    store.close()
    progress[0] = 40_000
    assert watch.check(41_000) is None and watch.longest_wait_ms == 5_000


@pytest.mark.parametrize("seed", range(3))
def test_messages_whose_lookups_cannot_ask_wait_through_the_outage_and_end_as_without_one(seed: int) -> None:
    """Random traffic (every fault, Kafka's own semantics) judged by a bucket twice: once with the world always
    answering (the reference, judged one message at a time by decide), once with an outage over four batches in
    which committed offsets are not known and the removal lookup raises LookupUnavailable. Every message ends with
    the same verdicts (message, hop, kind, cause, count); none is reported twice; some waited."""
    from khipu.detector.bucket import BucketJudge, BucketState, Lookups
    from khipu.detector.routes import RoutePlans
    from tests.unit.detector.test_bucket import (
        CONFIG,
        REGISTRY,
        OneByOne,
        World,
        key,
        random_messages,
        report,
        reported_again,
        rows_of,
    )  # fmt: skip

    rng = random.Random(seed)
    world = World()
    arrivals = random_messages(rng, 120, world)
    alone, bucket = OneByOne(REGISTRY), BucketJudge(RoutePlans.of(REGISTRY), CONFIG)
    outage, asked_in_outage = [False], [0]

    def committed(cluster: str, group: str, topic: str, partition: int) -> int | None:
        return None if outage[0] else world.committed_of(cluster, group, topic, partition)

    def removed(cluster: str, group: str, topic: str, partition: int, offset: int) -> Any:
        if outage[0]:
            asked_in_outage[0] += 1
            raise LookupUnavailable("the store did not answer: connection refused")
        return world.removed(cluster, group, topic, partition, offset)

    lookups = Lookups(committed, world.start_of, removed=removed, record=world.record)
    state = BucketState.empty()
    expected: list[tuple[Any, ...]] = []
    got: list[tuple[Any, ...]] = []
    reports: list[tuple[Any, ...]] = []
    expected_reports: list[tuple[Any, ...]] = []
    now = 100_000
    for step in range(60):
        new = [t for batch, t in arrivals if batch == step]
        for group, topic in (("proc", "in"), ("s1", "out"), ("s2", "out"), ("merge", "f1"), ("merge", "f2")):
            if step < 40 and rng.random() < 0.6:
                current = world.committed.get((group, topic, 0), 0)
                world.committed[(group, topic, 0)] = current + rng.randrange(0, 60)
        if step == 25:
            world.log_start[("out", 0)] = 3
        outage[0] = 10 <= step < 14
        from_alone = alone.evaluate(new, now, world)
        expected += [key(v)[:5] for v in from_alone]
        expected_reports += [report(v) for v in from_alone]
        evaluation = bucket.evaluate(state, rows_of(new, REGISTRY) if new else None, now, lookups)
        state = BucketState.decode(evaluation.state.encode())
        rows = evaluation.verdicts.to_dict("records")
        got += [key(row)[:5] for row in rows]
        reports += [report(row) for row in rows]
        now += rng.choice([5_000, 7_000, 20_000])
    # a hop reported again only when a receipt traced later changed it, as often as without the outage
    assert reported_again(reports) == reported_again(expected_reports)
    assert sorted(got) == sorted(expected)
    assert len(expected) > 300 and asked_in_outage[0] > 0  # messages did wait on a lookup that could not ask
    print(f"seed {seed}: {len(expected)} verdicts equal; {asked_in_outage[0]} lookups could not ask in the outage")


def test_the_watch_never_says_a_negative_wait_when_the_query_moves_during_its_probe_or_the_clock_goes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe of a cluster that does not answer takes up to its timeout; a batch that ends meanwhile moves the
    query's progress past the ``now`` the check was given (the detector's log once said "no progress for -3 s").
    And a clock set back makes ``now`` earlier than the wait's start."""
    url = _store(tmp_path)
    nowhere = KafkaConnection(f"127.0.0.1:{free_port()}", cluster="local")
    progress = [0]

    class MovesDuringTheProbe(OutageWatch):
        def silent(self) -> list[str]:
            found = super().silent()  # the real probe: the cluster does not answer
            progress[0] = moved_to
            return found

    watch = MovesDuringTheProbe(WaitingReporter(url, DETECTOR_QUERY), {"(traces)": nowhere}, lambda: progress[0],
                                quiet_after_s=30, probe_timeout_s=1)  # fmt: skip
    moved_to = 0
    first = watch.check(31_000)  # quiet 31 s: a wait since 31 s
    assert first is not None and first.since_ms == 31_000
    moved_to = 34_000  # a batch ended 3 s after the check began, while the cluster was probed
    assert watch.check(36_000 - 5_000) is None  # the clock was set back 5 s, and the query moved: not waiting
    progress[0], moved_to = 0, 0
    again = watch.check(29_000 + 31_000)
    assert again is not None and watch.longest_wait_ms >= 0
    assert describe(Waiting("waiting for the store", 40_000, 1), 37_000).startswith("waiting 0 s")  # since after now
    said = [record.getMessage() for record in caplog.records if record.name == "khipu.detector.outage"]
    assert said and not [line for line in said if re.search(r"-\d+ s", line)], said
