"""The guards of a local server, and the JSON it answers with.

A page on any site can make the browser send requests to 127.0.0.1, and a DNS-rebinding page can
do it under a name of its own; so, before any route runs (Jupyter Server's checks, Starlette's
TrustedHost):
- the Host header must be exactly a name this server listens under (127.0.0.1, localhost, [::1],
  or the names given) and the port it listens on: `evil.example@127.0.0.1` and another port are
  foreign;
- an Origin header, when a browser sends one, must be the page's own origin: scheme, host and port;
- every call but the page's static files needs the access token, compared in constant time:
  `Authorization: Bearer TOKEN`, or `?token=` where a browser cannot set a header;
- a request line and its headers must hold at most MAX_HEAD bytes;
- a POST must be JSON, at most MAX_BODY bytes, nested at most MAX_DEPTH deep, every string valid
  Unicode and every number finite (json_settings), so that no parser recurses, and no tokenizer
  meets a lone surrogate, on a client's say.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import secrets

from starlette.requests import Request
from starlette.responses import Response

from ..text import check_text
from .values import finite

MAX_BODY = 64 * 1024  # bytes a request body may have
MAX_HEAD = 256 * 1024  # bytes a request's line and headers may have: an export's URL carries its text
# and target (8,000 characters each, up to 12 bytes a character percent-encoded)
MAX_DEPTH = 16  # how deep a body's arrays and objects may nest (every call's settings are one flat object)
MAX_DIGITS = 40  # characters a number in a body may have (a float's 17 significant digits and an exponent fit)
LOCAL_NAMES = ("127.0.0.1", "localhost", "::1")
HOST = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?")
# What nests in JSON text: a bracket outside a string. A backslash escape is one token, so that an
# escaped quote never ends a string; every token is one or two characters, so finding them is linear.
JSON_TOKENS = re.compile(r'\\.|["\[\]{}]', re.S)
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def reply(data, status: int = 200) -> Response:
    """A JSON response, UTF-8 (non-finite numbers as null); a string that UTF-8 cannot hold (a lone
    surrogate echoed in a message) is written as JSON's \\u escape instead."""
    data = finite(data)
    try:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        body = json.dumps(data, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return Response(body, status_code=status, media_type="application/json", headers=HEADERS)


def refuse(message: str, status: int) -> Response:
    return reply({"error": message[:500]}, status)


class Access:
    """The access token and the host names a server answers to, and the checks of a request's."""

    def __init__(self, token: str | None, hosts: list[str] | None):
        self.token = token or secrets.token_urlsafe(24)
        self.local = {name.lower() for name in LOCAL_NAMES}
        # names given (a proxy's, this machine's): "name" or "name:port", as the Host header writes them
        self.given = {host.lower() for host in hosts or () if host}

    def host_allowed(self, host: str | None, port: int | None) -> bool:
        """Whether a Host header is exactly a listened name and `port`, the port the request came
        in on (None: not known, a Unix socket). A local name needs the port (a browser always
        sends one that is not 80); a given name may come without one (a proxy's front port)."""
        match = HOST.fullmatch(host or "")
        if match is None:
            return False
        name, given_port = match["name"].lower(), match["port"]
        port_ok = port is None or (int(given_port) == port if given_port else port == 80)
        if name.strip("[]") in self.local or name in self.given:
            return port_ok or (given_port is None and name in self.given)
        return host.lower() in self.given  # a name given with its port ("proxy.example:8443")

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """Whether an Origin header is the page's own origin: http(s)://HOST, HOST the request's
        (already checked) Host header. Any other scheme, name or port, and "null", are foreign."""
        if origin is None:
            return True  # not a browser's cross-site request (curl, scripts, same-origin GETs)
        return host is not None and origin.lower() in (f"http://{host.lower()}", f"https://{host.lower()}")

    def token_ok(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        given = given[7:] if given.lower().startswith("bearer ") else request.query_params.get("token", "")
        return hmac.compare_digest(given.encode(), self.token.encode())


class Guard:
    """ASGI middleware: Host, Origin, token and size checks before any route runs."""

    def __init__(self, app, explorer: Access):
        self.app, self.explorer = app, explorer

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":  # the app has none: refused before any check could be skipped
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        problem = self.check(request)
        if problem is not None:
            return await refuse(*problem)(scope, receive, send)
        return await self.app(scope, receive, send)

    def check(self, request: Request) -> tuple[str, int] | None:
        explorer = self.explorer
        scope = request.scope
        head = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) + sum(
            len(name) + len(value) for name, value in scope["headers"])
        if head > MAX_HEAD:
            return f"the request line and headers hold {head} bytes; at most {MAX_HEAD}", 431
        for name in ("host", "origin"):  # a second one could differ from the one checked
            if len(request.headers.getlist(name)) > 1:
                return f"a request may carry one {name.title()} header, not several", 400
        host = request.headers.get("host")
        server = request.scope.get("server")
        if not explorer.host_allowed(host, server[1] if server else None):
            return "this server answers only to its own address and port (Host header refused)", 403
        if not explorer.origin_allowed(request.headers.get("origin"), host):
            return "cross-origin requests are refused: the Origin must be the page's own (scheme, host and port)", 403
        path = request.url.path
        if path.startswith("/static/") or path == "/favicon.ico":
            return None  # the page's own code and style: public, and holding no data
        if not explorer.token_ok(request):
            return "the access token is missing or wrong: open the URL `anatomy explore` printed", 401
        if request.method == "POST":
            if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
                return "a POST must send JSON (Content-Type: application/json)", 415
            if "transfer-encoding" in request.headers:  # a chunked body's length is known only once read
                return f"the request body must be sent whole, with its Content-Length (at most {MAX_BODY} bytes), " \
                       "not in chunks (Transfer-Encoding)", 411
            length = request.headers.get("content-length")
            if length is None or not length.isdigit() or int(length) > MAX_BODY:
                return f"the request body must say its length and be at most {MAX_BODY} bytes", 413
        return None


QUERY_INTEGER = re.compile(r"-?[0-9]{1,%d}" % MAX_DIGITS)
QUERY_NUMBER = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def query_settings(raw: bytes, strings: tuple[str, ...] = ()) -> dict:
    """A GET's settings from its query string: each value percent-decoded as UTF-8 (InputError, a
    ValueError naming the field, otherwise: the server answers 400), checked as a body's strings are,
    and read as JSON would read it: an integer or a finite number when it is one, written in ASCII
    digits (at most MAX_DIGITS characters), else a string. The fields named in `strings` (a text) stay
    strings."""
    settings: dict = {}
    for pair in raw.split(b"&"):
        if not pair:
            continue
        name_bytes, _, value_bytes = pair.partition(b"=")
        name = _query_text(name_bytes, "a name")
        value = _query_text(value_bytes, f"'{name}'")
        if name in strings:
            settings[name] = value
        elif len(value) <= MAX_DIGITS and QUERY_INTEGER.fullmatch(value):
            settings[name] = int(value)
        elif len(value) <= MAX_DIGITS and QUERY_NUMBER.fullmatch(value) and math.isfinite(float(value)):
            settings[name] = float(value)
        else:
            settings[name] = value
    return settings


def _query_text(raw: bytes, where: str) -> str:
    from urllib.parse import unquote_to_bytes

    decoded = unquote_to_bytes(raw.replace(b"+", b" "))
    try:
        text = decoded.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{where} in the query is not UTF-8 (byte {error.start} is {decoded[error.start]:#04x})") from None
    check_text(text, where, empty=True)
    return text


def json_settings(body: bytes) -> dict:
    """A request's settings: its body, a JSON object (RFC 8259: UTF-8, no NaN or Infinity), nested
    at most MAX_DEPTH deep, its numbers finite and written in at most MAX_DIGITS characters, its strings valid
    Unicode (anatomy.text.check_text: "\\ud800" is valid JSON but no text). Raises ValueError naming the
    problem (the server answers 400), before the parser recurses or any computation starts."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"the body is not UTF-8 (byte {error.start} is {body[error.start]:#04x}): send JSON in "
                         "UTF-8") from None
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise ValueError(f"the body nests {depth} arrays or objects deep; at most {MAX_DEPTH} are read")
    try:
        data = json.loads(text, parse_constant=_not_a_number, parse_int=_integer, parse_float=_float)
    except json.JSONDecodeError as error:
        raise ValueError(f"the body is not valid JSON: {error.msg} at character {error.pos}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the body must be a JSON object ({{\"model\": ..., \"text\": ...}}), got "
                         f"{type(data).__name__ if data is not None else 'null'}")
    _check_strings(data, "body")
    return data


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count),
    found in one pass that stops once past MAX_DEPTH."""
    depth = deepest = 0
    in_string = False
    for token in JSON_TOKENS.finditer(text):
        mark = token.group()
        if mark == '"':
            in_string = not in_string
        elif not in_string and len(mark) == 1:
            depth += 1 if mark in "[{" else -1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
    return deepest


def _not_a_number(name: str):
    raise ValueError(f"the body holds {name}, which JSON does not allow: numbers must be finite")


def _integer(digits: str) -> int:
    return int(_number(digits))


def _float(digits: str) -> float:
    value = float(_number(digits))
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the body holds {digits}, which is too large a number: numbers must be finite")
    return value


def _number(digits: str) -> str:
    if len(digits) > MAX_DIGITS:
        raise ValueError(f"the body holds a number written with {len(digits)} characters; at most {MAX_DIGITS}")
    return digits


def _check_strings(value, where: str) -> None:
    """The library's check of a text (anatomy.text.check_text: InputError, a ValueError, naming the
    lone surrogate and its position) on every string of a body, keys included."""
    if isinstance(value, str):
        check_text(value, where, empty=True)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, f"a key of {where}")
            _check_strings(item, f"'{key}'" if where == "body" else f"{where}[{key!r}]")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_strings(item, f"{where}[{index}]")


__all__ = ["HEADERS", "LOCAL_NAMES", "MAX_BODY", "MAX_DEPTH", "MAX_HEAD", "MAX_DIGITS", "Access", "Guard", "json_settings", "query_settings",
           "nesting_depth", "refuse", "reply"]
