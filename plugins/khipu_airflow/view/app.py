"""The Khipu view and its JSON API: one FastAPI app, mounted by Airflow's api-server at ``/khipu``.

HTML pages (``/khipu/``, ``/khipu/lost``, ``/khipu/messages/{id}``, ``/khipu/consumers``,
``/khipu/self``, ``/khipu/alerts``) and JSON endpoints under ``/khipu/api/v1`` (OpenAPI at
``/khipu/api/v1/openapi.json``) answer from the same reports (:mod:`khipu.report.service`).

Everything is behind Airflow's login: plugin apps are not protected by Airflow, so every route
depends on ``authenticate``, which in the api-server resolves the caller's Airflow JWT (the
``Authorization: Bearer`` header or the UI's session cookie) exactly as Airflow's own API does. A
page asked for without a valid session redirects to Airflow's login and comes back; an API call
gets 401.

Each person sees their teams' streams: every route goes first through the app's own dependency
(:class:`khipu_airflow.view.scope.CallerScope`), and reads the registry as that person sees it
(``viewer_of`` says what they see; the plugin asks Airflow's auth manager).
"""

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from sqlalchemy.exc import SQLAlchemyError

from khipu.access import AccessUnanswered
from khipu.clock import iso_text, now_ms, utc_text
from khipu.registry.model import Registry, UnknownStreamError
from khipu.report import service
from khipu.report.limits import check_text, parse_time_ms
from khipu.report.message import MessageReport
from khipu.report.overview import DAY_MS, DEFAULT_WINDOW, WINDOWS, StreamOverview
from khipu.report.plain import plain
from khipu.report.service import ReportQueryError, UnknownMessage, VerdictQuery
from khipu.storage.location import Location
from khipu.store import Store, StoreError
from khipu_airflow.view import finding, resending
from khipu_airflow.view.charts import sparkline
from khipu_airflow.view.formats import as_typed, breakable, duration, pct
from khipu_airflow.view.guard import SECURITY_HEADERS, CrossSiteRefused, login_return_path
from khipu_airflow.view.routemap import route_map_svg
from khipu_airflow.view.scope import CallerScope, NotLoggedIn, ViewerOf, every_stream_to_everyone

Authenticate = Callable[[Request], Awaitable[Any]]
TEMPLATES = Path(__file__).parent / "templates"
API = "/api/v1"


@dataclass(frozen=True)
class ViewSources:
    """Where the view reads from: the store, the registry, the trace archive, the cluster judged, the clock, and
    the verdict archive (the plain DELIVERED verdicts the store does not hold)."""

    store: Callable[[], Store]  # the store every request reads (one, shared: its engine pools connections)
    load_registry: Callable[[], Registry]
    archive_dir: Location | Path | None  # a local folder or an object-store prefix, as the verdict archive's
    cluster: str
    now_ms: Callable[[], int] = now_ms
    verdict_archive_dir: Location | Path | None = None


