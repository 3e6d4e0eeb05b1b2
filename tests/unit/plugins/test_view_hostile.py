"""Generated query values thrown at every route of the view and its API: no answer is a server error.

Hypothesis draws, for each of the route's query parameters (read from the app itself, so a route added later is
covered too) and its path parameters, values a hostile or careless caller sends: numbers far past 64 bits, NaN
and infinities, ISO times at the ends of the calendar with any offset, NUL and other control characters,
malformed and forged page cursors, long text, names the registry knows and names it does not. Every answer must
be below 500; a refusal (4xx) says what was wrong. The store is SQLite here;
tests/integration/view/test_view_hostile_postgres.py runs the same property over PostgreSQL.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from fastapi.dependencies.utils import get_flat_dependant
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from khipu.registry.loader import load_registry
from khipu.store import Store
from khipu_airflow.view.app import ViewSources, create_app
from tests.unit.plugins.test_view_app import NOW_MS, TOKEN, token_check
from tests.viewdata import AUDIT_READ, STREAM, seed

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = load_registry(ROOT / "config" / "registry.yaml")
EXAMPLES = 60  # per route


def routes_of(client: TestClient) -> list[APIRoute]:
    return sorted((r for r in client.app.routes if isinstance(r, APIRoute)), key=lambda r: r.path)


def query_names(route: APIRoute) -> list[str]:
    """The query parameters a route reads (its own and its dependencies')."""
    return sorted({param.alias for param in get_flat_dependant(route.dependant).query_params})


def cursor_of(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.integers(min_value=2**62, max_value=2**66).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        ["nan", "-nan", "inf", "-inf", "1e400", "-1e400", "0", "-0", "1e-400", "0x10", "99999999999999999999"]
    ),
    st.text(alphabet="0123456789", min_size=15, max_size=5000),
)
times = st.one_of(
    st.builds(
        lambda year, hours, minutes: (
            f"{year:04d}-01-01T00:00:00{'+' if hours >= 0 else '-'}{abs(hours):02d}:{minutes:02d}"
        ),
        st.integers(min_value=1, max_value=9999),
        st.integers(min_value=-23, max_value=23),
        st.sampled_from([0, 30, 59]),
    ),
    st.sampled_from(
        ["9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z", "2026-11-23T10:00:00", "2026-13-01T00:00Z"]
    ),
)
cursors = st.one_of(
    st.binary(max_size=64).map(lambda raw: base64.urlsafe_b64encode(raw).decode()),
    st.tuples(st.integers(min_value=-(2**70), max_value=2**70), st.text(), st.text()).map(lambda t: cursor_of(list(t))),
    st.tuples(st.integers(min_value=0, max_value=2**62 - 1), st.text(), st.text()).map(lambda t: cursor_of(list(t))),
    st.lists(st.integers(), max_size=4).map(cursor_of),
)
names = st.sampled_from(
    [STREAM, "demo.bursts", AUDIT_READ, "LOST", "DELIVERED", "skipped_by_consumer", "demo-sink-audit",
     "order_id=order-4711", "view-skip-1", "id:x=y", "order_id=", "=", "' OR 1=1 --", "../../etc/passwd", "%00",
     "x" * 30_000]
)  # fmt: skip
anything = st.one_of(
    numbers, times, cursors, names, st.text(), st.text(alphabet="\x00\x01\x7f\n\t\u2028\ufeff/\\%=&?#")
)


SENDABLE_URL_CHARS = 60_000  # below httpx's 65,536 per URL component, with room for its own quoting


# a value each known parameter accepts: a hostile value in one parameter is not hidden behind another's refusal
VALID = {
    "verdict": st.sampled_from(["LOST", "DELIVERED", "CONFIRMED_LOST"]),
    "stream": st.just(STREAM),
    "hop": st.just(AUDIT_READ),
    "cause": st.just("skipped_by_consumer"),
    "since": st.sampled_from(["2026-11-23T10:00:00Z", "0", "1794990000000"]),
    "until": st.sampled_from(["2030-01-01T00:00:00Z", str(NOW_MS)]),
    "limit": st.sampled_from(["1", "50", "500"]),
    "minutes": st.sampled_from(["1", "60", "1440"]),
    "group": st.just("demo-sink-audit"),
    "q": st.sampled_from(["view-skip-1", "order_id=order-4711"]),
    "window": st.sampled_from(["15m", "1h", "1d", "1w"]),
    "cluster": st.just("local"),
}


