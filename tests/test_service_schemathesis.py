"""Schemathesis generates requests from the service's own OpenAPI schema (valid ones and,
in negative mode, invalid ones) against a real `polyc serve` on loopback, with a bounded
number of examples per operation, and checks that none is answered with a 5xx and that
every answer conforms to the schema (status codes, content types, bodies)."""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance,
                                               response_schema_conformance,
                                               status_code_conformance)

from polyc.server.testing import ServerProcess

MAX_EXAMPLES = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    # a short time limit: a fuzzed graph that happens to be big must not stall the run
    with ServerProcess(f"sqlite:///{tmp}/c.sqlite3", workers=2, log_dir=tmp,
                       args=("--compile-timeout", "20"),
                       env={"POLYC_CACHE_DIR": str(tmp)}) as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_input_produces_a_server_error(case, server):
    case.call_and_validate(
        base_url=server.url, timeout=60,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                response_schema_conformance])


def test_the_fuzzed_server_logged_no_traceback(server):
    assert "Traceback" not in server.log, server.log[-5000:]


def test_every_operation_was_exercised(server):
    import httpx
    text = httpx.get(server.url + "/metrics").text
    for route in ("/v1/compile", "/v1/kernels/{key}", "/v1/kernels/{key}/source",
                  "/v1/kernels/{key}/schedule", "/healthz"):
        assert f'route="{route}"' in text, route
    print("\n".join(line for line in text.splitlines()
                    if line.startswith(("polyc_http_requests_total", "polyc_compiles_total"))))
