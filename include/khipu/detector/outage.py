"""The detector through an outage of a cluster or of the store: it keeps its query, waits, retries with a bounded
back-off, and says so in its log and its heartbeat (``detector_heartbeat.waiting``, ``waiting_since_ms``,
``retries``).

Three places wait, each in its own way:

- Spark's Kafka source, when the trace cluster does not answer: it asks again (``fetchOffset.numRetries`` tries,
  ``fetchOffset.retryIntervalMs`` apart, each bounded by the admin client's ``default.api.timeout.ms``), and an
  executor's fetch waits up to ``kafkaConsumer.pollTimeoutMs`` (:data:`SOURCE_OPTIONS`). No Python runs meanwhile,
  so :class:`OutageWatch`, a thread of the driver, notices the query has been quiet, asks each cluster and the
  store whether it answers, and reports what does not in a heartbeat: the supervisor sees a detector that waits,
  not a hung one (restarting it would not bring the broker back).
- The lookups on the executors (committed offsets, log starts, pointers, removal evidence;
  :mod:`khipu.detector.committed`): a cluster or store that does not answer is asked again with a bounded back-off,
  and a message whose verdict needs its answer waits (:class:`khipu.detector.decide.LookupUnavailable`).
- The writer (foreachBatch, in the driver): a batch whose outputs the store or the lost topic does not take is
  written again, whole, after a bounded back-off (:func:`write_with_retries`; every output of a batch is keyed by
  the batch, so a second write replaces the first). Past ``give_up_after_s`` it fails, and the query with it: the
  DAG's restart from the checkpoint is the last resort.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from khipu.clock import elapsed_ms
from khipu.detector.committed import CLUSTER_UNAVAILABLE, FIRST_RETRY_MS, MOST_RETRY_MS, STORE_UNAVAILABLE
from khipu.kafka import KafkaAdmin, KafkaConnection
from khipu.store import Store

log = logging.getLogger(__name__)
T = TypeVar("T")

WRITER_UNAVAILABLE = (*STORE_UNAVAILABLE, *CLUSTER_UNAVAILABLE)
GIVE_UP_AFTER_S = 1_800.0  # a batch's outputs retried this long; then the query fails (the DAG restarts it)

# Spark's Kafka source through an outage of the trace cluster: each try to learn the topic's offsets waits up to
# 30 s (default.api.timeout.ms), tries are 5 s apart, 60 of them (about 35 min); an executor's fetch waits up to
# 10 min for records the broker has not served. Without these, a broker gone for about 3 min failed the query.
SOURCE_OPTIONS = {
    "fetchOffset.numRetries": "60",
    "fetchOffset.retryIntervalMs": "5000",
    "kafka.default.api.timeout.ms": "30000",
    "kafkaConsumer.pollTimeoutMs": "600000",
}


def backoff_ms(tries: int, first_ms: int = FIRST_RETRY_MS, most_ms: int = MOST_RETRY_MS) -> int:
    """The wait before try ``tries + 1``: ``first_ms`` doubled per try already failed, at most ``most_ms``."""
    return int(min(most_ms, first_ms * 2 ** max(0, tries - 1)))


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a query waits for: ``what`` (a sentence), since when, and how many tries failed so far."""

    what: str
    since_ms: int
    retries: int


class WaitingReporter:
    """Writes the heartbeat of a query that waits (best effort: a store that is down cannot take it, and the log
    says it all the same). Shared by the watch and the writer, in the driver."""

    def __init__(self, store_url: str, query_name: str) -> None:
        self.store_url, self.query_name = store_url, query_name
        self._store: Store | None = None
        self.last: Waiting | None = None  # the newest report (tests and the log read it)
        self.reports = 0

    def report(self, waiting: Waiting, now_ms: int) -> None:
        self.last, self.reports = waiting, self.reports + 1
        beat = {
            "query_name": self.query_name, "run_id": "waiting", "batch_id": -2, "at_ms": now_ms, "input_rows": 0,
            "input_rows_per_s": 0.0, "processed_rows_per_s": 0.0, "batch_duration_ms": 0, "state_rows": None,
            "state_bytes": None, "caught_up": False, "read_to_ms": None, "waiting": waiting.what[:2000],
            "waiting_since_ms": waiting.since_ms, "retries": waiting.retries,
        }  # fmt: skip
        try:
            if self._store is None:
                self._store = Store(self.store_url)
            self._store.heartbeat.record(beat)
        except Exception as exc:  # the store may be what is down; never let the report stop the detector
            log.warning("the heartbeat of a waiting detector not stored: %s", exc)


