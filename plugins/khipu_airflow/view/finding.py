"""The view's ways to find messages: the search (the search box on every page, ``/search``, ``GET /api/v1/search``)
and the messages at risk (``/at-risk``, ``GET /api/v1/at-risk``). Routes only: what they answer is computed by
:mod:`khipu.report.search` and :mod:`khipu.report.at_risk`.

No ``from __future__ import annotations`` here: FastAPI reads the routes' annotations, which name the login
dependencies defined inside :func:`add_routes`.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse

from khipu.report.at_risk import DEFAULT_WITHIN_MS, AtRiskReport, messages_at_risk
from khipu.report.limits import parse_time_ms
from khipu.report.plain import plain
from khipu.report.search import DEFAULT_RESULTS, MAX_RESULTS, MAX_SCAN_BYTES, SearchAnswer, search
from khipu.report.service import ReportQueryError, check_minutes

if TYPE_CHECKING:
    from khipu_airflow.view.app import ViewSources

API = "/api/v1"
Render = Callable[..., HTMLResponse]
TIME = "ISO time or ms since the epoch"


def add_routes(app: FastAPI, sources: "ViewSources", render: Render, api_user: Any, page_user: Any) -> None:
    """Add the search and the at-risk routes, behind the app's own login dependencies."""
    ApiUser = Annotated[Any, Depends(api_user)]
    PageUser = Annotated[Any, Depends(page_user)]

    def find(q: str, since: str | None, until: str | None, limit: int) -> SearchAnswer:
        return search(
            sources.store(),
            sources.load_registry(),
            sources.archive_dir,
            sources.verdict_archive_dir,
            q,
            since_ms=parse_time_ms("since", since) if since else None,
            until_ms=parse_time_ms("until", until) if until else None,
            limit=limit,
        )

    def at_risk(minutes: float) -> AtRiskReport:
        within_ms = check_minutes(minutes)
        return messages_at_risk(
            sources.store(),
            sources.archive_dir,
            sources.cluster,
            sources.now_ms(),
            within_ms,
            registry=sources.load_registry(),  # the caller's streams only
        )

    @app.get(
        f"{API}/search",
        summary="Find messages by id or recovery attribute (name=value), newest first",
        description="Looks in the store and the verdict archive (by id, at any time) and in the trace archive's "
        f"hours within the range, newest first, reading at most {MAX_SCAN_BYTES // 1024**2} MiB of it: "
        "`complete` is false when the range held more, `notes` say which hours were read and `older_until_ms` "
        "searches the rest.",
        responses={200: {"model": SearchAnswer, "description": "the messages found, newest first"}},
    )
    def api_search(
        _user: ApiUser,
        q: Annotated[str, Query(description="a message id, or a recovery attribute as name=value (order_id=226)")],
        since: Annotated[str | None, Query(description=f"{TIME} (default: the archive's start)")] = None,
        until: Annotated[str | None, Query(description=f"{TIME} (default: now)")] = None,
        limit: Annotated[int, Query(description=f"1 to {MAX_RESULTS} messages")] = DEFAULT_RESULTS,
    ) -> Any:
        return plain(find(q, since, until, limit))

    @app.get(
        f"{API}/at-risk",
        summary="Messages whose unconsumed records retention removes before their group reaches them",
        responses={200: {"model": AtRiskReport, "description": "soonest to leave first"}},
    )
    def api_at_risk(
        _user: ApiUser,
        minutes: Annotated[float, Query(description="how far ahead to look")] = DEFAULT_WITHIN_MS / 60_000,
    ) -> Any:
        return plain(at_risk(minutes))

    @app.get("/search", response_class=HTMLResponse, include_in_schema=False)
    def search_page(
        request: Request,
        _user: PageUser,
        q: str = "",
        since: str | None = None,
        until: str | None = None,
    ) -> HTMLResponse:
        answer, problem = None, None
        if q.strip():
            try:
                answer = find(q, since, until, DEFAULT_RESULTS)
            except ReportQueryError as exc:
                problem = str(exc)
        older_url = None
        if answer is not None and answer.older_until_ms is not None:
            older_url = "?" + urlencode(
                {k: v for k, v in (("q", q), ("since", since)) if v} | {"until": answer.older_until_ms}
            )
        page = render(
            request, "search.html", q=q, since=since, until=until, answer=answer, problem=problem, older_url=older_url,
            quote=quote,
        )  # fmt: skip
        page.status_code = 400 if problem else 200
        return page

    @app.get("/at-risk", response_class=HTMLResponse, include_in_schema=False)
    def at_risk_page(request: Request, _user: PageUser, minutes: float = DEFAULT_WITHIN_MS / 60_000) -> HTMLResponse:
        try:
            report, problem = at_risk(minutes), None
        except ReportQueryError as exc:
            report, problem = None, str(exc)
        page = render(request, "at_risk.html", report=report, problem=problem, minutes=minutes, quote=quote)
        page.status_code = 400 if problem else 200
        return page
