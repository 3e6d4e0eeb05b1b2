"""The Khipu view in Airflow's own api-server, behind Airflow's login, driven by a real browser.

Debian's Chromium (``scripts/ensure-chromium`` installs it; ``make test`` runs that) driven by
Playwright with ``executable_path``: no browser is downloaded. The store and the trace archive hold
what ``tests/viewdata.py`` writes through the store's repositories; each page's figures are checked
against what the store returns. Screenshots go to ``$KHIPU_SCREENSHOT_DIR`` (``make screenshots``
sets it to ``docs/screenshots``) or to the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from khipu.access import EVERY_STREAM_TEAM
from khipu.localstack.airflow import ensure_teams
from khipu.localstack.processes import free_port
from khipu.registry.loader import load_registry
from khipu.store import Store
from tests.integration.view.conftest import api_server
from tests.viewdata import AUDIT_READ, STREAM, Seeded, seed

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
USER = "khipu-viewer"


@dataclass
class Server:
    base: str
    password: str
    store_url: str
    seeded: Seeded
    log: Path

    def store(self) -> Store:
        return Store(self.store_url)


@pytest.fixture(scope="module")
def server(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Airflow's api-server with this checkout's plugins, one user (role viewer) with a drawn password, in the team
    that sees every stream (multi-team mode; tests/integration/view/test_view_teams.py has teams of their own)."""
    work = tmp_path_factory.mktemp("view")
    password = secrets.token_urlsafe(12)
    passwords = work / "passwords.json"
    passwords.write_text(json.dumps({USER: password}))
    store_url = f"sqlite:///{work / 'khipu.db'}"
    store = Store(store_url)
    store.migrate()
    seeded = seed(store, work / "state" / "archive", load_registry(ROOT / "config" / "registry.yaml"), _now_ms())
    store.close()
    port = free_port()
    env = {
        **os.environ,
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:viewer:{EVERY_STREAM_TEAM}",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "KHIPU_STORE_URL": store_url,
        "KHIPU_STATE_DIR": str(work / "state"),
    }
    log = work / "api-server.log"
    ensure_teams([EVERY_STREAM_TEAM], env, work / "setup.log")
    with api_server(env, port, log) as base:
        yield Server(base, password, store_url, seeded, log)


def test_without_an_airflow_login_the_view_and_its_api_are_refused(server: Server) -> None:
    for path in ("/khipu/api/v1/streams", "/khipu/api/v1/verdicts", "/khipu/api/v1/openapi.json"):
        assert _status(f"{server.base}{path}") == 401, path
        assert _status(f"{server.base}{path}", token="forged.jwt.token") in (401, 403), path
    request = urllib.request.Request(f"{server.base}/khipu/lost")
    opener = urllib.request.build_opener(_NoRedirect())
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=10)
    assert refused.value.code == 303 and "/auth/login" in refused.value.headers["location"]


def test_an_airflow_token_opens_the_api(server: Server) -> None:
    token = _token(server)
    with urllib.request.urlopen(_with_token(f"{server.base}/khipu/api/v1/verdicts", token), timeout=10) as answer:
        rows = json.loads(answer.read())["rows"]
    losses = [r for r in server.seeded.verdicts if r["verdict"] in ("LOST", "CONFIRMED_LOST")]
    newest_first = sorted(losses, key=lambda r: (r["decided_ms"], r["message_id"], r["hop"]), reverse=True)
    assert [r["message_id"] for r in rows] == [r["message_id"] for r in newest_first] != []


