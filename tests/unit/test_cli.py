"""The khipu command: bad input gets a clear message and exit code 2; checks print what they found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from khipu.cli import main
from khipu.registry.loader import load_registry
from khipu.store import Store
from tests.archived import seed_archived
from tests.viewdata import AUDIT_READ, ENRICH_WRITE, PRODUCE, STORE_READ, STREAM, Seeded, seed

ROOT = Path(__file__).resolve().parents[2]


def test_registry_check_lists_every_hop_of_the_shipped_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["registry", "check", str(ROOT / "config" / "registry.yaml")]) == 0
    out = capsys.readouterr().out
    assert "valid; 2 stream(s)" in out
    assert "read  local/demo.orders-enriched -> demo-sink-audit" in out


def test_invalid_registry_exits_2_with_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "registry.yaml"
    bad.write_text("version: 1\nclusters: {a: {}}\nstreams:\n  s: {owner: team-t, sampling_percent: 200}\n")
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

    from khipu.store import Store
    from khipu.verdicts.book import VerdictBook
    from khipu.verdicts.model import Cause, Verdict, VerdictKind

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


@pytest.fixture
def seeded_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Seeded, Store]:
    """A store and archive holding tests/viewdata.py's messages, health, alerts; KHIPU_* point the CLI at them."""
    import time

    url = f"sqlite:///{tmp_path / 'state' / 'khipu.db'}"
    (tmp_path / "state").mkdir()
    monkeypatch.setenv("KHIPU_STORE_URL", url)
    monkeypatch.setenv("KHIPU_STATE_DIR", str(tmp_path / "state"))
    store = Store(url)
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    return seed(store, tmp_path / "state" / "archive", registry, time.time_ns() // 1_000_000), store


def test_trace_lays_a_message_along_its_route_in_text_and_json(
    seeded_store: tuple[Seeded, Store], capsys: pytest.CaptureFixture[str]
) -> None:
    seeded, store = seeded_store
    assert main(["trace", seeded.skipped]) == 0
    text = capsys.readouterr().out
    hops = [hop.id for hop in load_registry(ROOT / "config" / "registry.yaml").stream(STREAM).route.hops]
    assert [
        line.split(" ", 1)[1].split(":")[0].strip() for line in text.splitlines() if line[:5] in ("write", "read ")
    ] == hops
    assert f"{AUDIT_READ}: LOST/skipped_by_consumer" in text and "order_id=order-4711" in text
    assert text.count("RECEIVED") == 2 and text.count("SENT") == 2

    assert main(["trace", seeded.skipped, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    stored = {r["hop"]: r["verdict"] for r in store.verdicts.read_messages([seeded.skipped])}
    assert {h["hop"]: (h["verdict"] or {}).get("verdict") for h in report["hops"]} == stored
    assert main(["trace", "never-seen"]) == 1
    assert "no verdict and no archived trace of message 'never-seen'" in capsys.readouterr().err


def test_trace_shows_archived_delivered_hops_beside_the_stores_loss_and_a_changed_one_as_stored(
    seeded_store: tuple[Seeded, Store], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    seeded, store = seeded_store
    archived = seed_archived(store, tmp_path / "state" / "verdicts", seeded.now_ms)
    assert main(["trace", archived.partly_lost, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = {
        r["hop"]: r["verdict"] for r in archived.archived + archived.sql if r["message_id"] == archived.partly_lost
    }
    assert {h["hop"]: (h["verdict"] or {}).get("verdict") for h in report["hops"]} == expected
    assert main(["trace", archived.partly_lost]) == 0
    text = capsys.readouterr().out
    assert f"{AUDIT_READ}: LOST/skipped_by_consumer" in text and f"{PRODUCE}: DELIVERED at" in text

    assert main(["trace", archived.changed]) == 0
    text = capsys.readouterr().out
    assert f"{STORE_READ}: DUPLICATE/rewind_replay" in text and text.count(": DELIVERED at ") == 4


def test_history_shows_an_archived_verdicts_decision_and_a_stored_change(
    seeded_store: tuple[Seeded, Store], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    seeded, store = seeded_store
    archived = seed_archived(store, tmp_path / "state" / "verdicts", seeded.now_ms)
    assert main(["history", archived.changed, "--json"]) == 0
    hops = {h["hop"]: h for h in json.loads(capsys.readouterr().out)}
    produce = next(r for r in archived.archived if r["message_id"] == archived.changed and r["hop"] == PRODUCE)
    assert [(c["from_verdict"], c["to_verdict"], c["at_ms"], c["reason"]) for c in hops[PRODUCE]["changes"]] == [
        (None, "DELIVERED", produce["decided_ms"], "decided")
    ]
    assert [(c["from_verdict"], c["to_verdict"]) for c in hops[STORE_READ]["changes"]] == [("DELIVERED", "DUPLICATE")]
    assert hops[STORE_READ]["now"]["verdict"] == "DUPLICATE"
    assert main(["history", archived.changed]) == 0
    text = capsys.readouterr().out
    assert f"{PRODUCE}: DELIVERED\n    DELIVERED at " in text and f"{STORE_READ}: DUPLICATE/rewind_replay" in text


def test_health_shows_time_lag_and_reason_and_refuses_an_unknown_group(
    seeded_store: tuple[Seeded, Store], capsys: pytest.CaptureFixture[str]
) -> None:
    _, store = seeded_store
    stalled = next(r for r in store.health.current_rows("local") if r["status"] == "STALL")
    assert main(["health", "--group", stalled["group_id"]]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith(stalled["group_id"])]
    assert f"{stalled['time_lag_ms'] // 1000}s" in line and stalled["reason"] in line and " STALL " in line
    assert main(["health", "--json"]) == 0
    partitions = json.loads(capsys.readouterr().out)["partitions"]
    assert sorted((p["group"], p["status"]) for p in partitions) == sorted(
        (r["group_id"], r["status"]) for r in store.health.current_rows("local")
    )
    assert main(["health", "--group", "nobody"]) == 2
    assert "demo-sink-audit, demo-sink-store" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["verdicts", "--stream", "nope"], "the registry defines: demo.bursts, demo.orders"),
        (["verdicts", "--minutes", "-5"], "a window of more than 0 minutes"),
        (["alerts", "--minutes", "0"], "a window of more than 0 minutes"),
    ],
)
def test_unknown_streams_and_negative_windows_exit_2_naming_what_is_known(
    seeded_store: tuple[Seeded, Store], capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    assert main(argv) == 2
    assert named in capsys.readouterr().err


def test_read_commands_print_json_of_what_the_store_holds(
    seeded_store: tuple[Seeded, Store], capsys: pytest.CaptureFixture[str]
) -> None:
    seeded, store = seeded_store
    assert main(["alerts", "--json"]) == 0
    alerts = json.loads(capsys.readouterr().out)
    assert [a["title"] for a in alerts] == [a.title for a in store.alerts.read()]
    assert main(["verdicts", "--json", "--stream", STREAM]) == 0
    summary = json.loads(capsys.readouterr().out)
    in_hour = [r for r in seeded.verdicts if r["decided_ms"] >= seeded.now_ms - 3_600_000]
    assert summary["verdicts"] == len(in_hour)
    assert summary["not_losses"] == {  # Kafka's own semantics and reprocessing, shown apart from losses
        "ABORTED": sum(r["verdict"] == "ABORTED" for r in in_hour),
        "SUPERSEDED": sum(r["verdict"] == "SUPERSEDED" for r in in_hour),
        "reprocessed": sum(r.get("cause") == "reprocessed_after_abort" for r in in_hour),
    }
    assert main(["verdicts", "--stream", STREAM]) == 0
    said = f"not losses (Kafka's own semantics): {summary['not_losses']['ABORTED']} ABORTED"
    assert summary["not_losses"]["ABORTED"] > 0 and said in capsys.readouterr().out
    assert main(["history", seeded.dropped, "--json"]) == 0
    hops = {h["hop"]: h for h in json.loads(capsys.readouterr().out)}
    assert set(hops) == {r["hop"] for r in store.verdicts.read_messages([seeded.dropped])}
    assert [c["to_verdict"] for c in hops[ENRICH_WRITE]["changes"]] == ["LOST", "CONFIRMED_LOST"]
    assert hops[ENRICH_WRITE]["now"]["verdict"] == "CONFIRMED_LOST"


def test_demo_faults_steers_the_running_demos_rates_and_refuses_unknown_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from khipu.demo.control import DemoControl

    monkeypatch.setenv("KHIPU_STATE_DIR", str(tmp_path))
    control = DemoControl(tmp_path / "demo" / "control.json", check_interval_s=0)
    assert main(["demo", "faults", "consumer_skip=0.2"]) == 0
    assert control.fault_overrides() == {"consumer_skip": 0.2} and "consumer_skip=0.2" in capsys.readouterr().out
    assert main(["demo", "faults", "skipping=0.2"]) == 2
    assert "consumer_skip, processor_drop" in capsys.readouterr().err
    assert main(["demo", "faults", "consumer_skip=2"]) == 2
    assert "a probability in [0, 1]" in capsys.readouterr().err
    assert main(["demo", "faults", "--reset"]) == 0
    assert control.fault_overrides() == {}


def test_settings_prints_each_setting_with_its_source_and_masks_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "khipu.env"
    file.write_text("KHIPU_EXPORTER_TOKEN=t0ken-in-file\nKHIPU_HEALTH_WINDOW=7\n")
    monkeypatch.setenv("KHIPU_SETTINGS_FILE", str(file))
    monkeypatch.setenv("KHIPU_STORE_URL", "postgresql://khipu:hunter2@db/khipu")
    monkeypatch.setenv("KHIPU_HEALTH_WINDOW", "3")  # the environment wins over the file
    assert main(["settings", "--json"]) == 0
    rows = {row["variable"]: row for row in json.loads(capsys.readouterr().out)}
    assert (rows["KHIPU_HEALTH_WINDOW"]["value"], rows["KHIPU_HEALTH_WINDOW"]["source"]) == ("3", "environment")
    assert (rows["KHIPU_EXPORTER_TOKEN"]["value"], rows["KHIPU_EXPORTER_TOKEN"]["source"]) == ("***", "file")
    assert rows["KHIPU_STORE_URL"]["value"] == "postgresql+psycopg2://khipu:***@db/khipu"  # the driver it opens
    assert rows["KHIPU_EXPORTER_PORT"]["source"] == "default"
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    assert f"settings file: {file}" in out and "hunter2" not in out and "t0ken-in-file" not in out
