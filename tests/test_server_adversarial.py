"""Hostile and broken requests: each gets the right 4xx as problem+json with a message
that says what is wrong (and, for fields, a JSON pointer to it), never a 5xx, never an
echo of the input. Names meant to inject C are not errors (any string is a valid name)
and must come out harmless in the generated code.
"""
from __future__ import annotations

import asyncio
import json
import re
import warnings

import pytest

from polyc.server import Settings, create_app
from polyc.server.service import CompileService

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

MAX_BODY = 1 << 20  # a small limit, so the oversized bodies stay cheap


def g(nodes=None, inputs=None, outputs=("y",), **extra) -> dict:
    doc = {"name": "adv",
           "inputs": inputs if inputs is not None else [{"name": "x", "shape": [4, 4]}],
           "nodes": nodes if nodes is not None else [
               {"op": "exp", "inputs": ["x"], "outputs": ["y"]}],
           "outputs": list(outputs)}
    doc.update(extra)
    return doc


def body(graph=None, **fields) -> bytes:
    return json.dumps({"graph": graph if graph is not None else g(), **fields}).encode()


def nested(depth: int) -> bytes:
    return b'{"graph": ' + b"[" * depth + b"]" * depth + b"}"


JSON = {"content-type": "application/json"}

# (id, method, path, raw body, headers, status, words in the detail, pointer or None)
CASES = [
    ("malformed-json", "POST", "/v1/compile", b'{"graph": {', JSON, 400, "invalid JSON", None),
    ("trailing-garbage", "POST", "/v1/compile", body() + b"}", JSON, 400, "after document", None),
    ("empty-body", "POST", "/v1/compile", b"", JSON, 400, "empty", None),
    ("nan", "POST", "/v1/compile",
     body(g(constants=[{"name": "c", "shape": [1], "data": ["N"]}])).replace(b'"N"', b"NaN"),
     JSON, 400, "NaN", None),
    ("infinity", "POST", "/v1/compile", b'{"graph": {"name": Infinity}}', JSON, 400,
     "Infinity", None),
    ("overflowing-number", "POST", "/v1/compile", b'{"graph": {"x": 1e999}}', JSON, 400,
     "too large", None),
    ("not-utf8", "POST", "/v1/compile", b'{"graph": "\xff\xfe"}', JSON, 400, "UTF-8", None),
    ("lone-surrogate", "POST", "/v1/compile", b'{"graph": "\\ud800"}', JSON, 400,
     "invalid JSON", None),
    ("deep-nesting", "POST", "/v1/compile", nested(200_000), JSON, 400, "levels deep", None),
    ("moderate-nesting-in-attrs", "POST", "/v1/compile",
     body(g(nodes=[{"op": "exp", "inputs": ["x"], "outputs": ["y"],
                    "attrs": {"a": json.loads("[" * 80 + "]" * 80)}}])), JSON, 400,
     "levels deep", None),
    ("body-is-array", "POST", "/v1/compile", b"[1, 2]", JSON, 422, "not an array", ""),
    ("body-is-null", "POST", "/v1/compile", b"null", JSON, 422, "not null", ""),
    ("missing-graph", "POST", "/v1/compile", b'{"target": "cpu"}', JSON, 422, "required",
     "/graph"),
    ("graph-is-list", "POST", "/v1/compile", b'{"graph": []}', JSON, 422,
     "valid dictionary", "/graph"),
    ("unknown-request-field", "POST", "/v1/compile", body(priority=9), JSON, 422,
     "Extra inputs", "/priority"),
    ("unknown-target", "POST", "/v1/compile", body(target="gpu"), JSON, 422, "cpu",
     "/target"),
    ("option-wrong-type", "POST", "/v1/compile", body(options={"max_operations": "lots"}),
     JSON, 422, "integer", "/options/max_operations"),
    ("option-bool-as-int", "POST", "/v1/compile", body(options={"parallel": 1}), JSON, 422,
     "boolean", "/options/parallel"),
    ("option-negative", "POST", "/v1/compile", body(options={"max_operations": -5}), JSON,
     422, "greater than or equal to 1", "/options/max_operations"),
    ("unknown-option", "POST", "/v1/compile", body(options={"unroll": True}), JSON, 422,
     "Extra inputs", "/options/unroll"),
    ("empty-graph", "POST", "/v1/compile", body({}), JSON, 422, "missing required field",
     "/graph/inputs"),
    ("unknown-graph-field", "POST", "/v1/compile", body(g(version=2)), JSON, 422,
     "unknown field", "/graph/version"),
    ("huge-shape", "POST", "/v1/compile",
     body(g(inputs=[{"name": "x", "shape": [1 << 31, 1 << 31]}])), JSON, 422,
     "over the limit", "/graph/inputs/0/shape"),
    ("huge-broadcast", "POST", "/v1/compile",
     body(g(nodes=[{"op": "broadcast_to", "inputs": ["x"], "outputs": ["y"],
                    "attrs": {"shape": [1 << 20, 1 << 20, 4, 4]}}])), JSON, 422,
     "over the limit", "/graph/nodes/0/shape"),
    ("high-rank", "POST", "/v1/compile", body(g(inputs=[{"name": "x", "shape": [1] * 40}])),
     JSON, 422, "rank 40", "/graph/inputs/0/shape"),
    ("zero-dim", "POST", "/v1/compile", body(g(inputs=[{"name": "x", "shape": [4, 0]}])),
     JSON, 422, "integer >= 1", "/graph/inputs/0/shape"),
    ("string-dim", "POST", "/v1/compile", body(g(inputs=[{"name": "x", "shape": ["4"]}])),
     JSON, 422, "integer >= 1", "/graph/inputs/0/shape"),
    ("bool-dim", "POST", "/v1/compile", body(g(inputs=[{"name": "x", "shape": [True]}])),
     JSON, 422, "integer >= 1", "/graph/inputs/0/shape"),
    ("bad-dtype", "POST", "/v1/compile",
     body(g(inputs=[{"name": "x", "shape": [4], "dtype": "uint8"}])), JSON, 422,
     "unknown dtype", "/graph/inputs/0/dtype"),
    ("cycle", "POST", "/v1/compile",
     body(g(nodes=[{"op": "exp", "inputs": ["b"], "outputs": ["a"]},
                   {"op": "exp", "inputs": ["a"], "outputs": ["b"]},
                   {"op": "exp", "inputs": ["x"], "outputs": ["y"]}])), JSON, 422,
     "cycle", "/graph/nodes/0/inputs"),
    ("unknown-op", "POST", "/v1/compile",
     body(g(nodes=[{"op": "softmaxx", "inputs": ["x"], "outputs": ["y"]}])), JSON, 422,
     "did you mean 'softmax'", "/graph/nodes/0/op"),
    ("undefined-input", "POST", "/v1/compile",
     body(g(nodes=[{"op": "exp", "inputs": ["z"], "outputs": ["y"]}])), JSON, 422,
     "'z' is not a graph input", "/graph/nodes/0/inputs"),
    ("output-never-produced", "POST", "/v1/compile", body(g(outputs=["nope"])), JSON, 422,
     "never produced", "/graph/outputs"),
    ("duplicate-tensor", "POST", "/v1/compile",
     body(g(inputs=[{"name": "x", "shape": [4]}, {"name": "x", "shape": [4]}])), JSON, 422,
     "duplicate tensor name", "/graph/inputs/0/name"),
    ("two-outputs-per-node", "POST", "/v1/compile",
     body(g(nodes=[{"op": "exp", "inputs": ["x"], "outputs": ["y", "z"]}])), JSON, 422,
     "exactly one output", "/graph/nodes/0/outputs"),
    ("shape-mismatch", "POST", "/v1/compile",
     body(g(inputs=[{"name": "x", "shape": [4, 3]}, {"name": "w", "shape": [5, 2]}],
            nodes=[{"op": "matmul", "inputs": ["x", "w"], "outputs": ["y"]}])), JSON, 422,
     "matmul", "/graph/nodes/0/inputs"),
    ("attr-wrong-type", "POST", "/v1/compile",
     body(g(nodes=[{"op": "softmax", "inputs": ["x"], "outputs": ["y"],
                    "attrs": {"axis": "last"}}])), JSON, 422, "expected an integer",
     "/graph/nodes/0/attrs/axis"),
    ("constant-data-length", "POST", "/v1/compile",
     body(g(constants=[{"name": "c", "shape": [3], "data": [1, 2]}])), JSON, 422,
     "needs 3", "/graph/constants/0/data"),
    ("constant-data-string", "POST", "/v1/compile",
     body(g(constants=[{"name": "c", "shape": [1], "data": ["1"]}])), JSON, 422,
     "finite number", "/graph/constants/0/data"),
    ("int32-out-of-range", "POST", "/v1/compile",
     body(g(constants=[{"name": "c", "shape": [1], "dtype": "int32", "data": [1 << 40]}])),
     JSON, 422, "int32", "/graph/constants/0/data"),
    ("transcendental-on-int32", "POST", "/v1/compile",
     body(g(inputs=[{"name": "x", "shape": [4], "dtype": "int32"}])), JSON, 422,
     "not defined on int32", "/graph/nodes/0/inputs"),
    ("name-too-long", "POST", "/v1/compile",
     body(g(inputs=[{"name": "x" * 5000, "shape": [4]}],
            nodes=[{"op": "exp", "inputs": ["x" * 5000], "outputs": ["y"]}])), JSON, 422,
     "non-empty string", "/graph/inputs/0/name"),
    ("too-many-nodes", "POST", "/v1/compile",
     body(g(nodes=[{"op": "exp", "inputs": ["x"], "outputs": [f"t{i}"]}
                   for i in range(10_001)])), JSON, 422, "exceed the limit", "/graph/nodes"),
    ("oversized-body", "POST", "/v1/compile", b'{"graph": "' + b"a" * (MAX_BODY + 10) + b'"}',
     JSON, 413, "over the limit", None),
    ("wrong-content-type", "POST", "/v1/compile", body(), {"content-type": "text/plain"}, 415,
     "application/json", None),
    ("form-encoded", "POST", "/v1/compile", b"graph=1",
     {"content-type": "application/x-www-form-urlencoded"}, 415, "application/json", None),
    ("multipart", "POST", "/v1/compile", b"--b\r\n\r\n--b--",
     {"content-type": "multipart/form-data; boundary=b"}, 415, "application/json", None),
    ("bad-key", "GET", "/v1/kernels/../../etc/passwd", b"", {}, 404, "no route", None),
    ("malformed-key", "GET", "/v1/kernels/ABC", b"", {}, 422, "pattern", "/path/key"),
    ("unknown-key", "GET", "/v1/kernels/" + "f" * 64, b"", {}, 404, "no compiled result",
     None),
    ("wrong-method", "GET", "/v1/compile", b"", {}, 405, "Method Not Allowed", None),
    ("unknown-route", "POST", "/v1/compile/now", body(), JSON, 404, "no route", None),
]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adv")
    app = create_app(Settings(cache_url=f"sqlite:///{tmp}/c.sqlite3", workers=1,
                              max_body_bytes=MAX_BODY))
    with TestClient(app, raise_server_exceptions=True) as c:
        yield c


