"""Schemathesis generates requests from the service's own OpenAPI schema (valid ones and,
in negative mode, invalid ones) against a real `polyc serve` on loopback, with a bounded
number of examples per operation and mode, and checks that none is answered with a 5xx
and that every answer conforms to the schema (status codes, content types, bodies).

The fuzzing runs once, in a module fixture that every test here asks for, so each test
holds whatever runs before it (or alone: `-k exercised`)."""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance,
                                               response_schema_conformance,
                                               status_code_conformance)

from polyc.server.testing import ServerProcess

MAX_EXAMPLES = 30  # per operation and generation mode
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def server(tmp_path_factory, seeded_cache):
    tmp = tmp_path_factory.mktemp("fuzz")
    # a short time limit: a fuzzed graph that happens to be big must not stall the run
    with ServerProcess(f"sqlite:///{tmp}/c.sqlite3", workers=2, log_dir=tmp,
                       args=("--compile-timeout", "20"),
                       env={"POLYC_CACHE_DIR": seeded_cache(tmp)}) as s:
        yield s


@pytest.fixture(scope="module")
def fuzzed(server) -> dict[str, list[str]]:
    """Operation label -> the failures its generated requests found."""
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    found: dict[str, list[str]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        failures = found.setdefault(operation.label, [])
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            def call(case):
                case.call_and_validate(base_url=server.url, timeout=60, checks=CHECKS)

            try:
                call()
            except Unsatisfiable:  # no invalid request exists (GET /healthz has no inputs)
                assert mode == GenerationMode.NEGATIVE, operation.label
            except Exception as e:  # a failed check: keep it, fuzz the other operations
                failures.append(f"{mode.value}: {type(e).__name__}: {str(e)[:2000]}")
    return found


def test_no_input_produces_a_server_error(fuzzed):
    failed = {label: f for label, f in fuzzed.items() if f}
    assert not failed, failed


def test_the_fuzzed_server_logged_no_traceback(server, fuzzed):
    assert "Traceback" not in server.log, server.log[-5000:]


def test_every_operation_was_exercised(server, fuzzed):
    import httpx
    text = httpx.get(server.url + "/metrics").text
    for route in ("/v1/compile", "/v1/kernels/{key}", "/v1/kernels/{key}/source",
                  "/v1/kernels/{key}/schedule", "/healthz"):
        assert f'route="{route}"' in text, route
    print("\n".join(line for line in text.splitlines()
                    if line.startswith(("polyc_http_requests_total", "polyc_compiles_total"))))
