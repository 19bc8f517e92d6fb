"""POST /v1/compile."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..body import read_body
from ..models import CompileResponse
from . import client_of, get_service, problem_responses

router = APIRouter(tags=["compile"])

# The body is read and parsed by hand (size limit while streaming, depth limit before
# parsing, strict JSON, polyc's messages for the graph) rather than by FastAPI, so its
# schema is declared here; app.py puts CompileRequest into the components.
REQUEST_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/CompileRequest"}}}}}


@router.post("/v1/compile", response_model=CompileResponse, openapi_extra=REQUEST_BODY,
             summary="Compile a subgraph (or answer from the cache)",
             responses=problem_responses(400, 413, 415, 422, 500, 503, 504))
async def compile_graph(request: Request) -> Response:
    service = get_service(request)
    body = await read_body(request, service.settings.max_body_bytes)
    return Response(await service.compile_request(body, client_of(request)),
                    media_type="application/json")
