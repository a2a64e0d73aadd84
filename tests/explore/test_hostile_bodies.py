"""The explorer's server under hostile bodies: whatever a client POSTs (nested 30,000 deep, a lone
surrogate, not UTF-8, NaN, a number of 5,000 digits, any setting of any type), every route answers
a 4xx naming the problem, never a 500, and before any computation."""

from __future__ import annotations

import json

import pytest
from explore_servers import TOKEN, refused

from anatomy.explore.guard import MAX_DEPTH, json_settings, nesting_depth, reply

TEXT = "Hello World, this is"
ROUTES = ["/api/run", "/api/walk", "/api/attention", "/api/lens", "/api/attribution", "/api/intervene",
          "/api/features", "/api/feature", "/api/steer", "/api/heads", "/api/compare", "/api/jobs", "/api/open"]


def send(client, route: str, body: bytes):
    return client.post(route, content=body, headers={"Content-Type": "application/json"})


def test_a_body_nested_30000_deep_is_refused_on_every_route_before_the_parser_recurses(hostile):
    for body in ("[" * 30000 + "]" * 30000, '{"a":' * 10000 + "1" + "}" * 10000, "[" * 60000):
        for route in ROUTES:
            refused(send(hostile, route, body.encode()), "nests", f"at most {MAX_DEPTH}")


def test_a_lone_surrogate_anywhere_in_a_body_is_a_400_naming_the_character_and_its_position(hostile):
    cases = [("/api/run", {"model": "toy", "text": "ab\ud800"}, "'text'", "at character 2"),
             ("/api/run", {"model": "toy-seq2seq", "text": "Hello", "target_text": "\udfff"}, "'target_text'", "U+DFFF"),
             ("/api/compare", {"model": "toy", "text": TEXT, "text_b": "x\ud800y"}, "'text_b'", "at character 1"),
             ("/api/jobs", {"model": "toy", "text": TEXT, "kind": "patch", "corrupt": "\ud800"}, "'corrupt'", "U+D800"),
             ("/api/attribution", {"model": "toy", "text": TEXT, "method": "gxi", "target": "\ud800"}, "'target'", "U+D800"),
             ("/api/run", {"model": "\ud800", "text": TEXT}, "'model'", "U+D800"),
             ("/api/run", {"model": "toy", "text": TEXT, "\ud800": 1}, "a key", "U+D800")]
    for route, body, where, detail in cases:
        refused(send(hostile, route, json.dumps(body).encode()), where, "lone surrogate", detail)
    for route in ROUTES:  # the library's tokenizers never see one
        refused(send(hostile, route, json.dumps({"model": "toy", "text": "\ud800", "kind": "ig"}).encode()),
                "lone surrogate")
    # a surrogate pair escaped in JSON is one valid character (an emoji): accepted
    assert send(hostile, "/api/run", b'{"model": "toy", "text": "Hello \\ud83d\\ude00"}').status_code == 200


@pytest.mark.parametrize("body, words", [
    (b"\xff\xfe{", ("not UTF-8", "byte 0")),
    (json.dumps({"model": "toy", "text": TEXT}).encode("utf-16"), ("not UTF-8",)),
    (b"", ("not valid JSON",)),
    (b'{"model": "toy", "text": ', ("not valid JSON",)),
    (b"null", ("must be a JSON object", "null")),
    (b'["toy"]', ("must be a JSON object", "list")),
    (b'"toy"', ("must be a JSON object", "str")),
    (b'{"model": "toy", "text": "x", "temperature": NaN}', ("NaN", "finite")),
    (b'{"model": "toy", "text": "x", "scale": -Infinity}', ("Infinity", "finite")),
    (b'{"model": "toy", "text": "x", "layer": 1e999}', ("too large", "finite")),
    (b'{"model": "toy", "text": "x", "layer": ' + b"9" * 5000 + b"}", ("5000 characters",)),
])
def test_a_malformed_body_is_a_400_naming_the_problem_on_every_route(hostile, body, words):
    for route in ROUTES:
        refused(send(hostile, route, body), *words)


@pytest.mark.slow
def test_every_setting_of_any_type_on_every_route_is_answered_never_a_500(hostile):
    """The probe's sweep: each route's settings set to a value of each wrong kind (a bool for a
    number, out of range, a string for a number, a list, null, a fraction)."""
    settings = ["model", "text", "target_text", "layer", "head", "row", "map", "query", "top", "index", "scale",
                "target", "method", "kind", "temperature", "top_k", "top_p", "position", "feature", "alpha", "sae",
                "model_b", "text_b", "new_tokens", "point", "corrupt", "view"]
    values = [True, None, 10**12, 1.5, "1", [1]]
    failures = []
    for route in ROUTES:
        for name in settings:
            for value in values:
                body = {"model": "toy", "text": TEXT, "kind": "patch", "corrupt": "Hello World, is this", name: value}
                response = send(hostile, route, json.dumps(body).encode())
                if response.status_code >= 500 or (response.status_code >= 400 and "error" not in response.json()):
                    failures.append((route, name, value, response.status_code, response.text[:200]))
    assert failures == []


def test_a_null_temperature_means_the_default_not_a_crash(hostile):
    response = send(hostile, "/api/run", json.dumps({"model": "toy", "text": TEXT, "temperature": None}).encode())
    assert response.status_code == 200 and response.json()["distribution"]["settings"]["temperature"] == 1.0


def test_nesting_depth_counts_brackets_outside_strings_only():
    assert nesting_depth('{"a": [1, {"b": "[[[{{{"}]}') == 3
    assert nesting_depth(r'{"a": "\"[[[", "b": [[]]}') == 3  # an escaped quote does not end the string
    assert nesting_depth(r'["\\", [[]]]') == 3  # an escaped backslash, then the string ends
    assert nesting_depth("[" * 30000) == MAX_DEPTH + 1  # it stops once past the limit


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(alphabet=st.sampled_from('ab"\\[]{}\n é')),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=20)


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_nesting_depth_is_the_depth_of_any_json_value(value):
    text = json.dumps(value, ensure_ascii=False)
    assert nesting_depth(text) == min(depth(value), MAX_DEPTH + 1)
    if isinstance(value, dict) and depth(value) <= MAX_DEPTH:
        assert json_settings(text.encode()) == value  # what passes the checks parses as json does


def test_a_reply_holding_a_lone_surrogate_is_still_json():
    response = reply({"error": "model '\ud800' is not open"}, 400)
    assert json.loads(response.body) == {"error": "model '\ud800' is not open"}


def test_the_longest_text_fits_an_exports_url(app):
    """An export carries its text in the URL: the longest text of 4-byte characters, and as long a
    target, percent-encoded, stay within the head's limit (what the page sends is never a 431)."""
    from urllib.parse import urlencode

    from starlette.requests import Request

    from anatomy.explore.guard import Guard
    from anatomy.explore.state import MAX_TEXT_CHARACTERS

    longest = "\U0001F600" * MAX_TEXT_CHARACTERS
    query = urlencode({"panel": "lens", "format": "json", "model": "toy-seq2seq", "text": longest,
                       "target_text": longest}).encode()
    scope = {"type": "http", "method": "GET", "path": "/api/export", "raw_path": b"/api/export", "query_string": query,
             "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {TOKEN}".encode())],
             "server": ("testserver", 80)}
    assert len(query) > 180_000 and Guard(None, app.state.explorer).check(Request(scope)) is None
