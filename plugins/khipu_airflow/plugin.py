"""The Khipu plugin: the Khipu view and its JSON API in Airflow's api-server, and its place in the UI's navigation.

The app is mounted at ``/khipu``; the navigation entry ("Khipu", top level) shows ``/khipu/`` inside
the Airflow UI. Every route of the app needs a valid Airflow login (see :mod:`khipu_airflow.view.app`), and shows
only the streams of the caller's teams, as Airflow's auth manager says (:mod:`khipu_airflow.access`,
``KHIPU_VIEW_ACCESS``); a confirmed loss is resent from its page through ``khipu_resend_manual``.
The view reads the store at ``KHIPU_STORE_URL``, the registry at ``KHIPU_REGISTRY``, the trace archive
under ``KHIPU_STATE_DIR/archive`` and the verdict archive (plain DELIVERED verdicts) under
``KHIPU_STATE_DIR/verdicts`` — the settings the detector and the CLI use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials

from khipu.access import Viewer
from khipu.config import SettingsError, ViewSection, load
from khipu.registry.loader import load_registry
from khipu.registry.model import Registry
from khipu.settings import KhipuSettings
from khipu.store import Store
from khipu_airflow.access import AirflowResendRuns, airflow_viewer
from khipu_airflow.view.app import ViewSources, create_app

URL_PREFIX = "/khipu"


async def airflow_user(request: Request) -> Any:
    """The caller's Airflow user, resolved as Airflow's own API does: 401/403 without a valid JWT."""
    from airflow.api_fastapi.core_api.security import get_user

    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    bearer = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if token else None
    return await get_user(request, None, bearer)


def airflow_login_url(next_url: str) -> str:
    from airflow.api_fastapi.app import get_auth_manager

    return str(get_auth_manager().get_url_login(next_url=next_url))


def registry_reader(path: Path) -> Callable[[], Registry]:
    """The registry at ``path``, parsed again only when the file changed (every page asks for it)."""
    cached: dict[int, Registry] = {}

    def read() -> Registry:
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            return load_registry(path)  # says what is wrong with the path
        if stamp not in cached:
            cached.clear()
            cached[stamp] = load_registry(path)
        return cached[stamp]

    return read


def airflow_access() -> Callable[[Any, Registry], Viewer]:
    """What Airflow's auth manager says of a user, asked as ``KHIPU_VIEW_ACCESS`` says, about the registry's teams."""
    mode = load(ViewSection, None, SettingsError).access

    def viewer_of(user: Any, registry: Registry) -> Viewer:
        return airflow_viewer(user, registry.owners, mode)

    return viewer_of


def view_sources() -> ViewSources:
    settings = KhipuSettings.from_env()
    shared = functools.cache(lambda: Store(settings.store_url))  # opened at the first request, kept after
    return ViewSources(
        store=shared,
        load_registry=registry_reader(settings.registry_path),
        archive_dir=settings.archive_dir,
        cluster=settings.cluster,
        verdict_archive_dir=settings.verdict_archive_dir,
    )


class KhipuPlugin(AirflowPlugin):  # type: ignore[misc]
    name = "khipu"
    fastapi_apps = [  # noqa: RUF012 - Airflow reads these class attributes
        {
            "app": create_app(
                view_sources(), airflow_user, airflow_login_url, airflow_access(), resend_runs=AirflowResendRuns()
            ),
            "url_prefix": URL_PREFIX,
            "name": "Khipu",
        }
    ]
    external_views = [  # noqa: RUF012
        {
            "name": "Khipu",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "khipu",
            "nav_top_level": True,
        }
    ]