def test_a_viewer_logs_in_and_each_page_shows_what_the_store_holds(
    server: Server, browser: Browser, shots: Path
) -> None:
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    try:
        _log_in(page, server, f"{server.base}/khipu/")
        store = server.store()

        # Airflow's own navigation carries the view, embedded in its UI
        page.goto(f"{server.base}/")
        page.get_by_test_id("nav-sidebar").get_by_role("link", name="Khipu", exact=True).click()
        page.wait_for_url("**/plugin/khipu**")
        embedded = page.frame_locator("iframe").first
        embedded.get_by_role("heading", name="Streams").wait_for()
        page.wait_for_timeout(500)
        page.screenshot(path=str(shots / "khipu-in-airflow.png"))

        # streams overview: the audit hop's last hour, as the store's minutes say
        page.goto(f"{server.base}/khipu/")
        hour_ago = _now_ms() - 3_600_000
        minutes = [r for r in store.verdicts.read_metrics(stream=STREAM, since_ms=hour_ago) if r["hop"] == AUDIT_READ]
        row = page.locator(f'table[data-stream="{STREAM}"] tr[data-hop="{AUDIT_READ}"][data-window="1h"]')
        assert row.locator('[data-field="lost"]').inner_text() == str(sum(r["lost"] for r in minutes))
        assert row.locator('[data-field="delivered"]').inner_text() == str(sum(r["delivered"] for r in minutes))
        hops = len(load_registry(ROOT / "config" / "registry.yaml").stream(STREAM).route.hops)
        assert page.locator(f'table[data-stream="{STREAM}"] svg.spark').count() == 2 * hops
        page.screenshot(path=str(shots / "streams.png"), full_page=True)

        # lost messages: the store's losses, newest first; one click to a message
        page.goto(f"{server.base}/khipu/lost")
        shown = page.locator("table[data-testid=verdicts] tr[data-message]")
        losses = [r for r in server.seeded.verdicts if r["verdict"] in ("LOST", "CONFIRMED_LOST")]
        newest_first = sorted(losses, key=lambda r: (r["decided_ms"], r["message_id"], r["hop"]), reverse=True)
        assert shown.evaluate_all("rows => rows.map(r => r.dataset.message)") == [r["message_id"] for r in newest_first]
        page.screenshot(path=str(shots / "lost-messages.png"), full_page=True)
        page.goto(f"{server.base}/khipu/lost?cause=dropped_in_processor")
        assert page.locator("tr[data-message]").evaluate_all("rows => rows.map(r => r.dataset.message)") == [
            server.seeded.dropped
        ]
        page.goto(f"{server.base}/khipu/lost")
        page.get_by_role("link", name=server.seeded.skipped).click()
        page.wait_for_url(f"**/khipu/messages/{server.seeded.skipped}")
        audit = page.locator(f'div[data-hop="{AUDIT_READ}"]')
        stored_audit = next(r for r in store.verdicts.read_messages([server.seeded.skipped]) if r["hop"] == AUDIT_READ)
        assert audit.locator('[data-field="verdict"]').inner_text() == stored_audit["verdict"]
        assert page.locator("tr[data-trace]").count() == 4  # SENT, RECEIVED, SENT, RECEIVED: the archive's traces
        assert f"order_id={server.seeded.order_id}" in page.inner_text("main")
        page.screenshot(path=str(shots / "message.png"), full_page=True)

        # consumer health: the stalled partition as stored
        page.goto(f"{server.base}/khipu/consumers")
        stalled = next(r for r in store.health.current_rows("local") if r["status"] == "STALL")
        key = f"{stalled['group_id']}/{stalled['topic']}/{stalled['partition']}"
        line = page.locator(f'tr[data-partition="{key}"]')
        assert line.locator('[data-field="status"]').inner_text() == "STALL"
        assert line.locator('[data-field="lag"]').inner_text() == str(stalled["lag"])
        assert line.locator('[data-field="reason"]').inner_text() == stalled["reason"]
        page.screenshot(path=str(shots / "consumer-health.png"), full_page=True)

        # Khipu's own health
        page.goto(f"{server.base}/khipu/self")
        total, _ = store.channel.quarantine_page()
        assert page.locator("[data-testid=quarantined]").inner_text() == str(total)
        beat = store.heartbeat.latest("khipu_detector")
        assert beat is not None
        assert page.locator('tr[data-query="khipu_detector"] [data-field="state_rows"]').inner_text() == str(
            beat["state_rows"]
        )
        archive = Path(server.store_url.removeprefix("sqlite:///")).parent / "state" / "archive"
        hours = sorted(p.name.removeprefix("hour=") for p in archive.iterdir() if p.name.startswith("hour="))
        on_disk = sum(p.stat().st_size for p in archive.rglob("*") if p.is_file())
        shown = page.locator('tr[data-archive="trace archive"]')
        assert shown.locator('[data-field="hours"]').inner_text() == str(len(hours)) and hours
        assert shown.locator('[data-field="oldest"]').inner_text() == hours[0]
        assert shown.locator('[data-field="bytes"]').inner_text() == f"{on_disk:,}"
        assert page.locator('[data-testid=disk] [data-field="free"]').inner_text().endswith("% free")
        page.screenshot(path=str(shots / "khipu-health.png"), full_page=True)

        # alerts, with how each notifier fared
        page.goto(f"{server.base}/khipu/alerts")
        (alert,) = store.alerts.read()
        assert page.locator('[data-field="title"]').all_inner_texts() == [alert.title]
        assert "webhook: HTTP 500 from the receiver" in page.inner_text("table[data-testid=alerts]")
        page.screenshot(path=str(shots / "alerts.png"), full_page=True)
        store.close()
    finally:
        page.close()


def _log_in(page: Page, server: Server, target: str) -> None:
    page.goto(target)
    page.wait_for_url("**/auth/login**")
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(server.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(target, timeout=30_000)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _status(url: str, token: str | None = None) -> int:
    try:
        with urllib.request.urlopen(_with_token(url, token), timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def _with_token(url: str, token: str | None) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})


def _token(server: Server) -> str:
    body = json.dumps({"username": USER, "password": server.password}).encode()
    request = urllib.request.Request(
        f"{server.base}/auth/token", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(json.loads(answer.read())["access_token"])


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None
