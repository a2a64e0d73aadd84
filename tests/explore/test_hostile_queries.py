"""The explorer's GET routes under hostile query strings (the exports): every value read as UTF-8 or
refused naming its field, numbers read as JSON reads them (ASCII digits, finite, at most 40
characters) or refused by the setting that wanted one, a view outside head/model/neuron refused, no
text of the request's in a response header; and an encoder-decoder's source past the limits is a 413
before the model translates it."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from explore_servers import refused

import anatomy.explore.state as state
from anatomy.explore.guard import query_settings

TEXT = "Hello World, this is"


def export(client, query: str):
    return client.get(f"/api/export?model=toy&text={quote(TEXT)}&{query}")


@pytest.mark.parametrize("view", ["x\r\nX-Injected: 1", 'x"; filename="evil.exe', "\u2603", "heads"])
def test_an_attention_view_outside_the_three_is_refused_naming_view(hostile, view):
    response = export(hostile, f"panel=attention&format=html&view={quote(view)}")
    refused(response, "'view' must be one of head, model, neuron")
    assert "X-Injected" not in response.headers


@pytest.mark.parametrize("query", ["panel=attention&format=json", "panel=attention&format=png",
                                   "panel=lens&format=html", "panel=walk&format=html"])
def test_a_wrong_view_is_refused_on_every_export(hostile, query):
    refused(export(hostile, f"{query}&view=bogus"), "'view' must be one of head, model, neuron")


@pytest.mark.parametrize("view", ["head", "model", "neuron"])
def test_each_attention_view_exports_under_a_name_of_its_own(hostile, view):
    response = export(hostile, f"panel=attention&format=html&view={view}")
    assert response.status_code == 200
    assert response.headers["content-disposition"] == f'attachment; filename="anatomy-attention-{view}.html"'


def test_a_panel_name_never_reaches_a_header(hostile):
    panel = quote('x"; filename="evil.exe')
    response = export(hostile, f"panel={panel}&format=html")
    assert "evil.exe\"" not in response.headers.get("content-disposition", "")


@pytest.mark.parametrize("layer", ["--5", "%C2%B2", "%D9%A1", "1" * 5000, "1.5", "1e999"])
def test_a_layer_that_is_not_an_ascii_integer_is_refused_naming_layer(hostile, layer):
    refused(export(hostile, f"panel=attention&format=png&layer={layer}"), "'layer' must be an integer in [0, 1]")


@pytest.mark.parametrize("query", ["panel=run&format=json&temperature=0.5", "panel=run&format=json&top_p=.9",
                                   "panel=attention&format=png&layer=1&head=1"])
def test_numbers_in_a_query_are_read_as_json_reads_them(hostile, query):
    assert export(hostile, query).status_code == 200


@pytest.mark.parametrize("raw, field", [("text=%ED%A0%80", "'text'"), ("text=%FF%FE", "'text'"),
                                        ("panel=%80", "'panel'"), ("%FF=1", "a name in the query is not UTF-8")])
def test_a_query_value_that_is_not_utf8_is_refused_naming_its_field(hostile, raw, field):
    response = hostile.get(f"/api/export?model=toy&format=html&{raw}")
    refused(response, field, "not UTF-8")


def test_query_settings_reads_what_json_would():
    assert query_settings(b"a=1&b=-2.5&c=1e3&d=x&e=&text=12&f=%E2%98%83", strings=("text",)) == {
        "a": 1, "b": -2.5, "c": 1000.0, "d": "x", "e": "", "text": "12", "f": "\u2603"}
    assert query_settings(b"n=" + b"9" * 41) == {"n": "9" * 41}  # past 40 characters: a string, refused by its setting


@pytest.mark.parametrize("words", [40, 600])
def test_a_source_past_the_models_positions_is_a_413_before_it_is_translated(hostile, monkeypatch, words):
    def no_translation(*args, **kwargs):
        raise AssertionError("translated before the length was checked")

    monkeypatch.setattr(state, "generate", no_translation)
    response = hostile.post("/api/run", json={"model": "toy-seq2seq", "text": " ".join(["Hello"] * words)})
    assert response.status_code == 413, response.text
    assert "toy-seq2seq reads at most 16" in response.json()["error"]
