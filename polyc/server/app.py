"""The FastAPI application: `create_app(settings)` and `serve(...)` for `polyc serve`.

Shared resources (the cache backend, the worker pool, the toolchain fingerprint) are
opened in `lifespan` and closed after the last request. Every error leaves as RFC 9457
problem+json: FastAPI's default handlers are replaced, since the validation one echoes
the input back (and fails with a 500 on a NaN in it).
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..version import __version__
from .cache import ResultCache, open_backend
from .connections import BodyGuard, ConnectionLimit, Connections, protocol_class
from .http_rules import HttpRules
from .keys import Toolchain
from .metrics import Metrics
from .models import CompileRequest
from .problems import PROBLEM_JSON, ApiProblem, cut_path, pydantic_errors
from .routers import browser as browser_routes
from .routers import compile as compile_routes
from .routers import kernels as kernel_routes
from .routers import ops as ops_routes
from .service import CompileService
from .settings import Settings
from .tunings import follow_tunings, pull_tunings
from .workers import WorkerPool

log = logging.getLogger("polyc.server")

DESCRIPTION = """polyc as a shared build server: send a subgraph, get C, schedule trees and
the fusion report. Results are stored by content key (sha256 of the canonical graph,
target, options and toolchain), so repeated requests are answered from the cache.
Errors are RFC 9457 problem details."""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        toolchain = await asyncio.to_thread(Toolchain.detect)
        backend = open_backend(settings.cache_url, timeout_s=settings.cache_timeout_s,
                               cool_down_s=settings.cache_retry_s)
        pool = WorkerPool(settings.workers, memory_bytes=settings.worker_memory_bytes,
                          max_jobs=settings.max_jobs_per_worker,
                          queue_size=settings.queue_size,
                          per_client=settings.workers_per_client, metrics=metrics)
        follower = None
        try:
            await backend.open()
            await pool.start()
            if (problem := backend.health()["problem"]) is not None:
                log.warning("%s", problem)
            if backend.shared:  # before the first compile, so it uses them
                await pull_tunings(settings.cache_url, settings.cache_timeout_s)
                follower = asyncio.create_task(follow_tunings(
                    settings.cache_url, every_s=settings.tuning_sync_s,
                    timeout_s=settings.cache_timeout_s))
            cache = ResultCache(backend, hot_bytes=settings.hot_cache_bytes, metrics=metrics,
                                secret=settings.cache_secret)
            app.state.service = CompileService(settings, cache, pool, toolchain, metrics)
            log.info("polyc service ready: cache %s, %d compile workers", backend.location,
                     settings.workers)
            yield
        finally:
            app.state.service = None
            if follower is not None:
                follower.cancel()
            await pool.close()
            await backend.close()

    app = FastAPI(title="polyc compile service", version=__version__,
                  description=DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.service = None

    def service_value(read):
        return lambda: read(app.state.service) if app.state.service is not None else 0
    metrics.gauge("polyc_compile_workers", "compile worker processes",
                  service_value(lambda s: s.pool.size))
    metrics.gauge("polyc_compile_workers_busy", "workers running a compile",
                  service_value(lambda s: s.pool.busy))
    metrics.gauge("polyc_compile_queue_waiting", "compiles waiting for a worker",
                  service_value(lambda s: s.pool.waiting))
    metrics.gauge("polyc_cache_memory_entries", "verified entries held in memory",
                  service_value(lambda s: s.cache.memory_entries))
    metrics.gauge("polyc_cache_ok", "1 if the cache backend has no problem (see /healthz?"
                  "detail=1), 0 if it is read-only, lost its file or cannot be reached",
                  service_value(lambda s: s.cache.backend.health()["ok"]))
    metrics.gauge("polyc_cache_writable", "1 if results are stored by the cache backend, "
                  "0 if they are kept in memory only",
                  service_value(lambda s: s.cache.backend.health()["writable"]))

    _install_problem_handlers(app)
    app.include_router(compile_routes.router)
    app.include_router(kernel_routes.router)
    app.include_router(ops_routes.router)
    app.include_router(browser_routes.router)
    app.state.connections = Connections(settings.max_connections, metrics)
    app.add_middleware(BodyGuard, body_timeout_s=settings.body_timeout_s, metrics=metrics)
    app.add_middleware(ConnectionLimit, connections=app.state.connections)
    # outside BodyGuard and ConnectionLimit: counts their 408, 499 and 503
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(HttpRules)
    app.openapi = lambda: _openapi(app)
    return app


METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetrics:
    """Counts requests by method, route template (not raw path: bounded label values)
    and status. A plain ASGI middleware: cheaper than BaseHTTPMiddleware."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.metrics.requests.inc(method=method, route=path, status=str(status))


def _install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiProblem)
    async def api_problem(request: Request, exc: ApiProblem):
        return exc.response(request)

    @app.exception_handler(RequestValidationError)
    async def validation_problem(request: Request, exc: RequestValidationError):
        # messages and locations only: the input is never echoed
        errors = pydantic_errors(exc.errors())
        detail = "; ".join(f"{e['pointer']}: {e['message']}" for e in errors) or "invalid"
        return ApiProblem(422, "invalid-request", "Invalid Request", detail,
                          errors=errors).response(request)

    @app.exception_handler(StarletteHTTPException)
    async def http_problem(request: Request, exc: StarletteHTTPException):
        phrase = HTTPStatus(exc.status_code).phrase
        slug = phrase.lower().replace(" ", "-").replace("'", "")
        detail = exc.detail if isinstance(exc.detail, str) else phrase
        if exc.status_code == 404 and detail == phrase:
            detail = f"no route {cut_path(request.url.path)!r}"
        return ApiProblem(exc.status_code, slug, phrase, detail,
                          headers=dict(exc.headers or {})).response(request)

    @app.exception_handler(Exception)
    async def internal_problem(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return ApiProblem(500, "internal", "Internal Server Error",
                          f"an unexpected {type(exc).__name__} (a polyc bug; it was logged)"
                          ).response(request)


def _openapi(app: FastAPI) -> dict:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    request = CompileRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(request.pop("$defs", {}))
    components["CompileRequest"] = request
    # error bodies are problem+json: FastAPI lists the model under application/json
    for operations in schema.get("paths", {}).values():
        for op in operations.values():
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                if status[:1] in "45" and "application/json" in content:
                    content[PROBLEM_JSON] = content.pop("application/json")
    app.openapi_schema = schema
    return schema


async def _check_cache(url: str) -> None:
    backend = open_backend(url, timeout_s=5.0)  # ValueError for a malformed URL
    try:
        await backend.open()
    except Exception as e:
        raise ValueError(f"cannot open the cache {url}: {e}") from None
    finally:
        await backend.close()


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info", access_log: bool = False) -> int:
    """Run the service with uvicorn until SIGINT / SIGTERM."""
    import uvicorn

    # an unusable cache fails here with one line, before anything starts
    asyncio.run(_check_cache(settings.cache_url))
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s:     %(message)s")
    app = create_app(settings)
    # the connection limit is the app's (ConnectionLimit), not uvicorn's plain-text one
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            access_log=access_log, lifespan="on", timeout_graceful_shutdown=10,
                            http=protocol_class(settings.header_timeout_s,
                                                app.state.connections),
                            timeout_keep_alive=5)
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