def write_with_retries(
    write: Callable[[], T],
    what: str,
    reporter: WaitingReporter | None = None,
    give_up_after_s: float = GIVE_UP_AFTER_S,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``write()``, again and again while it fails for want of the store or a cluster: after 1 s, then twice as
    long each time, at most 30 s apart, each try logged and reported; past ``give_up_after_s`` the last error is
    raised. Any other error is raised at once (a fault of ours is not waited out)."""
    since = time.time_ns() // 1_000_000  # the wall clock for the heartbeat; durations on the monotonic clock
    started_s = time.monotonic()
    tries = 0
    while True:
        try:
            result = write()
        except WRITER_UNAVAILABLE as exc:
            tries += 1
            now = time.time_ns() // 1_000_000
            waited_s = time.monotonic() - started_s
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if waited_s >= give_up_after_s:
                log.error("%s: gave up after %d tries over %.0f s: %s", what, tries, waited_s, why)
                raise
            delay_ms = backoff_ms(tries)
            log.warning("%s did not go through (try %d, %.0f s so far; next in %.0f s): %s", what, tries, waited_s,
                        delay_ms / 1000, why)  # fmt: skip
            if reporter is not None:
                reporter.report(Waiting(f"{what}: {why}", since, tries), now)
            sleep(delay_ms / 1000)
            continue
        if tries:
            log.warning("%s went through after %d failed tries, %.1f s", what, tries,
                        time.monotonic() - started_s)  # fmt: skip
        return result


class OutageWatch(threading.Thread):
    """A driver thread: once the query has made no progress for ``quiet_after_s``, asks every cluster and the
    store whether they answer (every ``every_s``); while one does not, the heartbeat says what the query waits
    for, since when, and how many times it was asked (bounded by the clients' own timeouts, ``probe_timeout_s``).
    A quiet query whose clusters and store all answer is left to the supervisor (it may be hung)."""

    def __init__(
        self,
        reporter: WaitingReporter,
        clusters: Mapping[str, KafkaConnection],
        last_progress_ms: Callable[[], int],
        quiet_after_s: float = 30.0,
        every_s: float = 5.0,
        probe_timeout_s: float = 5.0,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__(name="khipu-outage-watch", daemon=True)
        self.reporter = reporter
        self.clusters: dict[str, KafkaConnection] = {}  # one probe per cluster, however many names reach it
        for name, connection in sorted(clusters.items()):
            if all(c.bootstrap_servers != connection.bootstrap_servers for c in self.clusters.values()):
                self.clusters[name] = connection
        self.last_progress_ms, self.active = last_progress_ms, active
        self.quiet_after_s, self.every_s, self.probe_timeout_s = quiet_after_s, every_s, probe_timeout_s
        self.stopped = threading.Event()
        self._admins: dict[str, KafkaAdmin] = {}
        self._since: int | None = None
        self._tries = 0
        self.longest_wait_ms = 0  # the longest outage it reported (figures for the log and the tests)

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            try:
                if not self.active():  # its query ended: nothing to watch
                    return
                self.check(time.time_ns() // 1_000_000)
            except Exception:  # the watch must never take the driver down
                log.exception("outage watch failed; it goes on")

    def check(self, now_ms: int) -> Waiting | None:
        """Whether the query waits at ``now_ms``: the query's progress is read once, before the probes (which take
        up to their timeout); a batch that ends meanwhile means it does not wait. Durations never go negative (a
        clock set back, a progress stamped after ``now_ms``)."""
        last_progress_ms = self.last_progress_ms()
        quiet_ms = elapsed_ms(last_progress_ms, now_ms)
        if quiet_ms < self.quiet_after_s * 1000:
            self._went_on(now_ms)
            return None
        silent = self.silent()
        if not silent:
            return None
        if self.last_progress_ms() > last_progress_ms:  # a batch ended while the probes waited: it goes on
            self._went_on(now_ms)
            return None
        self._tries += 1
        self._since = self._since if self._since is not None else now_ms
        self.longest_wait_ms = max(self.longest_wait_ms, elapsed_ms(self._since, now_ms))
        waiting = Waiting("waiting for " + "; ".join(silent), self._since, self._tries)
        log.warning("the detector's query has made no progress for %.0f s: %s (check %d)",
                    quiet_ms / 1000, waiting.what, self._tries)  # fmt: skip
        self.reporter.report(waiting, now_ms)
        return waiting

    def _went_on(self, now_ms: int) -> None:
        if self._since is not None:
            log.warning("the detector's query goes on after waiting %.0f s (%d checks)",
                        elapsed_ms(self._since, now_ms) / 1000, self._tries)  # fmt: skip
            self._since, self._tries = None, 0

    def silent(self) -> list[str]:
        """What does not answer now: each cluster (its metadata), then the store."""
        found: list[str] = []
        for name, connection in sorted(self.clusters.items()):
            try:
                admin = self._admins.get(name) or KafkaAdmin(connection, timeout_s=self.probe_timeout_s)
                self._admins[name] = admin
                admin.partitions()
            except CLUSTER_UNAVAILABLE as exc:
                found.append(f"cluster {name} ({connection.bootstrap_servers}): {_first_line(exc)}")
        try:
            store = Store(self.reporter.store_url)
            try:
                store.heartbeat.latest(self.reporter.query_name)
            finally:
                store.close()
        except STORE_UNAVAILABLE as exc:
            found.append(f"the store: {_first_line(exc)}")
        return found


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def describe(waiting: Waiting | None, now_ms: int) -> str:
    """One line for a person: what the detector waits for and for how long, or ''."""
    if waiting is None:
        return ""
    return f"waiting {elapsed_ms(waiting.since_ms, now_ms) / 1000:.0f} s ({waiting.retries} tries): {waiting.what}"


def heartbeat_waiting(beat: Mapping[str, Any] | None) -> Waiting | None:
    """The wait a heartbeat row reports, if any."""
    if beat is None or not beat.get("waiting"):
        return None
    return Waiting(
        str(beat["waiting"]), int(beat.get("waiting_since_ms") or beat["at_ms"]), int(beat.get("retries") or 0)
    )