def test_there_are_at_least_30_cases():
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_a_useful_4xx(client, case):
    _, method, path, raw, headers, status, words, ptr = case
    r = client.request(method, path, content=raw or None, headers=headers)
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"] == "application/problem+json"
    p = r.json()
    assert p["status"] == status and p["type"].startswith("urn:polyc:problem:")
    assert p["title"] and p["instance"].startswith("/")
    messages = p["detail"] + " " + " ".join(e["message"] for e in p.get("errors") or [])
    assert words in messages, messages[:2000]
    if ptr is not None:
        assert ptr in [e["pointer"] for e in p["errors"]], p["errors"]
    assert len(r.content) < 64_000  # the input is not echoed back


def test_no_bad_request_failed_inside_a_compile_worker(client):
    # every refusal above happened before a worker was involved
    text = client.get("/metrics").text
    outcomes = [line for line in text.splitlines() if line.startswith("polyc_compiles_total{")]
    assert all('outcome="ok"' in line for line in outcomes), outcomes


INJECT = 'x"; system("rm -rf /"); /*'
INJECTIONS = {
    "graph-name": g(name="*/ int pwned; /*"),
    "tensor-name": g(inputs=[{"name": INJECT, "shape": [4, 4]}],
                     nodes=[{"op": "exp", "inputs": [INJECT], "outputs": ["y"]}]),
    "node-name": g(nodes=[{"op": "exp", "inputs": ["x"], "outputs": ["y"],
                           "name": "n */ #include <stdio.h>\n#define exp system /*"}]),
    "output-name": g(nodes=[{"op": "exp", "inputs": ["x"], "outputs": ["y\n#error boom"]}],
                     outputs=["y\n#error boom"]),
}


