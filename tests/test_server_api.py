"""The HTTP API through FastAPI's test client: compile, hit, fetch, metrics, schema.

One app (two real compile workers, a SQLite cache in a temp dir) serves the module;
each test compiles its own small graph so that tests do not share cache entries.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import warnings

import pytest

from polyc.server import Settings, create_app

with warnings.catch_warnings():  # starlette's notice about its httpx dependency
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


def graph(name: str, shape=(4, 8), op: str = "exp") -> dict:
    return {"name": name, "inputs": [{"name": "x", "shape": list(shape), "dtype": "float32"}],
            "nodes": [{"op": op, "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}


def metric(client, name: str, **labels) -> float:
    text = client.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = "^" + re.escape(name + ("{" + want + "}" if labels else "")) + r" (\S+)$"
    m = re.search(pattern, text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    app = create_app(Settings(cache_url=f"sqlite:///{tmp}/cache.sqlite3", workers=2))
    with TestClient(app) as c:
        yield c


def test_compile_then_hit(client):
    r = client.post("/v1/compile", json={"graph": graph("first")})
    assert r.status_code == 200, r.text
    a = r.json()
    assert re.fullmatch(r"[0-9a-f]{64}", a["key"])
    assert a["cache_hit"] is False and a["coalesced"] is False
    assert "void polyc_k0" in a["c_source"] and "expf(" in a["c_source"]
    assert a["target"] == "cpu" and a["options"]["parallel"] is True
    k = a["kernels"][0]
    assert k["schedule_tree"]["kind"] == "domain" and isinstance(k["fusion_report"], list)
    assert {"schedule", "codegen", "build"} <= set(a["timings"])
    b = client.post("/v1/compile", json={"graph": graph("first")}).json()
    assert b["cache_hit"] is True
    assert (b["key"], b["c_source"], b["kernels"]) == (a["key"], a["c_source"], a["kernels"])


def test_fetch_stored_result(client):
    a = client.post("/v1/compile", json={"graph": graph("fetch", (3, 5))}).json()
    key = a["key"]
    rec = client.get(f"/v1/kernels/{key}")
    assert rec.status_code == 200 and rec.headers["content-type"] == "application/json"
    rec = rec.json()
    assert rec["key"] == key and rec["c_source"] == a["c_source"]
    assert rec["graph"]["inputs"] == [{"name": "x", "shape": [3, 5], "dtype": "float32"}]
    assert rec["kernels"][0]["schedule_text"] and rec["kernels"][0]["statements"]
    assert {p["name"] for p in rec["parts"]} == {"record.json", "kernels.c", "kernels.so"}
    assert rec["toolchain"]["cc"] and rec["created"] > 0

    src = client.get(f"/v1/kernels/{key}/source")
    assert src.headers["content-type"].startswith("text/x-c")
    assert src.text == a["c_source"]

    trees = client.get(f"/v1/kernels/{key}/schedule").json()
    assert trees["key"] == key
    assert trees["kernels"][0]["schedule_tree"] == a["kernels"][0]["schedule_tree"]
    after = trees["kernels"][0]["trees"]
    assert list(after)[0] == "schedule" and after["schedule"]["kind"] == "domain"
    assert list(after)[-1] == "lower-cpu"

    obj = client.get(f"/v1/kernels/{key}/object").content
    assert obj.startswith(b"\x7fELF")
    so_part = next(p for p in rec["parts"] if p["name"] == "kernels.so")
    assert hashlib.sha256(obj).hexdigest() == so_part["sha256"]


def test_unknown_key_is_404_problem(client):
    for suffix in ("", "/source", "/schedule", "/object"):
        r = client.get(f"/v1/kernels/{'0' * 64}{suffix}")
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"].endswith("unknown-key") and "0" * 64 in r.json()["detail"]


def _counters(client) -> dict[str, float]:
    return {
        "hits": metric(client, "polyc_cache_hits_total"),
        "misses": metric(client, "polyc_cache_misses_total"),
        "ok": metric(client, "polyc_compiles_total", outcome="ok"),
        "seconds": metric(client, "polyc_compile_seconds_count"),
        "posts": metric(client, "polyc_http_requests_total", method="POST",
                        route="/v1/compile", status="200"),
        "bad": metric(client, "polyc_http_requests_total", method="POST",
                      route="/v1/compile", status="422"),
    }


def test_metrics_count_requests_hits_misses_and_compiles(client):
    before = _counters(client)
    for _ in range(3):
        assert client.post("/v1/compile", json={"graph": graph("metrics")}).status_code == 200
    assert client.post("/v1/compile", json={"graph": {}}).status_code == 422
    after = _counters(client)
    assert {k: after[k] - before[k] for k in before} == {
        "hits": 2, "misses": 1, "ok": 1, "seconds": 1, "posts": 3, "bad": 1}
    text = client.get("/metrics").text
    assert "# TYPE polyc_compile_seconds histogram" in text
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")


def test_spelling_of_the_json_does_not_change_the_key(client):
    g = graph("spelling")
    g["constants"] = [{"name": "c", "shape": [8], "dtype": "float32", "data": [1] * 8}]
    g["nodes"] = [{"op": "add", "inputs": ["x", "c"], "outputs": ["y"]}]
    first = client.post("/v1/compile", json={"graph": g}).json()
    text = json.dumps({"options": {}, "target": "cpu", "graph": g}, indent=4, sort_keys=True)
    text = text.replace(" 1,", " 1.0,").replace(" 1\n", " 1e0\n")
    assert "1e0" in text and "1.0," in text
    r = client.post("/v1/compile", content=text.encode(),
                    headers={"content-type": "application/json; charset=utf-8"})
    assert r.json()["key"] == first["key"] and r.json()["cache_hit"] is True


def test_options_and_target_are_part_of_the_key(client):
    a = client.post("/v1/compile", json={"graph": graph("opts")}).json()
    b = client.post("/v1/compile", json={"graph": graph("opts"),
                                         "options": {"parallel": False}}).json()
    assert a["key"] != b["key"] and b["cache_hit"] is False
    assert b["options"]["parallel"] is False and "omp parallel" not in b["c_source"]
    c = client.post("/v1/compile", json={"graph": graph("opts"), "target": "cpu",
                                         "options": {"parallel": True}}).json()
    assert c["key"] == a["key"] and c["cache_hit"] is True


def test_identical_concurrent_requests_compile_once(client):
    before = metric(client, "polyc_compiles_total", outcome="ok")
    body = {"graph": graph("concurrent", (6, 6), "tanh")}
    results = []

    def post():
        results.append(client.post("/v1/compile", json=body))

    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 6
    answers = [r.json() for r in results]
    assert len({a["key"] for a in answers}) == 1
    assert sum(not a["cache_hit"] and not a["coalesced"] for a in answers) == 1
    assert metric(client, "polyc_compiles_total", outcome="ok") - before == 1


def test_a_budget_that_runs_out_is_a_200_with_the_fallback_noted_and_cached(client):
    # isl's scheduler cannot answer within 100 operations: the kernel takes the original
    # order; the result is right (the run checks it against the reference), cached under
    # this budget, and a bigger budget is another key compiled in full
    g = {"inputs": [{"name": "a", "shape": [8, 8]}, {"name": "b", "shape": [8, 8]}],
         "nodes": [{"op": "matmul", "inputs": ["a", "b"], "outputs": ["y"]}], "outputs": ["y"]}
    before = metric(client, "polyc_compile_fallbacks_total", stage="schedule")
    r = client.post("/v1/compile", json={"graph": g, "options": {"max_operations": 100}})
    assert r.status_code == 200, r.text
    (line,) = [f for f in r.json()["fallbacks"] if f.startswith("schedule fallback")]
    assert "max_operations (100)" in line and "original order" in line
    assert line in r.json()["kernels"][0]["fusion_report"]
    assert metric(client, "polyc_compile_fallbacks_total", stage="schedule") == before + 1
    run = client.post(f"/v1/kernels/{r.json()['key']}/run", json={"seed": 2}).json()
    assert all(o["ok"] for o in run["outputs"]), run
    again = client.post("/v1/compile", json={"graph": g, "options": {"max_operations": 100}})
    assert again.json()["cache_hit"] and again.json()["fallbacks"] == r.json()["fallbacks"]
    full = client.post("/v1/compile", json={"graph": g}).json()
    assert full["key"] != r.json()["key"] and full["fallbacks"] == []


def test_a_spent_fusion_budget_leaves_each_node_its_own_kernel(client):
    g = {"inputs": [{"name": "x", "shape": [4, 8]}],
         "nodes": [{"op": "softmax", "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}
    r = client.post("/v1/compile", json={"graph": g, "options": {"fuse_seconds": 0}})
    assert r.status_code == 200, r.text
    assert len(r.json()["kernels"]) > 1
    assert any(f.startswith("fusion fallback: the fuse budget of 0 s") for f in r.json()["fallbacks"])
    run = client.post(f"/v1/kernels/{r.json()['key']}/run", json={"seed": 1}).json()
    assert all(o["ok"] for o in run["outputs"]), run


@pytest.mark.parametrize("options, field, says", [
    ({"threads": 10**6}, "threads", "less than or equal to 1024"),
    ({"microkernel_isa": "sse9"}, "microkernel_isa", "must be one of"),
    ({"microkernel_tiles": [["kc", 0]]}, "microkernel_tiles", "a size 1 to"),
    ({"microkernel_tiles": [["zz", 8]]}, "microkernel_tiles", "pairs of 'mc', 'nc' or 'kc'"),
    ({"tile_sizes": [32, -1]}, "tile_sizes", "sizes must be 1 to"),
    ({"winograd_tile": 3}, "winograd_tile", "must be 0 (the plan chooses) or one of 2, 4"),
])
def test_option_values_polyc_cannot_use_are_422_naming_the_option(client, options, field, says):
    g = {"inputs": [{"name": "a", "shape": [8, 8]}],
         "nodes": [{"op": "relu", "inputs": ["a"], "outputs": ["y"]}], "outputs": ["y"]}
    r = client.post("/v1/compile", json={"graph": g, "options": options})
    assert r.status_code == 422, r.text
    p = r.json()
    assert p["errors"][0]["pointer"] == f"/options/{field}" and says in p["detail"], p


def test_tuple_options_arrive_as_arrays(client):
    g = {"inputs": [{"name": "a", "shape": [128, 128]}, {"name": "b", "shape": [128, 128]}],
         "nodes": [{"op": "matmul", "inputs": ["a", "b"], "outputs": ["y"]}], "outputs": ["y"]}
    # the portable kernel (6 x 16) runs on every host: mc 48 is a whole number of its tiles
    r = client.post("/v1/compile", json={"graph": g, "options": {
        "microkernel_tiles": [["kc", 32], ["mc", 48]], "threads": 1,
        "gemm_kernel": "sgemm_vec_6x16"}})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["options"]["microkernel_tiles"] == [["kc", 32], ["mc", 48]]
    assert "mc=48 nc=128 kc=32" in a["c_source"]
    assert "omp parallel" not in a["c_source"]  # a team of one is no team
    two = client.post("/v1/compile", json={"graph": g, "options": {"threads": 2}}).json()
    assert "omp parallel num_threads(2)" in two["c_source"]


def test_a_convolution_by_winograd_or_not_is_the_caller_s_choice(client):
    """The service says which algorithm a 3x3 convolution ran (its kernel's report, its
    C) and takes `winograd: false` for the direct one."""
    g = {"inputs": [{"name": "x", "shape": [1, 32, 28, 28]}, {"name": "w", "shape": [32, 32, 3, 3]}],
         "nodes": [{"op": "conv2d", "inputs": ["x", "w"], "outputs": ["y"],
                    "attrs": {"pads": [1, 1, 1, 1]}}], "outputs": ["y"]}
    for winograd in (True, False):
        r = client.post("/v1/compile", json={"graph": g, "options": {"threads": 1,
                                                                     "winograd": winograd}})
        assert r.status_code == 200, r.text
        [kernel] = r.json()["kernels"]
        said = any("by Winograd's F(2x2, 3x3)" in line for line in kernel["fusion_report"])
        assert said == winograd == ("polyc_winograd_f2x3_input(" in r.json()["c_source"])
    schema = client.get("/openapi.json").json()["components"]["schemas"]["CompileOptions"]
    assert "Winograd" in schema["properties"]["winograd"]["description"]
    assert "F(4x4, 3x3)" in schema["properties"]["winograd_tile"]["description"]


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_openapi_schema_describes_every_model(client):
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    for name in ("CompileRequest", "CompileOptions", "CompileResponse", "KernelSummary",
                 "KernelRecord", "KernelDetail", "ScheduleTrees", "Health", "ProblemDetails"):
        assert name in components, name
    post = schema["paths"]["/v1/compile"]["post"]
    body_schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert body_schema == {"$ref": "#/components/schemas/CompileRequest"}
    assert components["CompileRequest"]["properties"]["graph"]["required"] == [
        "inputs", "nodes", "outputs"]
    ok = post["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/CompileResponse"}
    for status in ("400", "413", "415", "422", "503", "504"):
        content = post["responses"][status]["content"]
        assert set(content) == {"application/problem+json"}, status
    assert "HTTPValidationError" not in components  # FastAPI's default 422 is replaced
    paths = set(schema["paths"])
    assert {"/v1/compile", "/v1/kernels/{key}", "/v1/kernels/{key}/source",
            "/v1/kernels/{key}/schedule", "/healthz", "/metrics"} <= paths


def test_queue_full_is_503_with_retry_after(tmp_path):
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1,
                              queue_size=0))
    with TestClient(app) as c:
        pool = app.state.service.pool
        first = []
        t = threading.Thread(target=lambda: first.append(
            c.post("/v1/compile", json={"graph": graph("busy", (16, 16), "sigmoid")})))
        t.start()
        deadline = time.monotonic() + 10
        while not pool.busy_pids() and time.monotonic() < deadline:
            time.sleep(0.002)
        r = c.post("/v1/compile", json={"graph": graph("turned-away")})
        health = c.get("/healthz")  # liveness does not wait for the queue
        t.join()
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["type"].endswith("queue-full")
        assert health.status_code == 200
        assert first[0].status_code == 200
        # a hit never needs a worker, so it is served even when the queue is full
        assert c.post("/v1/compile", json={"graph": graph("busy", (16, 16), "sigmoid")}
                      ).json()["cache_hit"] is True


def test_dropped_nodes_are_noted_per_request_and_do_not_change_the_key(client):
    lean = graph("dead", (5, 5))
    fat = graph("dead", (5, 5))
    fat["nodes"] = fat["nodes"] + [{"op": "neg", "inputs": ["x"], "outputs": ["unused"]}]
    a = client.post("/v1/compile", json={"graph": fat}).json()
    assert any("'unused'" in n and "dropped" in n for n in a["notes"])
    b = client.post("/v1/compile", json={"graph": lean}).json()
    assert b["key"] == a["key"] and b["cache_hit"] is True and b["notes"] == []
    c = client.post("/v1/compile", json={"graph": fat}).json()
    assert c["cache_hit"] is True and c["notes"] == a["notes"]
