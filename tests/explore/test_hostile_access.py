"""The explorer's server under hostile names: a Host or an Origin that is not exactly the page's own
is refused (another port, userinfo, a look-alike name), and a page allowed to open models opens
only what resolves and loads, at most MAX_OPENED at a time, the least recently used closed first."""

from __future__ import annotations

import pytest
from explore_servers import TOKEN
from starlette.testclient import TestClient

from anatomy.explore import create_app
from anatomy.explore.guard import Access
from anatomy.explore.state import MAX_OPENED

BODY = {"model": "toy", "text": "Hello"}


# ---- Host and Origin ------------------------------------------------------------------------------

@pytest.mark.parametrize("host", [
    "127.0.0.1:8765", "localhost:8765", "[::1]:8765", "LOCALHOST:8765", "proxy.example", "proxy.example:8765",
    "other.example:8443",
])
def test_a_listened_name_and_the_listened_port_are_accepted(host):
    access = Access("token", ["proxy.example", "other.example:8443"])
    assert access.host_allowed(host, 8765)


@pytest.mark.parametrize("host", [
    "evil.example@127.0.0.1:8765",  # userinfo: urlsplit's hostname is 127.0.0.1
    "evil.example@127.0.0.1",
    "127.0.0.1:9999", "localhost:9999",  # another port: another server, perhaps another user's
    "127.0.0.1", "localhost",  # no port: a browser always sends one that is not 80
    "127.0.0.1.evil.example:8765", "localhost.:8765", "127.1:8765", "2130706433:8765", "0x7f.0.0.1:8765",
    "[::1]", "[::ffff:127.0.0.1]:8765", "127.0.0.1:8765:8765", "127.0.0.1:08765x", " 127.0.0.1:8765",
    "127.0.0.1:8765/", "127.0.0.1:8765#", "other.example", "other.example:8765", "", None,
])
def test_any_other_host_is_refused(host):
    access = Access("token", ["proxy.example", "other.example:8443"])
    assert not access.host_allowed(host, 8765)


@pytest.mark.parametrize("origin, allowed", [
    (None, True), ("http://127.0.0.1:8765", True), ("https://127.0.0.1:8765", True),
    ("http://127.0.0.1:9999", False),  # the case: the same address on another port
    ("http://127.0.0.1", False), ("http://localhost:8765", False),  # another name than the page's
    ("null", False), ("file://", False), ("http://evil.example", False), ("http://127.0.0.1:8765.evil.example", False),
    ("ws://127.0.0.1:8765", False), ("http://user@127.0.0.1:8765", False), ("", False),
])
def test_an_origin_must_be_the_pages_own_scheme_host_and_port(origin, allowed):
    assert Access("token", None).origin_allowed(origin, "127.0.0.1:8765") is allowed


def test_the_server_checks_host_and_origin_against_its_own_port(client):
    # TestClient's requests come in on port 80 of "testserver"
    assert client.get("/api/models", headers={"Host": "localhost"}).status_code == 200
    assert client.get("/api/models", headers={"Host": "localhost:80"}).status_code == 200
    for host in ("localhost:8765", "evil.example@localhost", "evil.example@testserver"):
        assert client.get("/api/models", headers={"Host": host}).status_code == 403, host
    assert client.post("/api/run", json=BODY, headers={"Origin": "http://testserver"}).status_code == 200
    for origin in ("http://testserver:8080", "http://localhost", "null"):
        response = client.post("/api/run", json=BODY, headers={"Origin": origin})
        assert response.status_code == 403 and "Origin" in response.json()["error"], origin


# ---- models the page opens ------------------------------------------------------------------------

