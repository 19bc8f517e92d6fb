"""Two HTTP rules FastAPI leaves to the application, as plain ASGI middleware.

- `HEAD` is answered on every GET route (RFC 9110 9.3.2: a server that answers GET
  answers HEAD), with GET's status and headers and no body; routes list GET only.
- An encoded slash (`%2F`) in a path is refused with 404: the router sees the decoded
  path, so `/v1/kernels/<key>%2Fsource` would otherwise reach the `/source` route, and
  no polyc path has a slash inside a segment.
"""
from __future__ import annotations

from .problems import ApiProblem, cut_path


class HttpRules:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = scope.get("raw_path") or b""
        if b"%2f" in raw.lower():
            problem = ApiProblem(404, "not-found", "Not Found",
                                 f"no route {cut_path(raw.decode('latin-1'))!r}: an encoded "
                                 "'/' (%2F) does not separate path segments")
            return await problem.response()(scope, receive, _body_less(send)
                                            if scope["method"] == "HEAD" else send)
        if scope["method"] != "HEAD":
            return await self.app(scope, receive, send)
        # the routes see a GET; the server still sees the HEAD (uvicorn then checks no
        # body against Content-Length)
        await self.app({**scope, "method": "GET"}, receive, _body_less(send))


def _body_less(send):
    """`send` that passes the status and headers (Content-Length included) but no body."""
    async def send_head(message):
        if message["type"] == "http.response.body":
            if message.get("more_body", False):
                return
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(message)
    return send_head
