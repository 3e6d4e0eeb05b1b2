"""Each figure of the view's pages says what its label says (issue 38's defects seen on the running stack): one
decision time per verdict on a message's page, a time lag that is the oldest unconsumed record's age or says it is
not known, a latency the first hop of a route cannot have said so, readable times in the links to lost messages.

Served by the view's FastAPI app over a real SQLite store (``tests/viewdata.py``'s seed, and what each test writes
through the store's own writers); Airflow's login is replaced by ``test_view_app.py``'s token check.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi.testclient import TestClient

from khipu.alerting.cluster import evaluate_cluster
from khipu.clock import utc_text
from khipu.health.evaluate import HealthConfig
from khipu.offsets.model import PartitionSnapshot, SnapshotRun
from khipu.reconcile.window import changes_for
from khipu.registry.loader import load_registry
from khipu.report.overview import DEFAULT_WINDOW
from khipu.store import Store
from khipu.verdicts.book import VerdictBook
from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu_airflow.view.app import ViewSources, create_app
from tests.unit.plugins.test_view_app import TOKEN, token_check
from tests.viewdata import AUDIT_READ, GROUP, STREAM, seed

ROOT = Path(__file__).resolve().parents[3]
NOW_MS = 1_795_000_000_000


@pytest.fixture
def view(tmp_path: Path) -> tuple[TestClient, Store]:
    url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    registry = load_registry(ROOT / "config" / "registry.yaml")
    seed(store, tmp_path / "archive", registry, NOW_MS)
    sources = ViewSources(lambda: store, lambda: registry, tmp_path / "archive", "local", lambda: NOW_MS)
    app = create_app(sources, token_check, lambda next_url: f"/auth/login?next={next_url}")
    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}), store


def fields(fragment: str, name: str) -> list[str]:
    """The texts of the elements ``data-field="name"`` in ``fragment`` (none of them nests another element)."""
    return [html.unescape(t).strip() for t in re.findall(rf'data-field="{name}"[^>]*>([^<]*)<', fragment)]


def hop_block(page: str, hop: str) -> str:
    """The message page's part about ``hop``."""
    return page.split(f'data-hop="{html.escape(hop)}"', 1)[1].split('<div class="hop', 1)[0]


def test_a_message_page_shows_each_decision_at_one_time(view: tuple[TestClient, Store]) -> None:
    """The detector judged the loss at 09:44:16 and its writer stored it at 09:44:19 (issue 38's two times);
    reconciliation confirmed it an hour later. The verdict line and the history say the same two times."""
    client, store = view
    book = VerdictBook(store.verdicts)
    judged_ms, written_ms, confirmed_ms = NOW_MS - 3_600_000, NOW_MS - 3_597_000, NOW_MS - 60_000

    def lost(at_ms: int, by: str) -> Verdict:
        return Verdict(
            message_id="m-decided", stream=STREAM, hop=AUDIT_READ, hop_kind="read", kind=VerdictKind.LOST,
            cause=Cause.SKIPPED_BY_CONSUMER, count=0, topic="demo.orders-enriched", partition=0, offset=9,
            group=GROUP[AUDIT_READ], location=None, observed_ms=None, latency_ms=None, e2e_latency_ms=None,
            decided_ms=at_ms, detail="skipped", first_seen_ms=at_ms - 5_000, decided_by=by,
        )  # fmt: skip

    book.record([lost(judged_ms, "detector")], written_ms)  # the detector's writer, seconds after the judgement
    stored = book.stored_verdicts(["m-decided"])["m-decided"]
    book.apply(changes_for(stored, [lost(confirmed_ms, "reconciliation")]), confirmed_ms)

    block = hop_block(client.get("/messages/m-decided").text, AUDIT_READ)
    assert fields(block, "verdict") == ["CONFIRMED_LOST"]
    assert fields(block, "decided") == [utc_text(confirmed_ms)]  # when it became CONFIRMED_LOST
    assert fields(block, "first-decided") == [utc_text(judged_ms)]  # when the detector judged it LOST
    assert fields(block, "at") == [utc_text(judged_ms), utc_text(confirmed_ms)]  # the history: the same two times


def test_a_group_keeping_up_with_records_waiting_shows_no_time_lag_of_zero(view: tuple[TestClient, Store]) -> None:
    """Issue 38's "lag 3, time lag 0 s". The sink keeps up: a minute before the newest snapshot the log ended at 50,
    below the offset it has now committed (51), so the 3 records waiting were written within that minute. Their
    age is not measured (the log end first passed 51 at the newest snapshot: the store's answer gave 0); the page
    says it is under a minute, the API that it is not known."""
    client, store = view
    group, topic = "demo-sink-store", "demo.orders-enriched"
    for minute, committed, log_end in ((2, 31, 40), (1, 41, 50), (0, 51, 54)):
        at = NOW_MS - 5_000 - minute * 60_000  # the seed's snapshots are on whole minutes before NOW_MS
        store.snapshots.write(
            SnapshotRun(at, "local", 1, 1, 5),
            [PartitionSnapshot(at, "local", group, topic, 1, committed, 0, log_end, "STABLE", 604_800_000)],
        )
    evaluate_cluster(store, "local", HealthConfig())  # as the snapshot DAG does after each snapshot
    (line,) = [p for p in client.get("/api/v1/health/consumers").json()["partitions"] if p["partition"] == 1]
    assert (line["lag"], line["time_lag_ms"], line["time_lag_under_ms"]) == (3, None, 60_000)
    row = client.get("/consumers").text.split(f'data-partition="{group}/{topic}/1"', 1)[1].split("</tr>", 1)[0]
    assert fields(row, "lag") == ["3"]
    assert fields(row, "time_lag") == ["< 60.0 s"]


