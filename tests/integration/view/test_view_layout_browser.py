"""The view's pages as Debian's Chromium lays them out in a frame as wide as Airflow gives its plugin pages (about
1,000 px beside Airflow's navigation), and their charts as a person reads them.

Issue 38: the streams table was 1,594 px wide, so inside Airflow its last column was cut off; the sparklines
were a dot or two with no axis. The pages are the view's own HTML (its FastAPI app over a real SQLite store holding
``tests/viewdata.py``'s and ``tests/routemapdata.py``'s seeds), laid out by Chromium with ``set_content``: what is
measured is the browser's layout. Screenshots go where the other browser tests' do (``make screenshots``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, Page

from khipu.registry.loader import load_registry
from khipu.store import Store
from khipu_airflow.view.app import ViewSources, create_app
from tests import routemapdata as data
from tests.unit.plugins.test_view_app import TOKEN, token_check
from tests.viewdata import seed

pytestmark = pytest.mark.integration

FRAME_PX = 1_000  # Airflow 3's plugin page beside its navigation, in a window of about 1,080 px
COUNTS = ("delivered", "lost", "confirmed_lost", "duplicate", "trace_lost", "pending", "aborted", "superseded")
FIGURES = (*COUNTS, "loss_rate", "duplicate_rate", "p50", "p95", "p99")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    work = tmp_path_factory.mktemp("layout")
    store = Store(f"sqlite:///{work / 'khipu.db'}")
    store.migrate()
    registry = load_registry(data.write_registry(work / "registry.yaml"))  # the demo streams and payments' 15 hops
    now = time.time_ns() // 1_000_000
    seed(store, work / "archive", registry, now)
    data.seed_payments(store, now)
    sources = ViewSources(lambda: store, lambda: registry, work / "archive", "local", lambda: now)
    app = create_app(sources, token_check, lambda next_url: f"/auth/login?next={next_url}")
    yield TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    store.close()


@pytest.fixture
def frame(browser: Browser) -> Iterator[Page]:
    page = browser.new_page(viewport={"width": FRAME_PX, "height": 900})
    try:
        yield page
    finally:
        page.close()


def shown(page: Page, client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert answer.status_code == 200, path
    page.set_content(answer.text)


@pytest.mark.parametrize("window", ["1h", "1w"])
def test_the_streams_page_fits_a_1000_px_frame_with_every_figure_in_view(
    client: TestClient, frame: Page, shots: Path, window: str
) -> None:
    shown(frame, client, f"/?window={window}")
    assert frame.evaluate("document.documentElement.scrollWidth") <= FRAME_PX  # nothing to scroll sideways to
    tables = frame.locator("table[data-stream]")
    assert tables.count() == 3
    for right in tables.evaluate_all("ts => ts.map(t => t.getBoundingClientRect().right)"):
        assert right <= FRAME_PX
    rows = frame.locator("table[data-stream] tr[data-hop]")
    assert rows.count() == 5 + 5 + 15
    for name in FIGURES:  # every figure of every hop is there, visible, inside the frame, not spilling out
        boxes = frame.locator(f'table[data-stream] tr[data-hop] [data-field="{name}"]').evaluate_all(
            """cs => cs.map(c => { const b = c.getBoundingClientRect();
                return {right: b.right, width: b.width, spills: c.scrollWidth > c.clientWidth + 1}; })"""
        )
        assert len(boxes) == rows.count(), name
        assert all(0 < b["width"] and b["right"] <= FRAME_PX and not b["spills"] for b in boxes), (name, boxes[:3])
    charts = frame.locator("table[data-stream] svg.spark")
    assert charts.count() == 2 * rows.count()
    for right in charts.evaluate_all("cs => cs.map(c => c.getBoundingClientRect().right)"):
        assert right <= FRAME_PX
    if window == "1h":  # the page as a user inside Airflow sees it first
        frame.screenshot(path=str(shots / "streams-1000px.png"), full_page=True)


def test_each_chart_has_its_scale_and_its_window_and_says_when_it_has_nothing(client: TestClient, frame: Page) -> None:
    """A chart of the demo stream's audit hop (40 minutes of deliveries and one loss in the last hour) reads as a
    chart: its scale's top and bottom and its window's ends are written on it, inside it; a hop without verdicts
    says so."""
    shown(frame, client, "/")
    charts = frame.locator('table[data-stream="demo.orders"] svg.spark').evaluate_all(
        """cs => cs.map(c => { const box = c.getBBox ? c.getBoundingClientRect() : null;
            const labels = [...c.querySelectorAll('text')].map(t => { const b = t.getBoundingClientRect();
                return {role: t.dataset.role, text: t.textContent, inside: b.left >= box.left - 0.5
                    && b.right <= box.right + 0.5 && b.top >= box.top - 0.5 && b.bottom <= box.bottom + 0.5}; });
            return {label: c.querySelector('title').textContent, points: c.dataset.points, labels}; })"""
    )
    assert len(charts) == 10
    for chart in charts:
        roles = {label["role"] for label in chart["labels"]}
        assert {"top", "bottom", "start", "end"} <= roles, chart
        assert all(label["inside"] for label in chart["labels"]), chart
    idle = frame.locator('table[data-stream="demo.bursts"] svg.spark text[data-role="empty"]').all_text_contents()
    assert idle and all(text.startswith("no verdicts in the last hour") for text in idle)


@pytest.mark.parametrize(
    "path",
    [
        "/lost",
        "/lost?verdict=DELIVERED&verdict=LOST&verdict=CONFIRMED_LOST&verdict=DUPLICATE",
        "/messages/view-skip-1",
        "/messages/view-drop-1",
        "/consumers",
        "/self",
        "/alerts",
        "/search?q=view-skip-1",
        "/at-risk",
    ],
)
def test_every_other_page_fits_the_1000_px_frame_too(client: TestClient, frame: Page, path: str) -> None:
    """Nothing to scroll sideways to inside Airflow's frame: long hop names and ids wrap inside their cells."""
    shown(frame, client, path)
    width = frame.evaluate("document.documentElement.scrollWidth")
    too_wide = frame.evaluate(  # what sticks out, and its columns' widths: says what to wrap
        """() => [...document.querySelectorAll('table, pre, svg, form')].filter(e =>
            e.getBoundingClientRect().right > 1000).map(e => e.tagName + ' ' + (e.getAttribute('data-testid') || '')
            + ': ' + (e.rows ? [...e.rows[0].cells].map(c => c.textContent.trim().slice(0, 8) + ' '
            + Math.round(c.offsetWidth)).join(', ') : Math.round(e.getBoundingClientRect().right)))"""
    )
    assert width <= FRAME_PX, (path, width, too_wide)
    if folder := os.environ.get("KHIPU_LAYOUT_SHOTS"):  # to look at them: each page's screenshot at 1,000 px
        frame.screenshot(path=str(Path(folder) / f"{path.strip('/').split('?')[0] or 'home'}.png"), full_page=True)
