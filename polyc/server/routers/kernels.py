"""GET /v1/kernels/{key}[/source|/schedule|/object]: stored results by content key."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from ..models import KEY_PATTERN, KernelRecord, ScheduleTrees
from . import get_service, problem_responses

router = APIRouter(tags=["kernels"])
Key = Annotated[str, Path(pattern=KEY_PATTERN, description="content key (sha256, hex)")]
ERRORS = problem_responses(404, 422, 503)


@router.get("/v1/kernels/{key}", response_model=KernelRecord, responses=ERRORS,
            summary="The stored result: source, every tree, report, timings, manifest")
async def get_kernel(key: Key, request: Request) -> Response:
    service = get_service(request)
    entry = await service.lookup(key)
    return Response(service.record_body(entry), media_type="application/json")


@router.get("/v1/kernels/{key}/source", response_class=Response, summary="The C source",
            responses={200: {"content": {"text/x-c": {"schema": {"type": "string"}}},
                             "description": "C99 source"}, **ERRORS})
async def get_source(key: Key, request: Request) -> Response:
    entry = await get_service(request).lookup(key)
    return Response(entry.c_source, media_type="text/x-c; charset=utf-8")


@router.get("/v1/kernels/{key}/schedule", response_model=ScheduleTrees, responses=ERRORS,
            summary="Each kernel's schedule trees (initial and final)")
async def get_schedule(key: Key, request: Request) -> Response:
    service = get_service(request)
    entry = await service.lookup(key)
    return Response(service.schedule_body(entry), media_type="application/json")


@router.get("/v1/kernels/{key}/object", response_class=Response,
            summary="The built shared object (for the host it was compiled on)",
            responses={200: {"content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}},
                "description": "ELF shared object"}, **ERRORS})
async def get_object(key: Key, request: Request) -> Response:
    entry = await get_service(request).lookup(key)
    return Response(entry.object, media_type="application/octet-stream")
