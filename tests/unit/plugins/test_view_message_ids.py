"""Any message id opens its page, over HTTP: one with '/', '%', '?', '#', spaces or non-ASCII letters is found by
the search, linked from the search and lost pages, and the link opens its page and its API answer (a '/' was a
404: the id was cut at it). The view runs over a real SQLite store, as in test_view_app.py, served by uvicorn on a
free port: Starlette's TestClient decodes a path twice (``%252F`` reaches the app as '/'), a server once."""

from __future__ import annotations

import html
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import uvicorn

from khipu.localstack.processes import free_port
from khipu.registry.loader import load_registry
from khipu.store import Store
from khipu_airflow.view.app import ViewSources, create_app
from tests.unit.plugins.test_view_app import TOKEN, token_check
from tests.viewdata import AUDIT_READ, PRODUCE, verdict

ROOT = Path(__file__).resolve().parents[3]
NOW_MS = 1_795_000_000_000
ODD_IDS = ["a/b", "/leading/and/trailing/", "50%off", "50%2Foff", "why?not", "tag#1", "two words", "pedido-ñandú-日本",
           "a/b/resend", "..%2F.."]  # fmt: skip


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    rows = []
    for n, message_id in enumerate(ODD_IDS):
        at = NOW_MS - (n + 1) * 60_000
        rows += [verdict(message_id, PRODUCE, "DELIVERED", at),
                 verdict(message_id, AUDIT_READ, "LOST", at + 1, cause="skipped_by_consumer")]  # fmt: skip
    store.verdicts.upsert(rows)
    registry = load_registry(ROOT / "config" / "registry.yaml")
    sources = ViewSources(
        store=lambda: store, load_registry=lambda: registry, archive_dir=tmp_path / "archive", cluster="local",
        now_ms=lambda: NOW_MS, verdict_archive_dir=tmp_path / "verdicts",
    )  # fmt: skip
    app = create_app(sources, token_check, lambda next_url: f"/auth/login?next={next_url}")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the view's server did not start"
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            yield http
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def links_to_messages(page: str) -> dict[str, str]:
    """The message links of a page: the id it shows -> the address it links to (as a browser reads the href)."""
    found = re.findall(r'<a href="(/messages/[^"]*)"><code[^>]*>([^<]*)</code></a>', page)
    return {html.unescape(shown): html.unescape(href) for href, shown in found}


@pytest.mark.parametrize("message_id", ODD_IDS)
def test_a_message_found_by_the_search_opens_from_its_link(client: httpx.Client, message_id: str) -> None:
    found = client.get("/api/v1/search", params={"q": message_id}).json()
    assert [m["message_id"] for m in found["messages"]] == [message_id]
    href = links_to_messages(client.get("/search", params={"q": message_id}).text)[message_id]
    page = client.get(href)
    assert page.status_code == 200, (href, page.status_code)
    assert f"<h1>Message <code>{html.escape(message_id)}</code></h1>" in page.text  # its own page, not a cut id's
    assert re.search(
        rf'data-hop="{re.escape(html.escape(AUDIT_READ))}">.*?data-field="verdict"[^>]*>LOST<', page.text, re.S
    )
    answer = client.get(href.replace("/messages/", "/api/v1/messages/", 1))
    assert answer.status_code == 200 and answer.json()["message_id"] == message_id, href


def test_every_odd_id_on_the_lost_page_links_to_its_own_page(client: httpx.Client) -> None:
    links = links_to_messages(client.get("/lost", params={"stream": "demo.orders", "since": "0"}).text)
    assert set(links) == set(ODD_IDS)
    for message_id, href in links.items():
        answer = client.get(href.replace("/messages/", "/api/v1/messages/", 1))
        assert answer.status_code == 200 and answer.json()["message_id"] == message_id, href


@pytest.mark.parametrize("message_id", ["a/b", "a/b/resend", "50%off", "two words"])
def test_a_resend_of_any_id_reaches_that_messages_loss(client: httpx.Client, message_id: str) -> None:
    """The page's resend form posts to the message's address plus /resend: the whole id arrives (this one's loss is
    LOST, not CONFIRMED_LOST, so the answer names the id and refuses)."""
    path = "/messages/" + quote(message_id, safe="") + "/resend"
    answer = client.post(path, data={"hop": AUDIT_READ}, headers={"Origin": str(client.base_url).rstrip("/")})
    assert answer.status_code == 400, (path, answer.status_code, answer.text[:300])
    assert f"a hop where {message_id} is CONFIRMED_LOST" in html.unescape(answer.text)
