"""The compile service (DESIGN.md, "The service"): a FastAPI app with a content-addressed
result cache and a pool of compile worker processes; `polyc serve` runs it.

    settings.py     Settings: cache URL, workers, limits (what `polyc serve` flags set)
    app.py          create_app(settings) and serve(): lifespan, error handlers, OpenAPI
    routers/        one router per concern: compile, kernels, operations (health, metrics)
    models.py       pydantic request and response models
    service.py      request -> key -> cache | single-flight compile -> response bytes
    keys.py         the content key and the toolchain fingerprint it covers
    bundle.py       a cache entry as one checksummed blob
    cache.py        SQLite and Redis backends, verified in-memory layer
    workers.py      the worker pool (time limits, replacement); worker_main.py: the child
    singleflight.py identical requests compile once, in one server and across replicas
    body.py         size, content type, nesting depth and strict JSON of request bodies
    problems.py     RFC 9457 problem details with JSON pointers into the request
    metrics.py      Prometheus counters, gauges and a histogram for /metrics
    tunings.py      the tunings `polyc tune --cache` shared through Redis, pulled here
    testing.py      a real `polyc serve` process and a private redis-server, for tests
"""
from __future__ import annotations

__all__ = ["Settings", "create_app", "serve"]


def __getattr__(name: str):
    # lazy, so that a compile worker (python -m polyc.server.worker_main) does not import
    # FastAPI, pydantic and uvicorn for nothing
    if name in ("create_app", "serve"):
        from . import app
        return getattr(app, name)
    if name == "Settings":
        from .settings import Settings
        return Settings
    raise AttributeError(name)
