"""What the Khipu view asks of every request and says with every answer, whatever the route.

- **Framing.** Every answer forbids framing by another site (``X-Frame-Options: SAMEORIGIN`` and CSP
  ``frame-ancestors 'self'``): the Airflow UI frames the view from its own origin; no other page can frame the
  resend button under a user's click.
- **State-changing requests come from the view's own pages.** A request whose method changes state (anything but
  GET, HEAD and OPTIONS) must carry ``Origin`` or, failing that, ``Referer`` naming the host it was sent to (its
  ``Host``, or the ``X-Forwarded-Host`` a proxy in front set: a page of another site can set neither). Browsers send
  ``Origin`` with every POST a page makes; a request carrying neither, another site's, or ``Origin: null`` (a
  sandboxed frame, a redirect across sites) is refused with 403.
- **The login comes back to a path of this site.** The page a login returns to is a path, never a URL built from
  the request's ``Host`` header, which a client chooses. A state-changing request whose session expired returns to
  the page it was sent from (its same-origin ``Referer``), not to the POST-only address it was sent to.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import Request

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SECURITY_HEADERS = {
    "X-Frame-Options": "SAMEORIGIN",
    "Content-Security-Policy": "frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # the view's own POSTs carry a Referer; other sites learn nothing
}


class CrossSiteRefused(Exception):
    """A state-changing request that did not come from one of the view's own pages."""


def check_same_origin(request: Request) -> None:
    """Refuse (:class:`CrossSiteRefused`) a state-changing request without ``Origin`` or ``Referer`` naming the host
    it was sent to."""
    if request.method in SAFE_METHODS:
        return
    hosts = _hosts(request)
    origin = request.headers.get("origin")
    if origin == "null":
        raise CrossSiteRefused(
            f"a {request.method} to the Khipu view is accepted from its own pages only: this request's Origin is "
            "null (a sandboxed frame or a redirect from another site)"
        )
    if origin is not None:
        sender, named = urlsplit(origin).netloc, "Origin"
    elif request.headers.get("referer"):
        sender, named = urlsplit(request.headers["referer"]).netloc, "Referer"
    else:
        raise CrossSiteRefused(
            f"a {request.method} to the Khipu view must carry an Origin or Referer header naming "
            f"{' or '.join(hosts) or 'its host'} (the view's own pages send them); this request carried neither"
        )
    if sender not in hosts:
        raise CrossSiteRefused(
            f"a {request.method} to the Khipu view is accepted from its own pages only: {named} names "
            f"{sender or 'no host'}, this request was sent to {' or '.join(hosts) or 'no host'}"
        )


def login_return_path(request: Request, home: str) -> str:
    """The path (with its query) a login returns to: this request's own for a page asked for with GET; for a
    state-changing request, the same-origin page it was sent from, else ``home``."""
    if request.method in SAFE_METHODS:
        return _path_of(str(request.url))
    referer = request.headers.get("referer", "")
    if referer and urlsplit(referer).netloc in _hosts(request):
        return _path_of(referer)
    return home


def _hosts(request: Request) -> list[str]:
    """The names this request was sent to: its ``Host``, and the first ``X-Forwarded-Host`` a proxy set."""
    named = [request.headers.get("host", ""), request.headers.get("x-forwarded-host", "").split(",")[0].strip()]
    return [host for host in dict.fromkeys(named) if host]


def _path_of(url: str) -> str:
    parts = urlsplit(url)
    path = "/" + parts.path.lstrip("/")  # never '//host': a path of this site
    return path + (f"?{parts.query}" if parts.query else "")
