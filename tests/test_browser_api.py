"""The browser view's server side through FastAPI's test client: the page and its
assets with their security headers, the edit options (per-kernel tiles, forced and
forbidden fusions) re-checked with isl, and running a stored result against the
reference."""
from __future__ import annotations

import warnings

import pytest

from polyc.server import Settings, create_app

with warnings.catch_warnings():  # starlette's notice about its httpx dependency
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

# y = transpose(relu(x @ w)): the transpose reads y across rows, so no loop of relu's
# can be shared with it (the dependence y -> z would reverse), and with K = 8 it is too
# much of the work to run in sequence after it (oracle.SMALL_SHARE)
GRAPH = {"name": "mm_t", "inputs": [{"name": "x", "shape": [24, 8]},
                                    {"name": "w", "shape": [8, 40]}],
         "nodes": [{"op": "matmul", "inputs": ["x", "w"], "outputs": ["h"]},
                   {"op": "relu", "inputs": ["h"], "outputs": ["y"]},
                   {"op": "transpose", "inputs": ["y"], "outputs": ["z"]}],
         "outputs": ["z"]}
SOFTMAX = {"name": "sm", "inputs": [{"name": "x", "shape": [16, 48]}],
           "nodes": [{"op": "softmax", "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    app = create_app(Settings(cache_url=f"sqlite:///{tmp}/cache.sqlite3", workers=1))
    with TestClient(app) as c:
        yield c


def compile_(client, graph=GRAPH, **options):
    return client.post("/v1/compile", json={"graph": graph, "options": options})


def test_page_and_assets_carry_a_strict_csp(client):
    for path in ("/", "/k/" + "0" * 64, "/static/app.js", "/static/style.css"):
        r = client.get(path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    page = client.get("/").text
    # no inline script: every <script> has a src
    assert "<script" in page and all("src=" in s.split(">")[0]
                                     for s in page.split("<script")[1:])
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/nope.js").status_code == 404
    assert client.get("/static/..%2Fapp.py").status_code in (404, 422)
    assert client.get("/k/not-a-key").status_code == 422


def test_the_record_carries_provenance(client):
    key = compile_(client, SOFTMAX).json()["key"]
    rec = client.get(f"/v1/kernels/{key}").json()
    prov = rec["kernels"][0]["provenance"]
    assert {p["node"] for p in prov} == set(rec["kernels"][0]["nodes"])
    s1 = next(p for p in prov if p["statement"] == "S1")
    assert s1["origin"] == "softmax 'y'" and "x" in s1["reads"]


def test_legal_tile_edit_recompiles_with_the_sizes(client):
    base = compile_(client).json()
    names = [k["name"] for k in base["kernels"]]
    transpose = next(n for n in names if n.endswith("_z"))
    r = compile_(client, kernel_tile_sizes=[[transpose, [8, 16]]])
    assert r.status_code == 200, r.text
    edited = r.json()
    assert edited["key"] != base["key"]
    rec = client.get(f"/v1/kernels/{edited['key']}").json()
    kernel = next(k for k in rec["kernels"] if k["name"] == transpose)
    assert "tile" in kernel["trees"]
    tiled = str(kernel["trees"]["tile"])
    assert "mod 8" in tiled and "mod 16" in tiled  # isl's point loops of 8 x 16 tiles
    # the same edit again is a cache hit: edits are reproducible requests
    assert compile_(client, kernel_tile_sizes=[[transpose, [8, 16]]]).json()["cache_hit"] is True


def test_tile_edit_of_a_microkernel_band_is_refused_with_the_reason(client):
    names = [k["name"] for k in compile_(client).json()["kernels"]]
    r = compile_(client, kernel_tile_sizes=[[names[0], [8, 8]]])
    assert r.status_code == 422
    body = r.json()
    assert body["type"].endswith("illegal-edit")
    assert body["errors"][0]["pointer"] == "/options/kernel_tile_sizes/0"
    assert "not permutable" in body["detail"]


def test_unknown_kernel_and_bad_sizes_name_the_field(client):
    r = compile_(client, kernel_tile_sizes=[["polyc_k9_nope", [8, 8]]])
    assert r.status_code == 422 and "no kernel is named 'polyc_k9_nope'" in r.json()["detail"]
    assert r.json()["errors"][0]["pointer"] == "/options/kernel_tile_sizes/0"
    r = compile_(client, kernel_tile_sizes=[["k", [0]]])
    assert r.status_code == 422 and "/options/kernel_tile_sizes" in r.json()["detail"]
    r = compile_(client, kernel_tile_sizes=[["k", "8"]])
    assert r.status_code == 422 and "/options/kernel_tile_sizes/0" in r.json()["detail"]
    r = client.post("/v1/compile", json={"graph": GRAPH, "target": "npu", "options": {
        "kernel_tile_sizes": [["polyc_k0_h", [8, 8]]]}})
    assert r.status_code == 422 and "does not apply to target 'npu'" in r.json()["detail"]


def test_illegal_forced_fusion_names_the_dependence(client):
    r = compile_(client, fuse_force=[["y", "z"]])
    assert r.status_code == 422
    body = r.json()
    assert body["type"].endswith("illegal-edit")
    assert body["errors"][0]["pointer"] == "/options/fuse_force/0"
    assert "fusing z into y is illegal" in body["detail"]
    assert "would reverse the flow dependence" in body["detail"] and "(y -> z)" in body["detail"]


def test_forbidden_fusion_splits_the_kernel_and_says_why(client):
    base = compile_(client).json()
    fused = next(k for k in base["kernels"] if "y" in k["nodes"])
    assert "h" in fused["nodes"]
    r = compile_(client, fuse_forbid=[["h", "y"]])
    assert r.status_code == 200, r.text
    kernels = r.json()["kernels"]
    assert len(kernels) == len(base["kernels"]) + 1
    lines = [line for k in kernels for line in k["fusion_report"]]
    assert any("rejected: forbidden by options.fuse_forbid" in line for line in lines)


def test_forced_fusion_overrides_cost_but_not_legality(client):
    # the oracle keeps z apart from {h, y} for the microkernel; forcing y with h is a
    # no-op (already fused) and a node that does not exist is named
    r = compile_(client, fuse_force=[["h", "y"]])
    assert r.status_code == 200
    r = compile_(client, fuse_force=[["h", "q"]])
    assert r.status_code == 422 and "no primitive node is named 'q'" in r.json()["detail"]
    r = compile_(client, fuse_force=[["h", "h"]])
    assert r.status_code == 422 and "/options/fuse_force" in r.json()["detail"]


def test_forced_fusion_merges_what_the_oracle_refused(client):
    # the oracle keeps the matmul on its microkernel, apart from the row max after it;
    # forced, the pair shares the rows' loops (legal), and the result still checks
    g = {"name": "mm_max", "inputs": [{"name": "x", "shape": [64, 128]},
                                      {"name": "w", "shape": [128, 128]}],
         "nodes": [{"op": "matmul", "inputs": ["x", "w"], "outputs": ["h"]},
                   {"op": "reduce_max", "inputs": ["h"], "outputs": ["m"],
                    "attrs": {"axes": [1]}}],
         "outputs": ["m"]}
    assert len(compile_(client, g).json()["kernels"]) == 2
    r = compile_(client, g, fuse_force=[["h", "m"]])
    assert r.status_code == 200, r.text
    (kernel,) = r.json()["kernels"]
    assert kernel["fusion_report"][0].startswith("forced by options.fuse_force: fused m into h")
    run = client.post(f"/v1/kernels/{r.json()['key']}/run", json={"seed": 1}).json()
    assert run["outputs"][0]["ok"] is True


def test_run_checks_against_the_reference(client):
    key = compile_(client, SOFTMAX).json()["key"]
    r = client.post(f"/v1/kernels/{key}/run", json={"seed": 3, "repeat": 2})
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["seed"] == 3 and run["profile"] is None
    (out,) = run["outputs"]
    assert out["name"] == "y" and out["ok"] is True and out["max_abs_err"] < 1e-5
    assert all(k["seconds"] > 0 for k in run["kernels"])


def test_runs_share_the_workers_by_client_like_compiles(client, monkeypatch):
    pool = client.app.state.service.pool
    seen, run = [], pool.run

    async def spy(job, *, timeout_s, client=""):
        seen.append((job.get("kind", "compile"), client))
        return await run(job, timeout_s=timeout_s, client=client)
    monkeypatch.setattr(pool, "run", spy)
    key = compile_(client, SOFTMAX, threads=1).json()["key"]
    assert client.post(f"/v1/kernels/{key}/run", json={}).status_code == 200
    assert ("run", "testclient") in seen and all(who == "testclient" for _, who in seen)


def test_run_on_a_simulated_target_returns_its_profile(client):
    r = client.post("/v1/compile", json={"graph": SOFTMAX, "target": "manycore"})
    assert r.status_code == 200, r.text
    run = client.post(f"/v1/kernels/{r.json()['key']}/run", json={}).json()
    assert run["outputs"][0]["ok"] is True
    assert run["profile"]["cycles"] > 0 and run["kernels"][0]["profile"]["cycles"] > 0


def test_run_bad_input_names_the_field(client):
    key = compile_(client, SOFTMAX).json()["key"]
    r = client.post(f"/v1/kernels/{key}/run", json={"seed": -1})
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/seed"
    r = client.post(f"/v1/kernels/{key}/run", json={"seed": "1"})
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/seed"
    r = client.post(f"/v1/kernels/{key}/run", json={"speed": 1})
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/speed"
    r = client.post(f"/v1/kernels/{key}/run", content=b"[1,",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = client.post("/v1/kernels/" + "0" * 64 + "/run", json={})
    assert r.status_code == 404


def test_each_kernel_carries_its_stage_times(client):
    key = compile_(client, SOFTMAX).json()["key"]
    rec = client.get(f"/v1/kernels/{key}").json()
    whole = rec["timings"]
    for k in rec["kernels"]:
        assert {"schedule", "codegen"} <= set(k["timings"]), k["timings"]
        assert all(s >= 0 for s in k["timings"].values())
    # a kernel's stages are its share of the whole graph's: summed over the kernels,
    # each kernel stage is the graph's figure for it (the graph stages are nobody's)
    for stage in {s for k in rec["kernels"] for s in k["timings"]}:
        assert sum(k["timings"].get(stage, 0) for k in rec["kernels"]) == pytest.approx(whole[stage])
    assert "fuse" in whole and all("fuse" not in k["timings"] for k in rec["kernels"])


def test_microkernels_lists_the_registry_for_a_target(client):
    cpu = client.get("/v1/microkernels", params={"target": "cpu"}).json()
    by_name = {m["name"]: m for m in cpu}
    # the portable kernel needs nothing: every host offers it
    assert by_name["sgemm_vec_6x16"]["offered"] is True and by_name["sgemm_vec_6x16"]["isa"] == "portable"
    assert "mc_sgemm_64x64x32" not in by_name and by_name["row_sum_f32"]["kind"] == "row_sum"
    portable = {m["name"]: m for m in client.get(
        "/v1/microkernels", params={"target": "cpu", "isa": "portable"}).json()}
    assert portable["sgemm_avx2_6x16"]["offered"] is False
    assert portable["sgemm_vec_6x16"]["offered"] and portable["row_sum_f32"]["offered"]
    (mc,) = client.get("/v1/microkernels", params={"target": "manycore"}).json()
    assert mc["name"] == "mc_sgemm_64x64x32" and mc["offered"] and mc["tile"] == [64, 64]
    r = client.get("/v1/microkernels", params={"target": "gpu"})
    assert r.status_code == 422 and "unknown target 'gpu'" in r.json()["detail"]
    r = client.get("/v1/microkernels", params={"isa": "sse"})
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/isa"


def test_picking_another_microkernel_recompiles_and_checks(client):
    r = compile_(client, gemm_kernel="sgemm_vec_6x16")
    assert r.status_code == 200, r.text
    rec = client.get(f"/v1/kernels/{r.json()['key']}").json()
    assert any(k["microkernels"] == ["sgemm_vec_6x16"] for k in rec["kernels"])
    assert "polyc_sgemm_vec_6x16(" in rec["c_source"]
    run = client.post(f"/v1/kernels/{r.json()['key']}/run", json={"seed": 2}).json()
    assert run["outputs"][0]["ok"] is True
    assert compile_(client, gemm_kernel="sgemm_vec_6x16").json()["cache_hit"] is True
    # a kernel the registry has but the target does not offer: the reason, and what it offers
    r = compile_(client, microkernel_isa="portable", gemm_kernel="sgemm_avx2_6x16")
    assert r.status_code == 422
    assert "sgemm_avx2_6x16 needs avx2, fma" in r.json()["detail"]
    assert "offers sgemm_vec_6x16" in r.json()["detail"]
    r = compile_(client, gemm_kernel="sgemm_nope")
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/options/gemm_kernel"
    assert "must be one of" in r.json()["detail"]


@pytest.mark.parametrize("target, level", [("manycore", "LDM"), ("npu", "UB")])
def test_chip_kernels_record_their_promoted_buffers(client, target, level):
    r = client.post("/v1/compile", json={"graph": GRAPH, "target": target})
    assert r.status_code == 200, r.text
    rec = client.get(f"/v1/kernels/{r.json()['key']}").json()
    promoted = [p for k in rec["kernels"] for p in k["promoted"]]
    assert any(p["level"] == level for p in promoted), promoted
    for k in rec["kernels"]:
        tree = str(k["schedule_tree"])
        for p in k["promoted"]:
            size = 1
            for n in p["shape"]:
                size *= n
            assert p["bytes"] == size * 4  # float32
            # its copies are statements of the final tree, where the page finds them
            assert f"copy_in_{p['buffer']}[" in tree or f"copy_out_{p['buffer']}[" in tree


def test_a_chip_kernels_step_buffers_name_the_statements_they_serve(client):
    # a max over axes 0-2 and x minus it, forced into one kernel: both passes read x in
    # steps, each through a buffer of its own (test_scratchpad.py)
    graph = {"inputs": [{"name": "x", "shape": [40, 60, 70, 48]}],
             "nodes": [{"op": "reduce_max", "inputs": ["x"], "outputs": ["m"],
                        "attrs": {"axes": [0, 1, 2], "keepdims": True}},
                       {"op": "sub", "inputs": ["x", "m"], "outputs": ["y"]}],
             "outputs": ["y"]}
    r = client.post("/v1/compile", json={"graph": graph, "target": "manycore",
                                         "options": {"fuse_force": [["m", "y"]]}})
    assert r.status_code == 200, r.text
    (kernel,) = client.get(f"/v1/kernels/{r.json()['key']}").json()["kernels"]
    x = [p for p in kernel["promoted"] if p["array"] == "t0_x"]
    assert sorted(p["statements"] for p in x) == [["S0"], ["S1"]]
    assert all("step" in p["at"] for p in x)
