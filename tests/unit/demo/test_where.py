"""A demo that does not settle says where the application that is behind waits: its thread's innermost calls."""

from __future__ import annotations

import threading

from khipu.demo.pipeline import _where


def waits_for_the_broker(event: threading.Event) -> None:
    event.wait(30)


def test_a_component_thread_is_named_by_its_innermost_calls_and_an_ended_one_says_so() -> None:
    release = threading.Event()
    thread = threading.Thread(target=waits_for_the_broker, args=(release,), daemon=True)
    thread.start()
    try:
        where = _where(thread)  # type: ignore[arg-type]  # any thread: only its ident is read
    finally:
        release.set()
        thread.join(5)
    assert where.startswith("its thread is in wait (threading.py:")
    assert "waits_for_the_broker (test_where.py:11)" in where
    assert _where(thread) == "its thread has ended"
