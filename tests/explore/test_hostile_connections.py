"""The explorer's server under hostile connections, served by uvicorn on a loopback port with the
settings `anatomy explore` uses (connections.py), the deadlines shortened: idle, trickled-header and
trickled-body connections are closed, connections past the bound are answered 503, a client that
leaves mid-body costs no traceback. (A job's followers: test_hostile_streams.py; the command's own
terminal: test_hostile_command.py.)"""

from __future__ import annotations

import json
import time

import pytest
from explore_servers import Served
from hostile_sockets import LIVENESS, Log, answers_200_again, closed_while, connect, request_head

from anatomy.explore.connections import Limits
from anatomy.explore.guard import MAX_HEAD


def test_a_connection_that_never_sends_a_byte_is_closed(server):
    with connect(server) as sock:
        assert closed_while(sock)


def test_a_request_whose_headers_trickle_in_is_closed(server):
    with connect(server) as sock:
        assert closed_while(sock, request_head(server, "GET", "/api/models") * 50)


def test_a_body_that_trickles_in_is_closed_without_a_traceback(server):
    body = json.dumps({"model": "toy", "text": "Hello " * 40}).encode()
    with Log() as log:
        for _ in range(3):
            with connect(server) as sock:
                sock.sendall(request_head(server, "POST", "/api/run", len(body)))
                assert closed_while(sock, body)
    assert log.shown() == []


def test_a_kept_alive_connection_that_idles_is_closed(server):
    with connect(server) as sock:
        sock.sendall(request_head(server, "GET", "/api/models"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert closed_while(sock)


def test_clients_that_leave_mid_body_cost_at_most_one_line_each_and_no_traceback(server):
    with Log() as log:
        for _ in range(30):
            with connect(server) as sock:
                sock.sendall(request_head(server, "POST", "/api/run", 1000) + b'{"model": "toy", "te')
        with connect(server) as sock:  # the server answers on: its one thread never stopped
            sock.sendall(request_head(server, "GET", "/api/models"))
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    assert log.shown() == []
    assert sum("left" in r.getMessage() for r in log.records) <= 30


def test_a_chunked_body_is_refused_whatever_content_length_it_claims(server):
    # h11 reads a body by its chunks when both are given: a Content-Length of 10 let 200 MB through
    # (the head and a first chunk: the answer comes from the headers, before any body is read)
    head = request_head(server, "POST", "/api/run", 10, extra="Transfer-Encoding: chunked\r\n")
    with connect(server) as sock:
        sock.sendall(head + b"%x\r\n" % 200_000_000 + b'{"model": "toy", "text": "Hello", "x": "aaaa')
        answer = b""
        while not answer.endswith(b"}"):  # the status line, the headers, then the JSON error
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
    assert answer.startswith(b"HTTP/1.1 411"), answer[:200]
    assert b"Transfer-Encoding" in answer


@pytest.mark.parametrize("twice", ["Origin: http://127.0.0.1:{port}\r\nOrigin: http://evil.example\r\n",
                                   "Host: evil.example\r\n"])
def test_a_second_host_or_origin_header_is_refused(server, twice):
    with connect(server) as sock:
        sock.sendall(request_head(server, "GET", "/api/models", extra=twice.format(port=server.port)))
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


def test_an_upgrade_request_is_answered_as_http_without_a_warning(server):
    upgrade = ("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: x3JJHMbDL1EzLkh9GBhXDw==\r\n"
               "Sec-WebSocket-Version: 13\r\n")
    with Log() as log:
        for path in ("/api/models", "/static/main.js"):
            with connect(server) as sock:
                sock.sendall(request_head(server, "GET", path, extra=upgrade))
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    assert log.shown() == []


@pytest.mark.parametrize("pieces", [1, 40])
def test_headers_past_the_limit_are_refused_in_one_line(server, pieces):
    head = request_head(server, "GET", "/api/models", extra=f"X-Big: {'a' * (MAX_HEAD + 100)}\r\n")
    with Log() as log, connect(server) as sock:
        size = len(head) // pieces + 1
        try:
            for start in range(0, len(head), size):  # at once, or as it would come over a slow link
                sock.sendall(head[start:start + size])
        except ConnectionError:
            pass  # the server has answered and closed while the rest was on its way
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 431") or answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert len(log.shown()) <= 1 and all("Traceback" not in line for line in log.shown())


def test_connections_past_the_bound_are_answered_503_and_the_server_stays_up():
    served = Served(["toy"], limits=Limits(header_seconds=LIVENESS, max_connections=4))
    held = [connect(served) for _ in range(4)]
    try:
        time.sleep(0.2)  # the server has accepted them (an ordering, not a timing check: it only delays)
        with connect(served) as sock:
            sock.sendall(request_head(served, "GET", "/api/models"))
            assert sock.recv(65536).startswith(b"HTTP/1.1 503")
        for sock in held:
            sock.close()
        held = []
        assert answers_200_again(served, "/api/models")  # room again once the server has seen them close
    finally:
        for sock in held:
            sock.close()
        served.stop()
