"""The khipu command: bad input gets a clear message and exit code 2; checks print what they found."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_registry_check_lists_every_hop_of_the_shipped_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["registry", "check", str(ROOT / "config" / "registry.yaml")]) == 0
    out = capsys.readouterr().out
    assert "valid; 2 stream(s)" in out
    assert "read  local/demo.orders-enriched -> demo-sink-audit" in out


def test_invalid_registry_exits_2_with_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "registry.yaml"
    bad.write_text("version: 1\nclusters: {a: {}}\nstreams:\n  s: {owner: t, sampling_percent: 200}\n")
    assert main(["registry", "check", str(bad)]) == 2
    assert "field 'sampling_percent': got 200" in capsys.readouterr().err


def test_demo_with_an_unknown_fault_exits_2_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "run", "--count", "1", "--fault", "meteor=0.5"]) == 2
    assert "got 'meteor=0.5'; expected 'name=rate' with name one of: consumer_skip" in capsys.readouterr().err


def test_demo_on_an_unknown_stream_exits_2_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "run", "--stream", "nope"]) == 2
    assert "unknown stream 'nope'; the registry defines: demo.bursts, demo.orders" in capsys.readouterr().err


def test_demo_against_an_unreachable_broker_exits_1_with_the_address(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from khipu.localstack.processes import free_port

    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("KHIPU_BOOTSTRAP_SERVERS", address)
    assert main(["demo", "run", "--count", "1", "--ledger", str(tmp_path / "l.jsonl")]) == 1
    assert f"cannot reach cluster 'local' at {address}" in capsys.readouterr().err


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "commands" in capsys.readouterr().out


def test_history_tells_how_a_messages_verdicts_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from khipu.detector.model import Cause, Verdict, VerdictKind
    from khipu.reconcile.book import VerdictBook
    from khipu.store import Store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("KHIPU_STORE_URL", url)
    store = Store(url)
    store.migrate()
    lost = Verdict(
        message_id="m1", stream="orders", hop="local/in -> s1", hop_kind="read", kind=VerdictKind.LOST,
        cause=Cause.SKIPPED_BY_CONSUMER, count=0, topic="in", partition=0, offset=7, group="s1", location=None,
        observed_ms=None, latency_ms=None, e2e_latency_ms=None, decided_ms=36_120_000, detail="skipped",
        first_seen_ms=36_000_000,
    )  # fmt: skip
    book = VerdictBook(store.verdicts)
    book.record([lost], 36_120_000)  # 10:02
    received = dataclasses.replace(
        lost,
        kind=VerdictKind.DELIVERED,
        cause=None,
        count=1,
        observed_ms=39_480_000,
        first_seen_ms=39_400_000,
        decided_ms=39_600_000,
    )
    book.record([received], 39_600_000)  # 11:00: a late RECEIVED trace from 10:58
    store.close()

    assert main(["history", "m1"]) == 0
    out = capsys.readouterr().out
    assert "local/in -> s1: RETRACTED" in out
    assert "LOST at 1970-01-01 10:02:00 UTC (detector)" in out
    assert (
        "RETRACTED at 1970-01-01 11:00:00 UTC (detector): RECEIVED trace at 1970-01-01 10:58:00 UTC at offset 7" in out
    )
    assert main(["history", "nope"]) == 1
