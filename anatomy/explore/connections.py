"""The explorer's connections: how long a client may take, and how many may be open.

uvicorn's HTTP/1.1 protocol (h11) closes a connection that idles after a response
(`timeout_keep_alive`), but not one that never sends a request, sends its headers a byte at a
time, or trickles its body: each holds a socket and a task for as long as the client likes. The
protocol here gives every phase of a request a deadline, and refuses connections past a bound:

    phase                                  deadline
    connect or last response -> headers    HEADER_SECONDS   (from the first byte after a response)
    headers -> the whole body              BODY_SECONDS
    a response -> the next request         IDLE_SECONDS     (uvicorn's keep-alive timeout)

A connection past its deadline is closed; the app sees a client that left (a body that never
came is starlette's ClientDisconnect, answered without a traceback). A connection opened while
MAX_CONNECTIONS are open is answered 503 and closed. While the app computes or streams a
response (a job's events), no deadline runs: that is the app's to end.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .guard import MAX_HEAD

HEADER_SECONDS = 10.0  # from a connection's start (or its first byte after a response) to its request's last header
BODY_SECONDS = 10.0  # from a request's headers to the last byte of its body (at most guard.MAX_BODY)
IDLE_SECONDS = 5  # a kept-alive connection waiting for its next request
MAX_CONNECTIONS = 64  # connections open at once; one more is answered 503
MAX_HEADER_BYTES = MAX_HEAD  # a request line and headers h11 holds while they arrive; more is answered 400
SHUTDOWN_SECONDS = 5  # on Ctrl-C, how long open responses (a job's events) may take to end
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"content-length: 38\r\n\r\ntoo many connections: close some first")


@dataclass(frozen=True)
class Limits:
    """The deadlines (seconds) and the bounds on connections and header bytes of one server."""

    header_seconds: float = HEADER_SECONDS
    body_seconds: float = BODY_SECONDS
    idle_seconds: float = IDLE_SECONDS
    max_connections: int = MAX_CONNECTIONS
    max_header_bytes: int = MAX_HEADER_BYTES
    shutdown_seconds: int = SHUTDOWN_SECONDS


def protocol_for(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol, with a deadline on each phase of a request and a bound on connections."""

    class Deadlines(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.deadline: asyncio.TimerHandle | None = None
            self.phase: str | None = None
            if len(self.connections) > limits.max_connections:
                transport.write(BUSY)
                transport.close()
                return
            self.arm("headers", limits.header_seconds)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self.follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # arms uvicorn's keep-alive (idle) timeout
            self.arm(None, 0)
            self.follow()  # a pipelined request already read

        def connection_lost(self, exc: Exception | None) -> None:
            self.arm(None, 0)
            super().connection_lost(exc)

        def follow(self) -> None:
            """The deadline of the phase the client is in now: its headers, its body, or none."""
            state = self.conn.their_state
            if state is h11.IDLE and self.conn.our_state is h11.IDLE:
                if self.phase != "headers" and self.timeout_keep_alive_task is None:
                    self.arm("headers", limits.header_seconds)  # bytes of a request have come
            elif state is h11.SEND_BODY:
                if self.phase != "body":
                    self.arm("body", limits.body_seconds)
            elif self.phase is not None:
                self.arm(None, 0)  # the request is in: the app answers it

        def arm(self, phase: str | None, seconds: float) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            self.phase = phase
            self.deadline = None if phase is None else self.loop.call_later(seconds, self.expire)

        def _unsupported_upgrade_warning(self) -> None:
            # The app has no WebSocket: an upgrade request is answered as plain HTTP, in one line at the
            # INFO level, not uvicorn's two warnings (one advising a WebSocket library it does not need).
            self.logger.info("an upgrade request (%s) was answered as plain HTTP", self._get_upgrade())

        def expire(self) -> None:
            self.deadline = self.phase = None
            if not self.transport.is_closing():
                self.transport.close()

    return Deadlines


# The protocol with the default limits, by name for uvicorn's own command line:
#     uvicorn anatomy.explore:app --http anatomy.explore.connections:Deadlines
Deadlines = protocol_for(Limits())


def config(app, limits: Limits = Limits()):
    """uvicorn's settings for the explorer: the protocol with deadlines, the keep-alive and header
    limits, no WebSocket (the app has none: an upgrade request is answered as plain HTTP), a
    bounded shutdown, and warnings only on the terminal."""
    import uvicorn

    return uvicorn.Config(app, http=protocol_for(limits), ws="none", lifespan="off", log_level="warning",
                          access_log=False, timeout_keep_alive=limits.idle_seconds,
                          h11_max_incomplete_event_size=limits.max_header_bytes,
                          timeout_graceful_shutdown=limits.shutdown_seconds)


def serve(app, sock: socket.socket, limits: Limits = Limits()) -> None:
    """Serve `app` on a listening socket until Ctrl-C (or until the server is told to exit)."""
    import uvicorn

    uvicorn.Server(config(app, limits)).run(sockets=[sock])


__all__ = ["BODY_SECONDS", "HEADER_SECONDS", "IDLE_SECONDS", "MAX_CONNECTIONS", "MAX_HEADER_BYTES", "Deadlines", "Limits",
           "SHUTDOWN_SECONDS", "config", "protocol_for", "serve"]
