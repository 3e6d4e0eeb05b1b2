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
