"""Every route of the Khipu view, asked about another team's things: the probes the access tests send, in-process
(tests/unit/plugins/test_view_teams.py) and to Airflow's api-server with real users
(tests/integration/view/test_view_teams.py).

The routes come from the app itself (``app.routes``), so a route added to the app later is probed too: its path
parameters are filled with the other team's stream and message ids, and each query parameter it takes that names a
stream, hop, group, cluster or search term is set, one at a time, to the other team's. A probe passes when the
answer names nothing of the other team's beyond what the request itself said (:func:`leaked`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote_plus, urlencode

from fastapi import FastAPI
from fastapi.routing import APIRoute

from khipu_airflow.view.scope import CallerScope


@dataclass(frozen=True)
class Foreign:
    """Another team's things, by the names a request can give them."""

    stream: str
    message_ids: tuple[str, ...]
    hop: str
    group: str
    attribute: str  # a recovery attribute of one of its messages: name=value
    markers: tuple[str, ...]  # strings only its data holds


@dataclass(frozen=True)
class Probe:
    method: str
    path: str  # with the query string
    form: dict[str, str] = field(default_factory=dict)
    names_foreign_in_path: bool = False  # the path itself names the other team's stream or message

    def said(self) -> str:
        """What the request itself said: an answer may repeat it (an error naming the value it refuses)."""
        return unquote_plus(self.path) + " " + " ".join(self.form.values())


PATH_VALUES = {"stream": "stream", "message_id": "message_ids"}
# query parameters that name something of a stream's, and what of the other team's to put there
QUERY_VALUES = {
    "stream": ("stream",),
    "hop": ("hop",),
    "group": ("group",),
    "q": ("message_ids", "attribute"),
    "message_id": ("message_ids",),
}


def routes_of(app: FastAPI) -> list[APIRoute]:
    return [route for route in app.routes if isinstance(route, APIRoute)]


def first_dependency_is_the_caller_scope(route: APIRoute) -> bool:
    """The route's first dependency is the app's :meth:`CallerScope.caller`: its login and what the caller sees,
    before anything of its own."""
    if not route.dependant.dependencies:
        return False
    call = route.dependant.dependencies[0].call
    return isinstance(getattr(call, "__self__", None), CallerScope) and getattr(call, "__name__", "") == "caller"


def probes(app: FastAPI, foreign: Foreign) -> Iterator[Probe]:
    for route in routes_of(app):
        for method in sorted(route.methods or ()):
            for path, named in _paths(route.path, foreign):
                queries: list[dict[str, str]] = [{}]
                for param in route.dependant.query_params:
                    for kind in QUERY_VALUES.get(param.alias, ()):
                        queries += [{param.alias: value} for value in _values(foreign, kind)]
                for query in queries:
                    target = f"{path}?{urlencode(query)}" if query else path
                    form = {"hop": foreign.hop} if method == "POST" else {}
                    yield Probe(method, target, form, named)


def _paths(template: str, foreign: Foreign) -> Iterator[tuple[str, bool]]:
    params = re.findall(r"{(\w+)(?::\w+)?}", template)
    if not params:
        yield template, False
        return
    assert len(params) == 1 and params[0] in PATH_VALUES, f"a path parameter the probes cannot fill: {template}"
    for value in _values(foreign, PATH_VALUES[params[0]]):
        yield re.sub(r"{\w+(?::\w+)?}", value, template), True


def _values(foreign: Foreign, kind: str) -> tuple[str, ...]:
    value = getattr(foreign, kind)
    return tuple(value) if isinstance(value, tuple) else (value,)


def leaked(probe: Probe, body: str, foreign: Foreign) -> list[str]:
    """The other team's markers in an answer that the request did not say itself."""
    said = probe.said()
    return [marker for marker in foreign.markers if marker in body and marker not in said]
