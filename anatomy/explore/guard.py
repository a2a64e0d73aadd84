"""The guards of a local server, and the JSON it answers with.

A page on any site can make the browser send requests to 127.0.0.1, and a DNS-rebinding page can
do it under a name of its own; so, before any route runs (Jupyter Server's checks, Starlette's
TrustedHost):
- the Host header must name this machine (127.0.0.1, localhost, [::1], or the names given);
- an Origin header, when a browser sends one, must be the same site;
- every call but the page's static files needs the access token, compared in constant time:
  `Authorization: Bearer TOKEN`, or `?token=` where a browser cannot set a header;
- a POST must be JSON, at most MAX_BODY bytes.
"""

from __future__ import annotations

import hmac
import json
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from .panels import finite

MAX_BODY = 64 * 1024  # bytes a request body may have
LOCAL_NAMES = ("127.0.0.1", "localhost", "::1")
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def reply(data, status: int = 200) -> Response:
    body = json.dumps(finite(data), ensure_ascii=False, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json", headers=HEADERS)


def refuse(message: str, status: int) -> Response:
    return reply({"error": message[:500]}, status)


class Access:
    """The access token and the host names a server answers to, and the checks of a request's."""

    def __init__(self, token: str | None, hosts: list[str] | None):
        self.token = token or secrets.token_urlsafe(24)
        self.hosts = {h.strip("[]").lower() for h in (*LOCAL_NAMES, *(hosts or ()))}

    def host_allowed(self, host: str | None) -> bool:
        if not host:
            return False
        name = urlsplit(f"//{host}").hostname or ""
        return name.lower() in self.hosts

    def origin_allowed(self, origin: str | None) -> bool:
        if origin is None:
            return True  # not a browser's cross-site request (curl, scripts, same-origin GETs)
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and (parts.hostname or "").lower() in self.hosts

    def token_ok(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        given = given[7:] if given.lower().startswith("bearer ") else request.query_params.get("token", "")
        return hmac.compare_digest(given.encode(), self.token.encode())


class Guard:
    """ASGI middleware: Host, Origin, token and size checks before any route runs."""

    def __init__(self, app, explorer: Access):
        self.app, self.explorer = app, explorer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        problem = self.check(request)
        if problem is not None:
            return await refuse(*problem)(scope, receive, send)
        return await self.app(scope, receive, send)

    def check(self, request: Request) -> tuple[str, int] | None:
        explorer = self.explorer
        if not explorer.host_allowed(request.headers.get("host")):
            return "this server answers only to its own address (Host header refused)", 403
        if not explorer.origin_allowed(request.headers.get("origin")):
            return "cross-origin requests are refused", 403
        path = request.url.path
        if path.startswith("/static/") or path == "/favicon.ico":
            return None  # the page's own code and style: public, and holding no data
        if not explorer.token_ok(request):
            return "the access token is missing or wrong: open the URL `anatomy explore` printed", 401
        if request.method == "POST":
            if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                return "a POST must send JSON (Content-Type: application/json)", 415
            length = request.headers.get("content-length")
            if length is None or not length.isdigit() or int(length) > MAX_BODY:
                return f"the request body must say its length and be at most {MAX_BODY} bytes", 413
        return None


__all__ = ["HEADERS", "LOCAL_NAMES", "MAX_BODY", "Access", "Guard", "refuse", "reply"]
