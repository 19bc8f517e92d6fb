"""GET /healthz and GET /metrics: cheap, and independent of the compile queue."""
from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...version import __version__
from ..models import Health

router = APIRouter(tags=["operations"])
_HEALTHY = orjson.dumps({"status": "ok", "version": __version__})


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Response:
    # answered on the event loop with no I/O: a busy compile queue cannot delay it
    return Response(_HEALTHY, media_type="application/json")


@router.get("/metrics", response_class=Response, summary="Prometheus metrics",
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format"}})
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(),
                    media_type="text/plain; version=0.0.4; charset=utf-8")