@st.composite
def requests(draw: st.DrawFn, route: APIRoute) -> tuple[str, list[tuple[str, str]]]:
    """A request to the route: each path parameter anything; each query parameter left out, given a value it
    accepts, or given anything (once or twice)."""
    path = route.path_format  # {message_id}, whatever its convertor ({message_id:path})
    for name in route.param_convertors:
        path = path.replace(f"{{{name}}}", quote(draw(st.one_of(names, anything)), safe=""))
    pairs: list[tuple[str, str]] = []
    for name in query_names(route):
        how = draw(st.sampled_from(["leave out", "accepted", "anything", "anything twice"]))
        if how == "accepted" and name in VALID:
            pairs.append((name, draw(VALID[name])))
        elif how.startswith("anything"):
            pairs += [(name, draw(anything)) for _ in range(2 if how.endswith("twice") else 1)]
    # a URL the test's HTTP client can send at all: httpx refuses a query over 65,536 characters before sending it
    # (three of the 30,000-character names made one); a server never sees such a request from it
    assume(len(path) + len(urlencode(pairs)) <= SENDABLE_URL_CHARS)
    return path, pairs


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("hostile")
    yield built_client(f"sqlite:///{folder / 'khipu.db'}", folder)


def built_client(url: str, folder: Path) -> TestClient:
    """The view over a seeded store at ``url`` and archives under ``folder``; server errors come back as answers."""
    store = Store(url)
    store.migrate()
    seed(store, folder / "archive", REGISTRY, NOW_MS)
    sources = ViewSources(
        lambda: store, lambda: REGISTRY, folder / "archive", "local", lambda: NOW_MS, folder / "verdicts"
    )
    app = create_app(sources, token_check, lambda next_url: f"/auth/login?next={next_url}")
    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}, raise_server_exceptions=False)


def assert_no_server_error(client: TestClient, path: str, pairs: list[tuple[str, str]]) -> None:
    answer = client.get(path, params=pairs, follow_redirects=False)
    assert answer.status_code < 500, f"GET {path} {pairs!r:.600}: {answer.status_code} {answer.text[:600]}"
    if answer.status_code == 400 and "/api/v1/" in path:
        assert answer.json()["detail"], "a refusal says what was wrong"


def check_every_route(client: TestClient) -> None:
    for route in routes_of(client):

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(request=requests(route))
        def no_server_error(request: tuple[str, list[tuple[str, str]]]) -> None:
            assert_no_server_error(client, *request)

        no_server_error()


def test_no_generated_query_value_makes_any_route_answer_a_server_error(client: TestClient) -> None:
    assert len(routes_of(client)) >= 18  # every page and API route, read from the app
    check_every_route(client)


@pytest.mark.parametrize(
    ("path", "params", "named", "page"),
    [
        ("/api/v1/verdicts", {"since": "99999999999999999999"}, "253402300799999 (9999-12-31T23:59:59.999Z)", "/lost"),
        ("/api/v1/verdicts", {"until": "-1"}, "from 0 (1970-01-01T00:00:00Z)", "/lost"),
        ("/api/v1/verdicts", {"since": "0001-01-01T00:00:00+14:00"}, "from 0 (1970-01-01T00:00:00Z)", "/lost"),
        ("/api/v1/verdicts", {"limit": "99999999999999999999"}, "1 to 500 rows a page", None),
        ("/api/v1/alerts", {"minutes": "nan"}, "at most 527040 (a year)", None),
        ("/api/v1/search", {"q": "view-skip-1", "since": "1e400"}, "ms since the epoch", "/search"),
        ("/api/v1/search", {"q": "view-skip-1", "limit": "501"}, "1 to 500 messages", None),
        ("/api/v1/at-risk", {"minutes": "1e12"}, "at most 527040 (a year)", "/at-risk"),
        ("/api/v1/messages/a%00b", {}, "without control characters (it holds U+0000 at 1)", "/messages/a%00b"),
        ("/api/v1/verdicts", {"stream": "x" * 60_000}, "at most 1024 characters", "/lost"),
    ],
)
def test_a_number_or_text_out_of_bounds_is_a_400_naming_the_bound(
    client: TestClient, path: str, params: dict[str, str], named: str, page: str | None
) -> None:
    answer = client.get(path, params=params)
    assert answer.status_code == 400 and named in answer.json()["detail"], answer.text[:400]
    if page is not None:  # the page asked the same shows the same refusal in the page
        shown = client.get(page, params=params)
        assert shown.status_code == 400 and named in html.unescape(shown.text), (page, shown.status_code)
