"""GET /healthz and GET /metrics: cheap, and independent of the compile queue."""
from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...version import __version__
from ..models import Health, HealthDetail
from . import get_service

router = APIRouter(tags=["operations"])
_HEALTHY = orjson.dumps({"status": "ok", "version": __version__})


@router.get("/healthz", response_model=Health | HealthDetail, summary="Liveness",
            openapi_extra={"parameters": [{"name": "detail", "in": "query", "required": False,
                                           "schema": {"type": "boolean", "default": False}}]},
            description="`?detail=1` adds the cache's and the workers' state (the cache "
                        "file is looked at, so it costs a stat).")
async def healthz(request: Request) -> Response:
    # read by hand: a declared query parameter would add FastAPI's own 422 to the schema
    if request.query_params.get("detail", "").lower() not in ("1", "true", "yes"):
        # answered on the event loop with no I/O: a busy compile queue cannot delay it
        return Response(_HEALTHY, media_type="application/json")
    service = get_service(request)
    backend = service.cache.backend
    await backend.refresh()
    cache = {"location": backend.location, "shared": backend.shared, **backend.health(),
             "memory_entries": service.cache.memory_entries}
    workers = {"size": service.pool.size, "busy": service.pool.busy,
               "waiting": service.pool.waiting}
    return Response(orjson.dumps({"status": "ok" if cache["ok"] else "degraded",
                                  "version": __version__, "cache": cache,
                                  "workers": workers}), media_type="application/json")


@router.get("/metrics", response_class=Response, summary="Prometheus metrics",
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format"}})
async def metrics(request: Request) -> Response:
    service = request.app.state.service
    if service is not None:
        await service.cache.backend.refresh()  # the cache gauges are current
    return Response(request.app.state.metrics.render(),
                    media_type="text/plain; version=0.0.4; charset=utf-8")