@pytest.mark.parametrize("name", INJECTIONS)
def test_names_meant_to_inject_c_come_out_harmless(client, name):
    r = client.post("/v1/compile", content=body(INJECTIONS[name]), headers=JSON)
    assert r.status_code == 200, r.text[:2000]  # it compiled: gcc saw no stray code
    src = r.json()["c_source"]
    # names may appear in comments (provenance), defused; never in code
    code = re.sub(r"/\*.*?\*/", "", src, flags=re.DOTALL)
    for payload in ("system(", "#error", "#define exp", "#include <stdio.h>", "pwned",
                    "rm -rf"):
        assert payload not in code, payload


def test_oversized_chunked_body_is_cut_off_while_streaming(client):
    # no Content-Length to refuse up front: the limit applies while reading
    def chunks():
        yield b'{"graph": "'
        for _ in range(40):
            yield b"a" * 65536  # 2.5 MiB in all, over the 1 MiB limit
        yield b'"}'

    r = client.post("/v1/compile", content=chunks(), headers=JSON)
    assert r.status_code == 413 and "over the limit" in r.json()["detail"]


def test_invalid_path_parameters_are_not_echoed(client):
    junk = "Z" * 5000
    r = client.get(f"/v1/kernels/{junk}")
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert len(r.content) < 1000 and "pattern" in r.json()["detail"]
    r = client.get(f"/{junk}")
    assert r.status_code == 404 and len(r.content) < 1000


def test_bodies_are_parsed_and_validated_off_the_event_loop(client, monkeypatch):
    """Validation of a large body takes long enough to hold /healthz back if it ran
    on the loop (the live hardening test replays that attack)."""
    on_loop: list[bool] = []
    prepare = CompileService.prepare

    def recording(self, raw):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return prepare(self, raw)

    monkeypatch.setattr(CompileService, "prepare", recording)
    r = client.post("/v1/compile", content=body(g(nodes=[
        {"op": "frobnicate", "inputs": ["x"], "outputs": ["y"]}])), headers=JSON)
    assert r.status_code == 422 and "frobnicate" in r.json()["detail"]
    assert on_loop == [False]
