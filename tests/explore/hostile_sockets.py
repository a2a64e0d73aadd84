"""What the hostile-connection tests share (a module of its own name: `conftest` is taken by every test
folder): raw sockets to the served explorer, and the log records a terminal would show."""

from __future__ import annotations

import logging
import select
import socket
import time

from explore_servers import TOKEN

from anatomy.explore.connections import Limits

LIVENESS = 30.0  # seconds a test waits for something that must happen (a bound on a hang, not a timing check)
SHORT = Limits(header_seconds=0.5, body_seconds=0.5, idle_seconds=1, shutdown_seconds=1)


class Log(logging.Handler):
    """Every record the server's loggers emit while installed (uvicorn's, starlette's, anatomy's, asyncio's)."""

    NAMES = ("", "uvicorn", "uvicorn.error", "anatomy", "asyncio")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def __enter__(self):
        self.levels = {}
        for name in self.NAMES:
            logger = logging.getLogger(name)
            self.levels[name] = logger.level
            logger.addHandler(self)
        logging.getLogger("anatomy").setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        for name in self.NAMES:
            logging.getLogger(name).removeHandler(self)
            logging.getLogger(name).setLevel(self.levels[name])

    def emit(self, record):
        if not any(seen is record for seen in self.records):  # a record reaches each logger it propagates to
            self.records.append(record)

    def shown(self) -> list[str]:
        """What a terminal shows of the server: warnings and worse, each with its traceback."""
        return [self.format(r) + (f"\n{r.exc_info}" if r.exc_info else "") for r in self.records
                if r.levelno >= logging.WARNING]


def connect(served) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=LIVENESS)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request_head(served, method: str, path: str, length: int | None = None, extra: str = "") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{served.port}", f"Authorization: Bearer {TOKEN}"]
    if length is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def closed_while(sock: socket.socket, trickle: bytes = b"") -> bool:
    """Whether the server closes `sock` within LIVENESS seconds while the client sends `trickle` a
    byte every 50 ms (nothing, if empty) and reads whatever comes."""
    end = time.monotonic() + LIVENESS
    position = 0
    while time.monotonic() < end:
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            try:
                if sock.recv(65536) == b"":
                    return True
            except ConnectionError:
                return True
        if position < len(trickle):
            try:
                sock.sendall(trickle[position:position + 1])
            except (BrokenPipeError, ConnectionError):
                return True
            position += 1
    return False


def answers_200_again(served, path: str) -> bool:
    """Whether GET `path` answers 200 within LIVENESS seconds of asking again and again."""
    for _ in range(int(LIVENESS / 0.05)):
        with connect(served) as sock:
            sock.sendall(request_head(served, "GET", path))
            if sock.recv(65536).startswith(b"HTTP/1.1 200"):
                return True
        time.sleep(0.05)
    return False
