"""Connections that cannot hold the server: time limits on headers and bodies, a limit
on connections and requests at once, and quiet handling of clients that hang up.

uvicorn closes idle keep-alive connections (`timeout_keep_alive`), but it waits forever
for a request's headers and body (200 connections trickling a byte now and then stay
open for as long as their senders like), and the 503 of its own connection limit
(`limit_concurrency`) is plain text. What this module adds:

- `protocol_class(header_timeout_s, connections)`: uvicorn's own HTTP protocol
  (httptools, else h11) with a deadline from a connection's first byte, or the first
  byte of its next request, to the end of that request's headers; past it the
  connection gets 408 and is closed. A connection that sends nothing at all is closed
  (silently) at the same deadline. It also counts the open connections.
- `ConnectionLimit` (ASGI middleware): past `max_connections` open connections, or
  with that many requests already being answered, a request gets a 503 problem+json
  with Retry-After and its connection is closed (uvicorn's limit is left off).
- `BodyGuard` (ASGI middleware): the whole body must arrive within `body_timeout_s` of
  the first read (408 and the connection closed), and a client that hangs up while
  sending is one log line and a 499 in the metrics, not a 500 with a traceback.

Each time-out is counted in /metrics (`polyc_http_timeouts_total`, by phase).
"""
from __future__ import annotations

import asyncio
import logging

from starlette.requests import ClientDisconnect

from .metrics import Metrics
from .problems import ApiProblem

log = logging.getLogger("polyc.server")

_LATE_TEXT = b"the request headers took too long to arrive\n"
_HEADERS_LATE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
                 % (len(_LATE_TEXT), _LATE_TEXT))
CLIENT_GONE = 499  # nginx's status for a client that closed the request


class Connections:
    """What the connection layer and the app share: open connections (counted by the
    protocol), requests being answered (by `ConnectionLimit`), the limit on both, and
    the metrics its time-outs are counted in."""

    def __init__(self, limit: int, metrics: Metrics):
        self.limit = limit
        self.metrics = metrics
        self.open = 0
        self.answering = 0

    def full(self) -> bool:
        """Whether a request that just came (on a connection already counted) is one
        too many."""
        return self.open > self.limit or self.answering >= self.limit


class _HeaderDeadline:
    """Mixed into a uvicorn HTTP protocol: `_arm` when a request starts, `_disarm` when
    its headers are complete; counts the open connections."""

    header_timeout_s = 10.0
    counted: Connections  # (uvicorn's protocol has `connections`: the set of them)
    _header_timer: asyncio.TimerHandle | None = None
    _began = False  # a request's first bytes came: it is owed an answer

    def _arm(self, *, began: bool = True) -> None:
        self._began = began
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._began and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(_HEADERS_LATE)
        self.counted.metrics.timeouts.inc(phase="header" if self._began else "idle")
        self.transport.close()

    def connection_made(self, transport) -> None:
        self.counted.open += 1
        super().connection_made(transport)
        self._arm(began=False)  # a connection that never sends a byte is closed too

    def connection_lost(self, exc) -> None:
        self.counted.open -= 1
        self._disarm()
        super().connection_lost(exc)


def protocol_class(header_timeout_s: float, connections: Connections) -> type:
    """uvicorn's HTTP protocol (the one its 'auto' setting picks) with a header deadline,
    counting its connections in `connections`."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is optional in uvicorn
        return _h11_class(header_timeout_s, connections)

    class HttpToolsWithDeadline(_HeaderDeadline, HttpToolsProtocol):
        def on_message_begin(self) -> None:
            self._arm()
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

    HttpToolsWithDeadline.header_timeout_s = header_timeout_s
    HttpToolsWithDeadline.counted = connections
    return HttpToolsWithDeadline


def _h11_class(header_timeout_s: float, connections: Connections) -> type:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class H11WithDeadline(_HeaderDeadline, H11Protocol):
        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:  # bytes of a request not yet complete
                self._arm()
            else:
                self._disarm()

    H11WithDeadline.header_timeout_s = header_timeout_s
    H11WithDeadline.counted = connections
    return H11WithDeadline


class ConnectionLimit:
    """ASGI middleware: a request past the limit of `connections` answers 503 (a
    problem, like every other error) and its connection is closed, which frees a slot."""

    def __init__(self, app, connections: Connections):
        self.app = app
        self.connections = connections

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        c = self.connections
        if c.full():
            log.warning("connection limit reached (%d open, %d requests being answered, "
                        "limit %d): a request got 503", c.open, c.answering, c.limit)
            problem = ApiProblem(
                503, "too-many-connections", "Service Unavailable",
                f"the server is at its limit of {c.limit} connections and requests at once; "
                "try again shortly", headers={"Retry-After": "1", "Connection": "close"})
            return await problem.response()(scope, receive, send)
        c.answering += 1
        try:
            await self.app(scope, receive, send)
        finally:
            c.answering -= 1


class BodyTooSlow(Exception):
    pass


class BodyGuard:
    """ASGI middleware: a deadline on the request body, and hang-ups answered quietly."""

    def __init__(self, app, body_timeout_s: float, metrics: Metrics):
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        body_done = False
        received = 0
        started = False

        async def timed_receive():
            nonlocal deadline, body_done, received
            if body_done:  # after the body: waiting for a disconnect is not limited
                return await receive()
            if deadline is None:
                deadline = loop.time() + self.body_timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTooSlow from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, tracked_send)
        except BodyTooSlow:
            self.metrics.timeouts.inc(phase="body")
            if started:
                raise
            problem = ApiProblem(408, "body-timeout", "Request Timeout",
                                 f"the request body did not arrive within "
                                 f"{self.body_timeout_s:g} s ({received} bytes came)",
                                 headers={"Connection": "close"})
            await problem.response()(scope, receive, send)
        except ClientDisconnect:
            client = scope.get("client") or ("?", 0)
            log.info("%s:%s hung up while sending %s %s (%d bytes of its body came)",
                     client[0], client[1], scope["method"], scope["path"], received)
            if not started:  # for the metrics: the client is gone, nothing is written
                await send({"type": "http.response.start", "status": CLIENT_GONE,
                            "headers": []})
                await send({"type": "http.response.body", "body": b""})
