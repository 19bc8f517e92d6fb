"""The browser view: the page at / and /k/{key}, its static files, running a stored
result on random inputs (POST /v1/kernels/{key}/run), and the microkernels a target
offers (GET /v1/microkernels: what the page's microkernel choice lists).

The page is static files shipped in the package (no build step): one HTML document and
ES modules that call the public API, so every edit made in the page is a compile request
with options, cached and reproducible like any other. Every page response carries a
strict Content-Security-Policy: scripts and styles only from this origin (no inline
script, no eval), requests only to this origin, nothing framed.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Path as PathParam, Query, Request
from fastapi.responses import Response

from pydantic import ValidationError

from ..body import parse_body, read_body
from ... import targets
from ...microkernels import registry
from ..models import KEY_PATTERN, MicrokernelChoice, RunRequest, RunResult
from ..problems import ApiProblem, pydantic_errors
from ..runs import run_entry
from . import client_of, get_service, problem_responses

router = APIRouter(tags=["browser"])
STATIC = Path(__file__).resolve().parent.parent / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".json": "application/json"}
Key = Annotated[str, PathParam(pattern=KEY_PATTERN, description="content key (sha256, hex)")]
Asset = Annotated[str, PathParam(pattern=r"^[a-z0-9_-]{1,40}\.(js|css|json)$")]


@lru_cache(maxsize=None)
def _asset(name: str) -> bytes | None:
    path = STATIC / name
    return path.read_bytes() if path.is_file() else None


def _page() -> Response:
    return Response(_asset("index.html"), media_type=TYPES[".html"], headers=HEADERS)


@router.get("/", response_class=Response, include_in_schema=False)
async def index() -> Response:
    return _page()


@router.get("/k/{key}", response_class=Response, include_in_schema=False)
async def shared_result(key: Key) -> Response:
    # the page itself loads the result (GET /v1/kernels/{key}) and says if it is unknown
    return _page()


@router.get("/static/{name}", response_class=Response, include_in_schema=False)
async def static_file(name: Asset) -> Response:
    body = _asset(name)
    if body is None:
        raise ApiProblem(404, "not-found", "Not Found", f"no static file {name!r}")
    return Response(body, media_type=TYPES[Path(name).suffix], headers=HEADERS)


@router.post("/v1/kernels/{key}/run", response_model=RunResult,
             responses=problem_responses(400, 404, 422, 500, 503, 504),
             summary="Run the stored result on seeded random inputs against the reference",
             openapi_extra={"requestBody": {"content": {"application/json": {
                 "schema": RunRequest.model_json_schema()}}}})
async def run_stored(key: Key, request: Request) -> Response:
    service = get_service(request)
    body = await read_body(request, service.settings.max_body_bytes)
    doc = parse_body(body, max_depth=service.settings.max_json_depth) if body.strip() else {}
    try:
        run = RunRequest.model_validate(doc)
    except ValidationError as e:
        errors = pydantic_errors(e.errors(include_url=False, include_input=False))
        raise ApiProblem(422, "invalid-request", "Invalid Request",
                         "; ".join(f"{x['pointer']}: {x['message']}" for x in errors),
                         errors=errors) from None
    entry = await service.lookup(key)
    return Response(await run_entry(service, entry, run, client_of(request)),
                    media_type="application/json")


@router.get("/v1/microkernels", response_model=list[MicrokernelChoice],
            responses=problem_responses(422),
            summary="The registry's microkernels for a target, and which this service offers")
def microkernels(request: Request,
                 target: Annotated[str, Query(description="a target name")] = "cpu",
                 isa: Annotated[str, Query(description="only this microkernel_isa's kernels "
                                           "are offered ('' any)")] = "") -> list[dict]:
    # a plain def: the first call may ask gcc for the target's features (off the loop)
    if target not in targets.names():
        raise ApiProblem(422, "invalid-request", "Invalid Request",
                         f"/target: unknown target {target!r} (available: "
                         f"{', '.join(targets.names())})",
                         errors=[{"pointer": "/target", "message": "unknown target"}])
    if isa and isa not in registry.ISAS:
        raise ApiProblem(422, "invalid-request", "Invalid Request",
                         f"/isa: must be one of {', '.join(map(repr, registry.ISAS))}, got {isa!r}",
                         errors=[{"pointer": "/isa", "message": "unknown microkernel_isa"}])
    features = get_service(request).machines[target].features
    isa_of = {name: i for i, names in registry.ISAS.items() for name in names}
    return [{"name": m.name, "kind": m.kind, "target": m.target, "features": list(m.features),
             "tile": [m.mr, m.nr], "isa": isa_of.get(m.name, ""),
             # microkernel_isa narrows the gemm kernels only
             "offered": set(m.features) <= features
             and (not isa or m.kind != "gemm" or isa_of.get(m.name) == isa)}
            for m in registry.REGISTRY if m.target == target]