@pytest.fixture()
def opener(prenorm, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a Hub id not in the cache is refused at once
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    app = create_app(["toy"], token=TOKEN, hosts=["testserver"], allow_open=True)
    with TestClient(app, base_url="http://testserver", raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client


def listed(client) -> list[str]:
    return [m["name"] for m in client.get("/api/models").json()["models"]]


def test_an_offline_hub_id_is_refused_when_opened_and_never_listed(opener):
    for index in range(200):  # the 2,000, a tenth of them
        response = opener.post("/api/open", json={"model": f"someone/offline-model-{index}"})
        assert response.status_code == 400 and "cannot open" in response.json()["error"]
    assert listed(opener) == ["toy"]


@pytest.mark.parametrize("name", ["/nonexistent/folder", "/dev/null", "/proc/self/environ", "../../etc", "toy\x00",
                                  ".", "x" * 5000, "smolm2", "a/b/c/d", "-", " "])
def test_a_name_that_cannot_open_is_a_4xx_naming_it_and_never_listed(opener, name):
    response = opener.post("/api/open", json={"model": name})
    assert 400 <= response.status_code < 500 and response.json()["error"]
    assert listed(opener) == ["toy"]


def test_a_folder_whose_weights_cannot_load_is_never_listed(opener, prenorm, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(prenorm, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])  # the config reads; the weights do not
    response = opener.post("/api/open", json={"model": str(broken)})
    assert response.status_code == 400 and "cannot open" in response.json()["error"]
    assert listed(opener) == ["toy"]


def test_a_model_must_be_opened_before_a_panel_uses_it(opener, prenorm):
    response = opener.post("/api/run", json={"model": prenorm, "text": "Hello"})
    assert response.status_code == 404 and "/api/open" in response.json()["error"]
    assert opener.post("/api/open", json={"model": prenorm}).json()["loaded"] is True
    assert opener.post("/api/run", json={"model": prenorm, "text": "Hello"}).status_code == 200


def test_the_opened_models_are_bounded_and_the_least_recently_used_is_closed(opener, prenorm, tmp_path):
    import shutil

    folders = []
    for index in range(MAX_OPENED + 2):
        folder = tmp_path / f"copy-{index}"
        shutil.copytree(prenorm, folder)
        folders.append(str(folder))
    for folder in folders[:MAX_OPENED]:
        assert opener.post("/api/open", json={"model": folder}).status_code == 200
    assert opener.post("/api/run", json={"model": folders[0], "text": "Hello"}).status_code == 200  # used: kept
    for folder in folders[MAX_OPENED:]:
        assert opener.post("/api/open", json={"model": folder}).status_code == 200
    assert listed(opener) == ["toy", folders[0], *folders[3:]]  # copies 1 and 2 were the least recently used
    assert opener.post("/api/run", json={"model": folders[1], "text": "Hello"}).status_code == 404
    assert opener.post("/api/run", json={"model": "toy", "text": "Hello"}).status_code == 200  # given: never closed


def test_every_limit_in_the_docs_is_the_codes():
    """docs/explore.md's table of the server's limits: each value is its constant's."""
    import importlib
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "explore.md").read_text(encoding="utf-8")
    table = text.split("## The server's limits", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    checked = 0
    for row in table.splitlines()[2:]:
        _, limit, value, constant, _, _ = [cell.strip() for cell in row.split("|")]
        if not constant:
            continue
        module, name = constant.strip("`").split(".")
        actual = getattr(importlib.import_module(f"anatomy.explore.{module}"), name)
        number, unit = re.match(r"([\d,]+) ?(KB|MB)?", value).groups()
        documented = int(number.replace(",", "")) * {"KB": 2**10, "MB": 2**20, None: 1}[unit]
        assert documented == actual, f"{limit}: the docs say {value}, {constant} is {actual}"
        checked += 1
    assert checked >= 20


def test_a_websocket_is_refused_before_any_route(client):
    from starlette.websockets import WebSocketDisconnect

    for host in ("evil.example", "testserver"):  # refused whatever it carries: no check is skipped
        with pytest.raises(WebSocketDisconnect) as closed:
            with client.websocket_connect("/api/models", headers={"Host": host}):
                pass
        assert closed.value.code == 1008
