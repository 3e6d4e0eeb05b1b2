"""The serial part of the detector's batches, and the ceilings it caps, as numbered cases worked by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from khipu.detector.serial import SerialPart, serial_part


def beat(batch: int, rows: int, duration_ms: int, collect_ms: int | None, driver_ms: int = 0, cpu_ms: int = 0) -> Any:
    return {"batch_id": batch, "input_rows": rows, "batch_duration_ms": duration_ms, "collect_ms": collect_ms,
            "driver_ms": driver_ms, "driver_cpu_ms": cpu_ms}  # fmt: skip


def test_the_first_batch_and_batches_the_writer_did_not_finish_or_that_read_nothing_are_left_out() -> None:
    part = serial_part(
        [beat(0, 90_000, 9_000, 8_000), beat(1, 50_000, 3_000, 2_000, 800, 700), beat(2, 0, 100, 50),
         beat(3, 50_000, 3_000, None), beat(4, 30_000, 2_000, 1_500, 400, 300)]
    )  # fmt: skip
    assert (part.batches, part.traces) == (2, 80_000)
    assert (part.batch_s, part.job_s, part.driver_s, part.driver_cpu_s) == (5.0, 3.5, 1.2, 1.0)
    assert part.serial_s == 1.5
    assert part.per_trace_us(part.serial_s) == pytest.approx(18.75)
    assert serial_part([beat(0, 10, 100, 50)], skip_first=False).traces == 10


@pytest.mark.parametrize(
    ("case", "traces", "job_ms", "serial_ms", "cores", "overlapped", "expected"),
    [
        # 1. 1,000 traces in a 1 s job on 2 cores: r = 500/s a core; 10 cores: 5,000/s, 1 ms serial a trace...
        (1, 1_000, 1_000, 1_000, 10, False, 1 / (1 / 5_000 + 1 / 1_000)),
        # 2. ... overlapped, the serial part alone caps it: 1 / 1 ms
        (2, 1_000, 1_000, 1_000, 10, True, 1_000.0),
        # 3. overlapped, few cores: the cores cap it (2 x 500)
        (3, 1_000, 1_000, 1_000, 2, True, 1_000.0),
        # 4. no serial part at all: the cores alone
        (4, 1_000, 1_000, 0, 40, False, 20_000.0),
        (5, 1_000, 1_000, 0, 40, True, 20_000.0),
        # 6. the figures: 17,600/s a core, 8 us serial, 40 cores: about 103,000 without overlap
        (6, 17_600, 500, 140.8, 40, False, 1 / (1 / 704_000 + 8e-6)),
    ],
)
def test_the_ceiling_on_c_cores(
    case: int, traces: int, job_ms: float, serial_ms: float, cores: int, overlapped: bool, expected: float
) -> None:
    part = SerialPart(1, traces, (job_ms + serial_ms) / 1000, job_ms / 1000, 0.0, 0.0)
    assert part.ceiling(cores, 2, overlapped=overlapped) == pytest.approx(expected)


def test_no_batches_give_no_figures_not_a_division_by_zero() -> None:
    part = serial_part([])
    assert part.traces == 0 and math.isnan(part.per_core_rate(2)) and math.isnan(part.per_trace_us(1.0))


def test_a_batchs_figures_wait_for_its_own_progress_event_even_after_the_next_batch_started() -> None:
    from khipu.detector.outputs import KEPT_BATCHES, BatchFigures, SerialTime

    figures = BatchFigures()
    figures.batch_done(7, lines=100)
    figures.batch_done(7, serial=SerialTime(40, 10, 9))
    figures.batch_done(8, lines=50)  # the next batch's writer ran before batch 7's progress event came
    assert figures.take(7) == (100, SerialTime(40, 10, 9))
    assert figures.take(7) == (None, None)  # taken once
    assert figures.take(8) == (50, None)  # its writer had not finished
    figures.batch_done(9, lines=1)
    figures.batch_done(9 + KEPT_BATCHES, lines=2)  # a progress event that never came is not kept for ever
    assert figures.take(9) == (None, None) and figures.take(9 + KEPT_BATCHES) == (2, None)


def test_the_writer_and_the_listener_may_hand_figures_over_at_once() -> None:
    """The writer (foreachBatch's thread) adds a batch's figures while the listener (another thread) takes an earlier
    batch's: without the lock the writer's pruning loop saw the dictionary change size (RuntimeError)."""
    import sys
    import threading

    from khipu.detector.outputs import BatchFigures

    figures, failed, latest = BatchFigures(), [], [0]
    done = threading.Event()

    def listener() -> None:
        while not done.is_set():
            for batch in range(latest[0] - 12, latest[0] + 1):  # the batches whose figures may be waiting
                figures.take(batch)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: the race shows within the run
    taker = threading.Thread(target=listener)
    taker.start()
    try:
        for batch in range(300_000):
            latest[0] = batch
            figures.batch_done(batch, lines=batch)
    except RuntimeError as exc:  # pragma: no cover - what the test is here to catch
        failed.append(exc)
    finally:
        done.set()
        taker.join()
        sys.setswitchinterval(switch)
    assert not failed
