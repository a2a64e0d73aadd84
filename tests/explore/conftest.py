"""Fixtures: the explorer's app in-process (Starlette's TestClient) and served on a loopback port
for the browser, with the toys, a pre-norm toy folder (and SmolLM2 when its package is installed)."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from explore_servers import HAS_SMOLLM2, TOKEN, TOYS, Served  # noqa: E402
from hostile_sockets import SHORT  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from anatomy.explore import create_app  # noqa: E402


@pytest.fixture(scope="session")
def sae_folder(tmp_path_factory) -> str:
    """A small TopK SAE on the pre-norm toy's last residual stream, saved in SAELens's format."""
    from anatomy.sae import SAE

    folder = tmp_path_factory.mktemp("toy-sae")
    SAE(4, 16, kind="topk", k=2, point="blocks.1.resid_post", seed=3).save(folder)
    return str(folder)


@pytest.fixture(scope="session")
def long_toy(tmp_path_factory) -> str:
    """The toy with a position table of 600: a text of 512 tokens fits (the live explorer's limit)."""
    from anatomy.checkpoints.toys import build_toy, toy_tokenizer

    folder = tmp_path_factory.mktemp("long-toy")
    build_toy("toy", max_seq_len=600).save_pretrained(folder)
    toy_tokenizer("toy").save(folder)
    return str(folder)


@pytest.fixture(scope="module")
def app(prenorm, sae_folder):
    return create_app(TOYS + [prenorm], token=TOKEN, hosts=["testserver"], saes=[f"{prenorm}={sae_folder}"])


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app, base_url="http://testserver") as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


@pytest.fixture(scope="module")
def hostile(app):
    """A client that sees a 500 as a response (not as the server's exception re-raised)."""
    with TestClient(app, base_url="http://testserver", raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client


@pytest.fixture(scope="module")
def served(prenorm, sae_folder):
    server = Served(TOYS + (["smollm2"] if HAS_SMOLLM2 else []) + [prenorm], saes=[f"{prenorm}={sae_folder}"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server():
    """The toy served with the deadlines shortened (hostile_sockets.SHORT), for the hostile-connection tests."""
    served = Served(["toy"], limits=SHORT)
    yield served
    served.stop()
