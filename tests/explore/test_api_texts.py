"""The explorer's API refuses a text the library refuses (anatomy.text.check_text), with the same
words and HTTP 400: an empty one, and one holding a lone surrogate (JSON's "\\ud800")."""

from __future__ import annotations

import json

import pytest

ROUTES = ["/api/run", "/api/walk", "/api/attention", "/api/lens", "/api/attribution", "/api/intervene",
          "/api/compare", "/api/jobs"]
TEXTS = {
    "": "'text' is empty",
    "   ": "'text' is empty (only white space)",
    "Hello \ud800 World": "'text' holds a lone surrogate, U+D800, at character 6",
}


def post(client, route, body):
    """POST `body` as a browser's JSON.stringify sends it: a lone surrogate as the escape \\udXXX."""
    return client.post(route, content=json.dumps(body), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("text", list(TEXTS), ids=["empty", "spaces", "surrogate"])
def test_every_text_route_answers_400_naming_the_problem(client, route, text):
    body = {"model": "toy", "text": text, "kind": "ig"}
    response = post(client, route, body)
    assert response.status_code == 400, response.text
    assert TEXTS[text] in response.json()["error"]


@pytest.mark.parametrize("field, route, extra", [("text_b", "/api/compare", {}),
                                                 ("corrupt", "/api/jobs", {"kind": "patch"})])
def test_the_second_text_of_a_route_is_checked_too(client, field, route, extra):
    response = post(client, route, {"model": "toy", "text": "Hello World", field: "a\udfffb", **extra})
    assert response.status_code == 400, response.text
    assert f"'{field}' holds a lone surrogate, U+DFFF, at character 1" in response.json()["error"]
