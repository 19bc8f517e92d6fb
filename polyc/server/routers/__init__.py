"""The HTTP routes, one router per concern: compiling, stored kernels, operations."""
from __future__ import annotations

from http import HTTPStatus

from fastapi import Request

from ..models import ProblemDetails
from ..problems import PROBLEM_JSON, ApiProblem


def get_service(request: Request):
    """The running CompileService (opened by the app's lifespan)."""
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise ApiProblem(503, "starting", "Service Unavailable", "the service is starting",
                         headers={"Retry-After": "1"})
    return service


def client_of(request: Request) -> str:
    """Who asked (its address): compiles and runs share the workers fairly by it."""
    return request.client.host if request.client is not None else ""


def problem_responses(*codes: int) -> dict:
    """OpenAPI entries for error statuses, each a problem+json body."""
    return {code: {"model": ProblemDetails, "description": HTTPStatus(code).phrase,
                   "content": {PROBLEM_JSON: {}}} for code in codes}
