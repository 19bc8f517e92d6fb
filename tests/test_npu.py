"""The NPU target end to end: compiled for the simulated AI core, run in the simulator,
compared with the numpy reference; contractions on the cube through L1 and L0 in fractal
layout, the epilogue and every other kernel on the vector unit over UB, every level's
capacity respected, the profile's figures.

(The differential, hypothesis and float16 tests run every graph on this target too; the
runtime itself is tested in test_npu_runtime.py.)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import polyc
from polyc import GraphBuilder, GraphError, Limits
from polyc.graph.reference import run_reference
from polyc.schedule_tree.promotion import layout_map
from polyc.schedule_tree.tree import schedule_to_text
from polyc.targets.npu.machine import npu_machine

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CAPACITY = {lv.name: lv.capacity for lv in npu_machine().levels if lv.name != "GM"}


def _inputs(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {t.name: rng.uniform(-1, 1, t.type.shape).astype(t.type.dtype) for t in graph.inputs}


def _check(graph, inputs=None, rtol=1e-4, atol=1e-4, **options):
    """Compile for the NPU, run once in the simulator, compare with the reference;
    every level's high-water mark within its capacity."""
    inputs = inputs or _inputs(graph)
    compiled = polyc.compile(graph, "npu", options=options or None)
    profile = compiled.profile(**inputs)
    want = run_reference(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(profile["outputs"][name].astype(np.float64),
                                   want[name].astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=name)
    assert all(profile["high_water"][lv] <= CAPACITY[lv] for lv in CAPACITY), profile["high_water"]
    return compiled, profile


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_every_example_runs_on_the_simulated_ai_core(path):
    graph = polyc.load_graph(json.loads(path.read_text()))
    if graph.symbols:  # the chip targets take static shapes only, and say so
        with pytest.raises(GraphError, match="target 'npu' does not compile symbolic"):
            polyc.compile(graph, "npu", build=False)
        return
    _, profile = _check(graph, atol=2e-3)
    assert profile["cycles"] > 0 and profile["transfers"] > 0
    assert set(profile["bytes"]) == {"gm->l1", "gm->ub", "l1->l0a", "l1->l0b", "l0c->ub",
                                     "ub->gm"}


@pytest.mark.parametrize("dtype,m,k,n", [("float16", 100, 70, 130), ("float32", 64, 200, 96),
                                         ("float16", 300, 520, 48)])
def test_contractions_run_on_the_cube_through_l1_and_l0_in_fractal_layout(dtype, m, k, n):
    b = GraphBuilder("mm")
    y = b.gelu(b.add(b.matmul(b.input("a", (m, k), dtype), b.input("w", (k, n), dtype)),
                     b.input("bias", (n,), dtype)), approximate="tanh")
    graph = b.build([b.relu(y, out="y")])
    tol = 2e-2 if dtype == "float16" else 2e-4
    compiled, profile = _check(graph, rtol=tol, atol=tol)
    (kernel,) = compiled.kernels
    assert kernel.microkernels == ["cube_16x16x16"]
    by_level = {}
    for p in kernel.promotions:
        by_level.setdefault(p.level, []).append(p)
    # both operands through L1 and L0, as fractal matrices; C in L0C; the epilogue in UB
    assert {p.array for p in by_level["L1"]} == {p.array for p in by_level["L0A"] + by_level["L0B"]}
    for p in by_level["L1"] + by_level["L0A"] + by_level["L0B"] + by_level["L0C"]:
        assert p.layout == "fractal 16" and p.extents[-2:] == (16, 16)
        assert layout_map(p).is_single_valued()
    assert {p.direction for p in by_level["UB"]} >= {"in", "out"}
    unit = "cube_float16" if dtype == "float16" else "cube_float32"
    assert profile["units"][unit] > 0 and profile["bytes"]["l0c->ub"] > 0
    # the cube computes whole 16x16x16 blocks: its flops cover the padded shape
    blocks = -(-m // 16) * -(-n // 16) * -(-k // 16)
    assert profile["flops"] >= 8192 * blocks


def _masked_batched_matmul():
    # a mask over rows and columns computed from iotas, broadcast over the batch (a
    # causal attention's): folded into the epilogue, it leaves the contraction its kernel
    b = GraphBuilder("masked")
    h = b.matmul(b.input("x", (2, 128, 96)), b.input("w", (2, 96, 128)))
    rows = b.constant("rows", [128, 1], list(range(128)), "int32")
    cols = b.constant("cols", [1, 128], list(range(128)), "int32")
    zero = b.constant("zero", [], [0.0])
    return b.build([b.select(b.greater(cols, rows, out="m"), zero, h, out="y")])


def test_a_mask_read_by_the_epilogue_keeps_the_contraction_on_the_cube():
    compiled, _ = _check(_masked_batched_matmul())
    (kernel,) = compiled.kernels
    assert "on the cube" in next(x for x in kernel.fusion_report if x.startswith("contraction "))


def test_a_plain_matmul_output_leaves_through_the_unified_buffer():
    b = GraphBuilder("mm")
    graph = b.build([b.matmul(b.input("a", (64, 48)), b.input("w", (48, 80)), out="y")])
    compiled, profile = _check(graph)
    report = compiled.kernels[0].fusion_report
    assert any("leaves through the unified buffer" in line for line in report)
    assert profile["bytes"]["ub->gm"] == 64 * 80 * 4


def test_the_plan_fits_every_level_and_says_why():
    b = GraphBuilder("mm")
    graph = b.build([b.matmul(b.input("a", (512, 512), "float16"),
                              b.input("w", (512, 512), "float16"), out="y")])
    compiled = polyc.compile(graph, "npu", build=False)
    (kernel,) = compiled.kernels
    line = next(x for x in kernel.fusion_report if x.startswith("contraction "))
    assert "float16 operands" in line and "the fewest cycles the cycle model estimates" in line
    used = line.split("(bytes: ")[1]
    for level, capacity in CAPACITY.items():
        assert int(used.split(f"{level} ")[1].split(" of ")[0]) <= capacity
    tree = schedule_to_text(dict(kernel.trees)["copies"])
    for mark in ("tile L0C block", "tile L1 k", "tile L0 k0", "tile UB rows",
                 "microkernel cube_16x16x16"):
        assert f'mark: "{mark}' in tree
    assert "copy_in_l1_a_" in tree and "copy_in_l0b_b_" in tree


def test_a_float16_panel_is_not_copied_again_for_the_blocks_of_its_row():
    b = GraphBuilder("mm")
    graph = b.build([b.matmul(b.input("a", (256, 256), "float16"),
                              b.input("w", (256, 1024), "float16"), out="y")])
    compiled, profile = _check(graph, rtol=2e-2, atol=2e-2)
    a = 256 * 256 * 2
    line = next(x for x in compiled.kernels[0].fusion_report if x.startswith("contraction "))
    if "A's panel whole in L1" in line:
        # A once, B once per row of blocks (one row here): no more from GM
        assert profile["bytes"]["gm->l1"] == a + 256 * 1024 * 2
    assert profile["bytes"]["gm->l1"] <= 4 * a + 256 * 1024 * 2


def test_row_kernels_are_tiled_in_whole_rows_over_ub():
    b = GraphBuilder("sm")
    graph = b.build([b.softmax(b.input("x", (256, 1000), "float16"), out="y")])
    compiled, profile = _check(graph, rtol=2e-3, atol=1e-3)
    (kernel,) = compiled.kernels
    x = next(p for p in kernel.promotions if p.array.endswith("_x"))
    assert x.level == "UB" and x.box[-1] == 1000
    # x in once and y out once, in float16
    assert profile["bytes"]["gm->ub"] == profile["bytes"]["ub->gm"] == 256 * 1000 * 2
    assert profile["units"]["vector"] > 0 and profile["busy"]["cube"] == 0


def test_cores_share_the_tiles_and_the_gm_bandwidth():
    b = GraphBuilder("sm")
    graph = b.build([b.softmax(b.input("x", (512, 1024), "float16"), out="y")])
    inputs = _inputs(graph)
    _, one = _check(graph, inputs, rtol=2e-3, atol=1e-3)
    compiled, two = _check(graph, inputs, rtol=2e-3, atol=1e-3, cores=2)
    assert "polyc_npu_launch(run, \"" in compiled.c_source and ", 2, " in compiled.c_source
    assert one["bytes"] == two["bytes"]
    # the vector work splits; the GM bandwidth does not grow
    assert two["cycles"] < one["cycles"]
    assert two["cycles"] >= sum(two["bytes"].values()) / 64


def test_an_int32_contraction_goes_to_the_vector_unit():
    b = GraphBuilder("imm")
    graph = b.build([b.matmul(b.input("a", (32, 40), "int32"), b.input("w", (40, 24), "int32"),
                              out="y")])
    inputs = {"a": np.arange(32 * 40, dtype=np.int32).reshape(32, 40) % 7,
              "w": np.arange(40 * 24, dtype=np.int32).reshape(40, 24) % 5}
    compiled, profile = _check(graph, inputs)
    assert compiled.kernels[0].microkernels == [] and profile["busy"]["cube"] == 0


def test_a_tile_that_cannot_fit_ub_is_refused_naming_the_tensor():
    # as on the many-core chip (test_manycore.py)
    b = GraphBuilder("huge")
    half = b.op("cast", b.input("x", (24, 16, 1024)), to="float16")
    rows = b.op("cast", b.reshape(half, shape=[384, 1024]), to="float32")
    with pytest.raises(GraphError) as e:
        polyc.compile(b.build([half, b.reduce_sum(rows, axes=[1])]), "npu", build=False,
                      limits=Limits(), options={"fuse_force": [["cast_1", "reshape_2"]]})
    assert "262144 bytes" in str(e.value) and "'cast_1'" in str(e.value) and "UB" in str(e.value)


def test_the_service_compiles_for_the_npu_under_its_own_key(tmp_path):
    from fastapi.testclient import TestClient

    from polyc.server import Settings, create_app
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1))
    g = {"inputs": [{"name": "x", "shape": [8, 16], "dtype": "float16"}],
         "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}
    with TestClient(app) as c:
        npu = c.post("/v1/compile", json={"graph": g, "target": "npu", "options": {"cores": 2}})
        mc = c.post("/v1/compile", json={"graph": g, "target": "manycore"})
        assert npu.status_code == 200 and mc.status_code == 200, npu.text
        assert npu.json()["key"] != mc.json()["key"] and npu.json()["target"] == "npu"
        assert "polyc_npu_launch" in npu.json()["c_source"]
        bad = c.post("/v1/compile", json={"graph": g, "target": "npu", "options": {"cores": 33}})
        assert bad.status_code == 422 and "cores" in bad.text


def test_a_contraction_that_is_an_output_and_read_by_its_epilogue_is_written():
    # matmul_1 and neg(matmul_1) both outputs: only the epilogue's rows left the chip, and
    # matmul_1 itself was never written (found by random graphs with large dims)
    b = GraphBuilder("both")
    m = b.matmul(b.input("x", [33, 1000]), b.input("w", [1000, 1]), out="m")
    _check(b.build([b.neg(m, out="n"), m]), rtol=1e-4, atol=1e-3)