def bursts_verdict(n: int, hop_index: int, decided_ms: int, latency_ms: int | None) -> Verdict:
    """A DELIVERED verdict of demo.bursts as the detector judges it at its hop ``hop_index``."""
    hop = load_registry(ROOT / "config" / "registry.yaml").stream("demo.bursts").route.hops[hop_index]
    return Verdict(
        message_id=f"burst-{n}", stream="demo.bursts", hop=hop.id, hop_kind=hop.kind.value,
        kind=VerdictKind.DELIVERED, cause=None, count=1, topic=hop.topic.topic, partition=0, offset=n,
        group=hop.group, location=hop.location, observed_ms=decided_ms - 100, latency_ms=latency_ms,
        e2e_latency_ms=latency_ms, decided_ms=decided_ms, detail="delivered", first_seen_ms=decided_ms - 1_000,
    )  # fmt: skip


def test_a_producers_write_says_it_has_no_latency_rather_than_a_bare_dash(view: tuple[TestClient, Store]) -> None:
    """Issue 38: producer edges showed a bare "p95" and a dash. The detector measures no latency at a producer's
    write (it is the message's first trace); the table and the map say so, and why."""
    client, store = view
    at = NOW_MS - 10 * 60_000
    VerdictBook(store.verdicts).record(
        [bursts_verdict(n, 0, at, None) for n in range(20)] + [bursts_verdict(n, 1, at, 250) for n in range(20)], at
    )
    stream = load_registry(ROOT / "config" / "registry.yaml").stream("demo.bursts")
    produce, read = (hop.id for hop in stream.route.hops[:2])
    page = client.get("/").text
    found = re.search(r'<table[^>]*data-stream="demo.bursts".*?</table>', page, re.S)
    assert found is not None
    table = found.group(0)
    row = table.split(f'data-hop="{html.escape(produce)}"', 1)[1].split("</tr>", 1)[0]
    assert fields(row, "delivered") == ["20"]
    assert [fields(row, p) for p in ("p50", "p95", "p99")] == [["n/a"]] * 3
    assert "the message&#39;s first trace" in row or "the message's first trace" in row  # the cells' tooltip
    row = table.split(f'data-hop="{html.escape(read)}"', 1)[1].split("</tr>", 1)[0]
    assert fields(row, "p95") == ["250 ms"]


def since_box(page: str) -> str:
    """What the lost page's "since" box holds."""
    found = re.search(r'<input name="since" value="([^"]*)"', page)
    assert found is not None, "the lost page has a since box"
    return html.unescape(found.group(1))


def test_links_to_lost_messages_carry_a_time_the_since_box_shows_as_it_is_typed(
    view: tuple[TestClient, Store],
) -> None:
    """Issue 38: route-map links put epoch milliseconds in the lost page's "since" box. Each link to a stream's or
    an edge's lost messages carries the window's first minute as the box's own format (its placeholder's,
    2026-11-23T10:00:00Z); the lost page takes it, and shows any time it was given (ms too) that way."""
    client, _ = view
    page = client.get("/").text
    since_ms = (NOW_MS - DEFAULT_WINDOW.span_ms) // 60_000 * 60_000  # the window's first minute
    readable = utc_text(since_ms).replace(" ", "T")  # 2026-11-18 11:06:40Z -> the placeholder's form
    links = [html.unescape(h) for h in re.findall(r'href="([^"]*/lost\?[^"]*)"', page)]
    assert links and all(parse_qs(urlsplit(link).query)["since"] == [readable] for link in links), links
    edge = next(link for link in links if parse_qs(urlsplit(link).query).get("hop") == [AUDIT_READ])
    answer = client.get(edge)
    assert answer.status_code == 200 and since_box(answer.text) == readable
    typed = client.get("/lost", params={"since": readable, "stream": STREAM})
    assert typed.status_code == 200 and since_box(typed.text) == readable
    shown = re.findall(r'data-message="([^"]+)"', typed.text)
    assert shown and shown == re.findall(
        r'data-message="([^"]+)"', client.get("/lost", params={"since": str(since_ms), "stream": STREAM}).text
    )
    assert since_box(client.get("/lost", params={"since": str(since_ms)}).text) == readable  # ms, shown readable
    assert since_box(client.get("/lost", params={"since": "soon"}).text) == "soon"  # refused: shown as typed