def create_app(
    sources: ViewSources,
    authenticate: Authenticate,
    login_url: Callable[[str], str],
    viewer_of: ViewerOf = every_stream_to_everyone,
    resend_runs: resending.ResendRuns | None = None,
) -> FastAPI:
    scope = CallerScope(sources, authenticate, viewer_of, is_api=lambda request: f"{API}/" in request.url.path)
    sources = scope.sources  # from here on, the registry is the one the caller sees: every route reads this
    app = FastAPI(
        dependencies=[Depends(scope.caller)],  # every route's first: the caller's login, and what they see
        title="Khipu API",
        version="1",
        description="Per-message verdicts, metrics and health of the streams Khipu traces. Every endpoint needs "
        "an Airflow JWT (Authorization: Bearer, or the Airflow UI's session cookie).",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    pages = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    pages.filters["when"] = lambda ms: utc_text(ms, missing="\N{EN DASH}")
    pages.filters["pct"] = pct
    pages.filters["ms"] = duration
    pages.filters["breakable"] = breakable  # names wrap at their parts in a narrow column
    pages.filters["iso_text"], pages.filters["as_typed"] = iso_text, as_typed  # times as the filter boxes take them
    pages.globals["spark"] = lambda values, **kw: Markup(sparkline(values, **kw))
    pages.globals["route_map"] = lambda route, base: Markup(route_map_svg(route, base))

    async def api_user(request: Request) -> Any:
        user = await authenticate(request)
        _check_texts(request)
        return user

    async def page_user(request: Request) -> Any:
        try:
            user = await authenticate(request)
        except HTTPException as exc:
            if exc.status_code in (401, 403):
                raise NotLoggedIn() from None
            raise
        _check_texts(request)
        return user

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        answer = await call_next(request)
        answer.headers.update(SECURITY_HEADERS)  # khipu_airflow.view.guard: no framing by another site
        return answer

    @app.exception_handler(NotLoggedIn)
    async def to_login(request: Request, _exc: NotLoggedIn) -> Response:
        home = str(request.scope.get("root_path", "")).rstrip("/") + "/"
        return RedirectResponse(login_url(login_return_path(request, home)), status_code=303)

    def problem(request: Request, status: int, detail: str) -> Response:
        """An API call gets ``{"detail": ...}``; a page gets the page frame with the problem in it."""
        if f"{API}/" in request.url.path:
            return JSONResponse({"detail": detail}, status_code=status)
        page = render(request, "problem.html", problem=detail, status=status)
        page.status_code = status
        return page

    def answer_with(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
        async def handler(request: Request, exc: Exception) -> Response:
            return problem(request, status, str(exc))

        return handler

    for error, status in ((ReportQueryError, 400), (UnknownStreamError, 404), (UnknownMessage, 404), (StoreError, 503)):
        app.add_exception_handler(error, answer_with(status))
    app.add_exception_handler(resending.NotThisLoss, answer_with(404))  # a run id not of this message's resend
    app.add_exception_handler(AccessUnanswered, answer_with(503))  # KHIPU_VIEW_ACCESS does not fit the auth manager
    app.add_exception_handler(CrossSiteRefused, answer_with(403))  # a POST not from the view's own pages

    @app.exception_handler(resending.ResendRefused)
    async def resend_refused(request: Request, exc: resending.ResendRefused) -> Response:
        return problem(request, exc.status, str(exc))

    @app.exception_handler(SQLAlchemyError)
    async def store_unreadable(request: Request, exc: SQLAlchemyError) -> Response:
        origin = getattr(exc, "orig", None) or exc
        first_line = str(origin).strip().splitlines()[0] if str(origin).strip() else type(origin).__name__
        return problem(
            request, 503, f"the Khipu store could not be read ({type(origin).__name__}: {first_line}); is it up?"
        )

    ApiUser = Annotated[Any, Depends(api_user)]
    PageUser = Annotated[Any, Depends(page_user)]

    @contextmanager
    def store() -> Iterator[Store]:
        yield sources.store()  # shared by every request: one engine, one connection pool

    def archives() -> dict[str, Location | Path]:
        """The archives whose storage use the health page shows (those the view was given)."""
        named = {"trace archive": sources.archive_dir, "verdict archive": sources.verdict_archive_dir}
        return {name: path for name, path in named.items() if path is not None}

    def render(request: Request, template: str, **values: Any) -> HTMLResponse:
        base = str(request.scope.get("root_path", "")).rstrip("/")
        viewer = getattr(request.state, "khipu_viewer", None)  # who is asking: shown in the navigation
        html = pages.get_template(template).render(
            base=base, now_ms=sources.now_ms(), page=template, viewer=viewer, **values
        )
        return HTMLResponse(html)

    # -- JSON API ---------------------------------------------------------------------------------------------

    @app.get(f"{API}/openapi.json", include_in_schema=False)
    def openapi(_user: ApiUser) -> dict[str, Any]:
        return app.openapi()

    @app.get(
        f"{API}/streams",
        summary="Every stream and hop: the last hour and day, with the day's series",
        description="Each window also carries its computed `verdicts`, `loss_rate` and `duplicate_rate`.",
        responses=_documented(list[StreamOverview], "streams, the busiest first"),
    )
    def api_streams(_user: ApiUser) -> Any:
        with store() as s:
            return plain(service.overview(s, sources.load_registry(), sources.now_ms()))

    @app.get(f"{API}/streams/{{stream}}/metrics", summary="A stream's per-minute metrics per hop")
    def api_metrics(
        stream: str, _user: ApiUser, minutes: Annotated[float, Query(description="how far back")] = 60
    ) -> list[dict[str, Any]]:
        since = sources.now_ms() - service.check_minutes(minutes)
        with store() as s:
            return service.metric_rows(s, sources.load_registry(), stream, since)

    @app.get(
        f"{API}/verdicts",
        summary="Verdicts, newest first, filtered and paged (default: losses)",
        description="Each row holds the verdict's columns, its recovery `attributes` and its `history`.",
        responses=_documented(service.VerdictPage, "one page; next_cursor asks for the next"),
    )
    def api_verdicts(
        _user: ApiUser,
        verdict: Annotated[list[str] | None, Query(description="verdict kinds (default LOST, CONFIRMED_LOST)")] = None,
        stream: str | None = None,
        hop: str | None = None,
        cause: str | None = None,
        since: Annotated[str | None, Query(description="ISO time or ms since the epoch")] = None,
        until: Annotated[str | None, Query(description="ISO time or ms since the epoch")] = None,
        limit: int = service.DEFAULT_PAGE,
        cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    ) -> Any:
        query = _verdict_query(verdict, stream, hop, cause, since, until, limit, cursor)
        with store() as s:
            return plain(service.verdict_page(s, sources.load_registry(), sources.archive_dir, query))

    @app.get(
        f"{API}/messages/{{message_id:path}}",  # any id, '/' included (links quote it whole)
        summary="One message along its route: traces, verdicts, history",
        responses=_documented(MessageReport, "every hop of the route in order, then any other hop seen"),
    )
    def api_message(message_id: str, _user: ApiUser) -> Any:
        with store() as s:
            registry = sources.load_registry()
            report = service.message_report(
                s, registry, sources.archive_dir, message_id, sources.now_ms(), sources.verdict_archive_dir
            )
        return plain(report)

    @app.get(
        f"{API}/health/consumers",
        summary="Consumer health per group and partition, windows, history",
        responses=_documented(service.ConsumerReport, "the cluster's partitions as last judged"),
    )
    def api_consumers(_user: ApiUser, group: str | None = None) -> Any:
        with store() as s:
            return plain(service.consumer_report(s, sources.cluster, sources.now_ms(), group, sources.load_registry()))

    @app.get(
        f"{API}/health/khipu",
        summary="Khipu's own health: detector heartbeat and rates, trace channel",
        responses=_documented(service.KhipuHealth, "the detector's queries and the trace channel"),
    )
    def api_khipu(_user: ApiUser) -> Any:
        with store() as s:
            return plain(
                service.khipu_health(s, sources.now_ms(), registry=sources.load_registry(), archives=archives())
            )

    @app.get(f"{API}/alerts", summary="Alerts fired and resolved, newest first, with each notifier's outcome")
    def api_alerts(_user: ApiUser, minutes: float = 24 * 60) -> list[dict[str, Any]]:
        since = sources.now_ms() - service.check_minutes(minutes)
        with store() as s:
            return service.alerts_report(s, since, sources.load_registry())

    # -- pages ------------------------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def overview_page(request: Request, _user: PageUser, window: str = DEFAULT_WINDOW.key) -> HTMLResponse:
        chosen = service.check_window(window)  # the map's and the tables' window
        with store() as s:
            streams = service.streams_view(s, sources.load_registry(), sources.now_ms(), chosen)
        return render(request, "overview.html", streams=streams, window=chosen, windows=WINDOWS)

    @app.get("/lost", response_class=HTMLResponse, include_in_schema=False)
    def lost_page(
        request: Request,
        _user: PageUser,
        verdict: Annotated[list[str] | None, Query()] = None,
        stream: str | None = None,
        hop: str | None = None,
        cause: str | None = None,
        since: str | None = None,
        until: str | None = None,
        cursor: str | None = None,
    ) -> HTMLResponse:
        registry = sources.load_registry()
        filters = {"stream": stream, "hop": hop, "cause": cause, "since": since, "until": until}
        shown = {k: v for k, v in filters.items() if v}
        try:
            query = _verdict_query(verdict, stream, hop, cause, since, until, service.DEFAULT_PAGE, cursor)
            with store() as s:
                result: service.VerdictPage | None = service.verdict_page(s, registry, sources.archive_dir, query)
            problem = None
        except (ReportQueryError, UnknownStreamError) as exc:
            result, problem = None, str(exc)
        kinds = verdict or list(service.LOSS_VERDICTS)
        next_url = None
        if result is not None and result.next_cursor:
            pairs = [*(("verdict", k) for k in kinds), *shown.items(), ("cursor", result.next_cursor)]
            next_url = "?" + urlencode(pairs)
        page = render(
            request,
            "lost.html",
            result=result,
            problem=problem,
            filters=shown,
            kinds=kinds,
            streams=sorted(registry.streams),
            hops={name: [h.id for h in registry.streams[name].route.hops] for name in sorted(registry.streams)},
            causes=service.CAUSES,
            verdict_kinds=sorted(service.VERDICT_KINDS, key=lambda k: (k not in service.LOSS_VERDICTS, k)),
            next_url=next_url,
            quote=quote,
        )
        page.status_code = 400 if problem else 200
        return page

    def message_report(message_id: str) -> MessageReport:
        with store() as s:
            return service.message_report(
                s,
                sources.load_registry(),
                sources.archive_dir,
                message_id,
                sources.now_ms(),
                sources.verdict_archive_dir,
            )

    @app.get("/messages/{message_id:path}", response_class=HTMLResponse, include_in_schema=False)
    def message_page(
        request: Request,
        message_id: str,
        _user: PageUser,
        resend_run: Annotated[str | None, Query(description="a resend run this page follows")] = None,
    ) -> HTMLResponse:
        report = message_report(message_id)
        resend = resending.panel(
            resend_runs, scope.viewer(), sources.load_registry(), report, request, resend_run or None
        )
        return render(request, "message.html", report=report, message_id=message_id, resend=resend)

    @app.get("/consumers", response_class=HTMLResponse, include_in_schema=False)
    def consumers_page(
        request: Request, _user: PageUser, group: str | None = None, cluster: str | None = None
    ) -> HTMLResponse:
        if cluster:  # a group on another cluster than Khipu's own (a route map's node links here)
            service.check_cluster(sources.load_registry(), cluster)
        with store() as s:
            report = service.consumer_report(
                s, cluster or sources.cluster, sources.now_ms(), group or None, sources.load_registry()
            )
        return render(request, "consumers.html", report=report, group=group)

    @app.get("/self", response_class=HTMLResponse, include_in_schema=False)
    def self_page(request: Request, _user: PageUser) -> HTMLResponse:
        with store() as s:
            health = service.khipu_health(s, sources.now_ms(), registry=sources.load_registry(), archives=archives())
        return render(request, "self.html", health=health)

    @app.get("/alerts", response_class=HTMLResponse, include_in_schema=False)
    def alerts_page(request: Request, _user: PageUser) -> HTMLResponse:
        with store() as s:
            alerts = service.alerts_report(s, sources.now_ms() - DAY_MS, sources.load_registry())
        return render(request, "alerts.html", alerts=alerts)

    finding.add_routes(app, sources, render, api_user, page_user)  # the search and the messages at risk
    resending.add_routes(app, resend_runs, scope.viewer, sources.load_registry, message_report, page_user)
    return app


def _check_texts(request: Request) -> None:
    """Every text of the request's path and query within its bounds (khipu.report.limits), before any route reads it."""
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        check_text(name, str(value))


def _documented(model: Any, description: str) -> dict[int | str, dict[str, Any]]:
    """An answer's schema for the OpenAPI description, without filtering what is returned by it."""
    return {200: {"model": model, "description": description}}


def _verdict_query(
    verdict: list[str] | None,
    stream: str | None,
    hop: str | None,
    cause: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    cursor: str | None,
) -> VerdictQuery:
    def when(name: str, text: str | None) -> int | None:
        if not text:
            return None
        return parse_time_ms(name, text)  # within its bounds: 400 naming them

    for text in (service.decode_cursor(cursor or None) or ())[1:]:  # a forged cursor's id and hop, as any text
        check_text("cursor", str(text))
    return VerdictQuery(
        verdicts=tuple(verdict) if verdict else service.LOSS_VERDICTS,
        stream=stream or None,
        hop=hop or None,
        cause=cause or None,
        since_ms=when("since", since),
        until_ms=when("until", until),
        limit=limit,
        cursor=cursor or None,
    )
