"""Connections that try to hold a real `polyc serve` on loopback: trickled headers and
bodies are cut off with 408 (and counted in /metrics), silent connections are closed, a
connection limit holds with a problem+json 503, and a client that hangs up mid-body is
one log line and a 499 in the metrics."""
from __future__ import annotations

import re
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from polyc.server.connections import Connections, _h11_class, protocol_class
from polyc.server.metrics import Metrics
from polyc.server.testing import ServerProcess

HEADER_TIMEOUT_S, BODY_TIMEOUT_S, MAX_CONNECTIONS = 1.0, 1.5, 20


@pytest.fixture(scope="module")
def server(tmp_path_factory, seeded_cache):
    tmp = tmp_path_factory.mktemp("connections")
    args = ("--header-timeout", str(HEADER_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S),
            "--max-connections", str(MAX_CONNECTIONS), "--log-level", "info")
    with ServerProcess(f"sqlite:///{tmp}/cache.sqlite3", workers=1, log_dir=tmp, args=args,
                       env={"POLYC_CACHE_DIR": seeded_cache(tmp)}) as s:
        yield s


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def trickle_until_closed(s: socket.socket, pieces: list[bytes], gap_s: float) -> tuple[bytes, float]:
    """Send `pieces` one by one `gap_s` apart until the server closes; what it answered
    and how long it let the connection live."""
    start = time.monotonic()
    s.setblocking(False)
    answer = b""
    for piece in pieces:
        try:
            s.sendall(piece)
        except OSError:
            break
        deadline = time.monotonic() + gap_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return answer, time.monotonic() - start
            answer += chunk
    s.close()
    return answer, time.monotonic() - start


def timeouts(server, phase: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    found = re.search(r'^polyc_http_timeouts_total\{phase="' + phase + r'"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_trickled_headers_are_cut_off(server):
    before = timeouts(server, "header")
    pieces = [b"POST /v1/compile HTTP/1.1\r\nHost: x\r\n"] + [b"X-Slow: 1\r\n"] * 40
    answer, lived = trickle_until_closed(connect(server), pieces, 0.2)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert lived < HEADER_TIMEOUT_S + 1.5, lived
    assert timeouts(server, "header") == before + 1


def test_silent_connection_is_closed(server):
    before = timeouts(server, "idle")
    s = connect(server)
    start = time.monotonic()
    assert s.recv(100) == b""  # closed by the server, before the socket's own 10 s
    assert time.monotonic() - start < HEADER_TIMEOUT_S + 1.5
    assert timeouts(server, "idle") == before + 1


def test_trickled_body_is_cut_off_with_408(server):
    head = (b"POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    before = timeouts(server, "body")
    answer, lived = trickle_until_closed(connect(server), [head] + [b" " * 10] * 40, 0.2)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"did not arrive within 1.5 s" in answer
    assert lived < BODY_TIMEOUT_S + 1.5, lived
    assert timeouts(server, "body") == before + 1


def status_count(server, status: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    return sum(float(v) for v in re.findall(
        r'^polyc_http_requests_total\{[^}]*status="' + status + r'"\} (\S+)$', text, re.M))


def test_client_hanging_up_mid_body_is_one_line_and_a_499(server):
    before_499, before_500 = status_count(server, "499"), status_count(server, "500")
    log_before = len(server.log.splitlines())
    for _ in range(3):
        s = connect(server)
        s.sendall(b"POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n" + b'{"graph": ' + b" " * 1000)
        time.sleep(0.1)
        s.close()
    deadline = time.monotonic() + 5
    while status_count(server, "499") < before_499 + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status_count(server, "499") == before_499 + 3
    assert status_count(server, "500") == before_500
    new_lines = server.log.splitlines()[log_before:]
    assert sum("hung up" in line for line in new_lines) == 3, new_lines
    assert not any("Traceback" in line or "ERROR" in line for line in new_lines), new_lines


def test_connection_limit_holds_and_frees_up(server):
    idle = [connect(server) for _ in range(MAX_CONNECTIONS + 5)]
    try:
        time.sleep(0.2)
        over = httpx.get(server.url + "/healthz")
        assert over.status_code == 503
        # a problem like every other error, not uvicorn's plain-text one
        assert over.headers["content-type"] == "application/problem+json"
        assert over.headers["retry-after"] == "1"
        assert over.headers["connection"] == "close"
        problem = over.json()
        assert problem["type"] == "urn:polyc:problem:too-many-connections"
        assert problem["status"] == 503
        assert f"limit of {MAX_CONNECTIONS} connections" in problem["detail"]
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    assert httpx.get(server.url + "/healthz").status_code == 200


@pytest.mark.parametrize("kind", ["httptools", "h11"])
def test_header_deadline_on_either_http_protocol(kind):
    # uvicorn uses httptools when installed, else h11: the deadline works on both
    if kind == "httptools":
        pytest.importorskip("httptools")

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    connections = Connections(100, Metrics())
    http = (protocol_class if kind == "httptools" else _h11_class)(0.5, connections)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=http, lifespan="off",
                            log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # a prompt request is served
            assert s.recv(1000).startswith(b"HTTP/1.1 200")
            s.sendall(b"GET / HTTP/1.1\r\n")  # the next one trickles
            answer, lived = trickle_until_closed(s, [b"X: 1\r\n"] * 20, 0.1)
        assert answer.startswith(b"HTTP/1.1 408") and lived < 1.5, (answer, lived)
        assert connections.metrics.timeouts.value(phase="header") == 1
        deadline = time.monotonic() + 5
        while connections.open and time.monotonic() < deadline:  # closed on its side
            time.sleep(0.01)
        assert connections.open == 0
    finally:
        server.should_exit = True
        thread.join(10)


def test_head_on_a_real_server(server):
    # uvicorn checks a body against Content-Length unless it sees the HEAD itself
    log_before = len(server.log.splitlines())
    for path in ("/healthz", "/metrics", "/openapi.json"):
        head = httpx.head(server.url + path)
        assert head.status_code == 200 and head.content == b"", path
        assert int(head.headers["content-length"]) > 0
    assert not any("Traceback" in line for line in server.log.splitlines()[log_before:])
