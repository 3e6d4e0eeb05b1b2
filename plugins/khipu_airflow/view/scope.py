"""The one place every route of the Khipu view goes through: who is asking, and the registry as they see it.

:meth:`CallerScope.caller` is the app's own dependency (``FastAPI(dependencies=...)``), which FastAPI runs before
each route's own parameters, for every route the app has, whoever adds it. It logs the caller in (Airflow's login:
a page without a session goes to the login page, an API call gets 401), asks what the auth manager says of them
(:class:`khipu.access.Viewer`, from ``viewer_of``), and keeps that for the request.

The app's routes read through :attr:`CallerScope.sources`: the same sources, but whose registry is the one the
caller sees (:func:`khipu.access.seen_registry`), and every report shows nothing beyond that
(:mod:`khipu.report.service`). Outside a request that went through :meth:`caller`, reading the registry fails:
nothing is shown by mistake.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from khipu.access import SeenRegistry, Viewer, seen_registry
from khipu.registry.model import Registry
from khipu_airflow.view.guard import check_same_origin

if TYPE_CHECKING:
    from khipu_airflow.view.app import ViewSources

Authenticate = Callable[[Request], Awaitable[Any]]
ViewerOf = Callable[[Any, Registry], Viewer]  # (the authenticated user, the whole registry) -> what they see


class NotLoggedIn(Exception):
    """A page was asked for without a valid Airflow session."""


def every_stream_to_everyone(user: Any, _registry: Registry) -> Viewer:
    """For an app run without Airflow's auth manager (the pages' own tests): everyone logged in sees every stream,
    and nobody may resend. The Airflow plugin passes :func:`khipu_airflow.access.airflow_viewer` instead."""
    return Viewer(name=str(user), every_stream=True)


class CallerScope:
    def __init__(
        self,
        sources: ViewSources,
        authenticate: Authenticate,
        viewer_of: ViewerOf,
        is_api: Callable[[Request], bool],
    ) -> None:
        self._whole = sources
        self._authenticate = authenticate
        self._viewer_of = viewer_of
        self._is_api = is_api
        self._viewer: ContextVar[Viewer] = ContextVar(f"khipu_viewer_{id(self)}")  # set per request, by caller
        self.sources: ViewSources = dataclasses.replace(sources, load_registry=self.registry)

    async def caller(self, request: Request) -> Viewer:
        """Every route's first dependency: a state-changing request from the view's own pages only
        (:func:`khipu_airflow.view.guard.check_same_origin`), the caller's login, and what they see."""
        check_same_origin(request)
        try:
            user = await self._authenticate(request)
        except HTTPException as exc:
            if exc.status_code in (401, 403) and not self._is_api(request):
                raise NotLoggedIn() from None
            raise
        viewer = await run_in_threadpool(self._viewer_of, user, self._whole.load_registry())  # may ask a database
        self._viewer.set(viewer)
        request.state.khipu_viewer = viewer
        return viewer

    def viewer(self) -> Viewer:
        """Who is asking (LookupError outside a request that went through :meth:`caller`)."""
        return self._viewer.get()

    def registry(self) -> SeenRegistry:
        """The registry as the caller sees it."""
        return seen_registry(self.viewer(), self._whole.load_registry())
