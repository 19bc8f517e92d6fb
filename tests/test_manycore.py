"""The many-core target end to end: compiled for the simulated core group, run in the
simulator, compared with the numpy reference; promotions and DMA in the tree, the LDM's
capacity respected, the fixed-shape kernel on contractions, the profile's figures.

(The differential and hypothesis tests run every graph on this target too; the runtime
itself is tested in test_manycore_runtime.py.)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import polyc
from polyc import GraphBuilder, GraphError, Limits
from polyc.graph.reference import run_reference
from polyc.schedule_tree.tree import schedule_to_text
from polyc.targets.cpu import cpu_machine

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LDM = 256 << 10


def _inputs(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {t.name: rng.uniform(-1, 1, t.type.shape).astype(t.type.dtype) for t in graph.inputs}


def _check(graph, inputs=None, rtol=1e-4, atol=1e-4, **options):
    inputs = inputs or _inputs(graph)
    compiled = polyc.compile(graph, "manycore", options=options or None)
    got, want = compiled(**inputs), run_reference(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)
    return compiled, inputs


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_every_example_runs_on_the_simulated_chip(path):
    graph = polyc.load_graph(json.loads(path.read_text()))
    if graph.symbols:  # the chip targets take static shapes only, and say so
        with pytest.raises(GraphError, match="target 'manycore' does not compile symbolic"):
            polyc.compile(graph, "manycore", build=False)
        return
    compiled, inputs = _check(graph, atol=2e-4)
    profile = compiled.profile(**inputs)
    assert 0 < profile["high_water"]["LDM"] <= LDM
    assert profile["cycles"] > 0 and profile["transfers"] > 0
    assert set(profile["bytes"]) == {"main->ldm", "ldm->main"}


def test_the_profile_has_every_figure_design_names():
    b = GraphBuilder("sm")
    graph = b.build([b.softmax(b.input("x", (256, 1000)), out="y")])
    compiled, inputs = _check(graph)
    p = compiled.profile(**inputs)
    assert {"outputs", "cycles", "flops", "peak_fraction", "bytes", "transfers",
            "high_water"} <= set(p)
    np.testing.assert_allclose(p["outputs"]["y"], compiled(**inputs)["y"])
    assert p["peak_fraction"] == pytest.approx(p["flops"] / (p["cycles"] * 16 * 64))
    # a memory-bound row kernel: x in once, y out once, and the channel kept busy
    assert p["bytes"] == {"main->ldm": 256 * 1000 * 4, "ldm->main": 256 * 1000 * 4}
    assert sum(p["bytes"].values()) / 32 / p["cycles"] > 0.8
    with pytest.raises(GraphError, match="runs on the host"):
        polyc.compile(graph).profile(**inputs)


def test_copies_are_statements_of_the_tree_and_double_buffered():
    b = GraphBuilder("ln")
    x, g = b.input("x", (64, 512)), b.input("g", (512,))
    graph = b.build([b.op("rms_norm", x, g, out="y")])
    trace = []
    compiled, _ = _check(graph)
    polyc.compile(graph, "manycore", build=False, print_after_all=trace.append)
    copies = next(t for t in trace if "IR after copies" in t)
    assert "copy_in_ldm_t0_x" in copies and "copy_out_ldm_" in copies and "extension" in copies
    report = compiled.kernels[0].fusion_report
    promoted = [line for line in report if line.startswith("promote ")]
    assert any("t0_x" in line and "[LDM, in, box]" in line for line in promoted)
    assert any("[LDM, out, box]" in line for line in promoted)
    # gamma is the same for every tile: copied once per core, not once per tile
    (gamma,) = [p for p in compiled.kernels[0].promotions if p.array.endswith("_g")]
    assert gamma.at == ""
    src = compiled.c_source
    assert "polyc_dma_iget(" in src and "polyc_dma_wait(" in src  # the next tile ahead
    assert "polyc_mc_launch(run" in src and "polyc_mc_id(core)" in src


def test_single_buffered_when_asked():
    b = GraphBuilder("e")
    graph = b.build([b.exp(b.input("x", (128, 300)), out="y")])
    compiled, _ = _check(graph, double_buffer=False)
    assert "polyc_dma_iget(" not in compiled.c_source and "polyc_dma_get(" in compiled.c_source


@pytest.mark.parametrize("m,k,n,epilogue", [(130, 100, 200, False), (64, 32, 64, True),
                                           (200, 300, 250, True),
                                           # K under one step: its panels' last columns
                                           # zeroed, though the box of 28 is full
                                           (64, 28, 128, False), (33, 28, 190, True)])
def test_contractions_run_on_the_fixed_shape_kernel(m, k, n, epilogue):
    b = GraphBuilder("mm")
    y = b.matmul(b.input("a", (m, k)), b.input("w", (k, n)))
    if epilogue:
        y = b.gelu(b.add(y, b.input("bias", (n,))), approximate="tanh")
    graph = b.build([y])
    compiled, inputs = _check(graph, atol=3e-4)
    (kernel,) = compiled.kernels
    assert kernel.microkernels == ["mc_sgemm_64x64x32"]
    assert "polyc_mc_sgemm_64x64x32(core" in compiled.c_source
    line = next(x for x in kernel.fusion_report if x.startswith("contraction "))
    assert "C blocks of" in line and "fit the LDM" in line
    # the K panels are got a step ahead; padded to whole kernel tiles
    panels = [p for p in kernel.promotions if p.buffer.startswith("ldmk_")]
    assert [p.extents[-2:] for p in panels][0][0] % 64 == 0
    assert all(p.direction == "in" for p in panels)
    profile = compiled.profile(**inputs)
    calls = profile["flops"] // (2 * 64 * 64 * 32)
    assert calls >= -(-m // 64) * -(-n // 64) * -(-k // 32)
    assert profile["high_water"]["LDM"] <= LDM


def _masked_batched_matmul():
    # a mask over rows and columns computed from iotas, broadcast over the batch (a
    # causal attention's): folded into the epilogue, it leaves the contraction its kernel
    b = GraphBuilder("masked")
    h = b.matmul(b.input("x", (2, 128, 96)), b.input("w", (2, 96, 128)))
    rows = b.constant("rows", [128, 1], list(range(128)), "int32")
    cols = b.constant("cols", [1, 128], list(range(128)), "int32")
    zero = b.constant("zero", [], [0.0])
    return b.build([b.select(b.greater(cols, rows, out="m"), zero, h, out="y")])


def test_a_mask_read_by_the_epilogue_keeps_the_contraction_on_the_kernel():
    compiled, _ = _check(_masked_batched_matmul())
    (kernel,) = compiled.kernels
    assert kernel.microkernels == ["mc_sgemm_64x64x32"]


def test_an_epilogue_writes_over_c_in_place():
    b = GraphBuilder("lg")
    graph = b.build([b.relu(b.matmul(b.input("a", (128, 64)), b.input("w", (64, 128))), out="y")])
    compiled, _ = _check(graph)
    (out,) = [p for p in compiled.kernels[0].promotions if p.also]
    assert out.direction == "out" and "in place" in str(out)


def test_a_tile_that_cannot_fit_the_ldm_is_refused_naming_the_tensor():
    # a cast written as [24, 16, 1024] and read back as [384, 1024] rows in one kernel
    # (forced: left to itself the compile splits it, test_scratchpad.py): the tile of
    # row r reads what the tile of r / 16 wrote, so even one row's tile (and any step of
    # it) spans 23 of the cast's planes, 736 KiB
    b = GraphBuilder("huge")
    half = b.op("cast", b.input("x", (24, 16, 1024)), to="float16")
    rows = b.op("cast", b.reshape(half, shape=[384, 1024]), to="float32")
    graph = b.build([half, b.reduce_sum(rows, axes=[1])])
    with pytest.raises(GraphError) as e:
        polyc.compile(graph, "manycore", build=False, limits=Limits(),
                      options={"fuse_force": [["cast_1", "reshape_2"]]})
    text = str(e.value)
    assert "262144 bytes" in text and "'cast_1'" in text and "LDM" in text


def test_the_oracle_weighs_footprints_against_the_ldm():
    # rows of 96 Ki floats: exp(x - max(x)) fused keeps a row of x, of the difference
    # and of y (1.1 MiB) live, within a 2 MiB L2 but beyond the LDM (the host's own L2
    # may be smaller: 512 KiB on Zen 3, which would refuse the merge on the cpu too)
    b = GraphBuilder("wide")
    x = b.input("x", (4, 96 << 10))
    graph = b.build([b.exp(b.sub(x, b.reduce_max(x, axes=[1], keepdims=True)), out="y")])
    cpu = polyc.compile(graph, cpu_machine().with_capacity("L2", 2 << 20), build=False)
    mc = polyc.compile(graph, "manycore", build=False)
    assert len(cpu.kernels) == 1
    report = [line for k in mc.kernels for line in k.fusion_report]
    assert any("1.1 MiB, more than LDM (256.0 KiB)" in line for line in report), report
    assert len(mc.kernels) == 2
    _check(graph)


def test_a_reduction_alone_is_tiled_in_whole_rows():
    b = GraphBuilder("rmax")
    graph = b.build([b.reduce_max(b.input("x", (64, 4096)), axes=[1], keepdims=True, out="m")])
    compiled, _ = _check(graph)
    (kernel,) = compiled.kernels
    x, m = kernel.promotions
    assert x.box[-1] == 4096 and x.direction == "in"
    assert m.direction == "out"  # every row's first write is its initial value


def test_the_tree_after_each_pass_shows_tiles_and_copies():
    b = GraphBuilder("t")
    graph = b.build([b.relu(b.input("x", (300, 70)), out="y")])
    compiled = polyc.compile(graph, "manycore", build=False)
    trees = dict(compiled.kernels[0].trees)
    assert list(trees)[-1] == "copies"
    assert 'mark: "tile LDM tile"' in schedule_to_text(trees["tile-ldm"])
    assert "parallel threads=" in schedule_to_text(trees["lower-manycore"])


def test_the_service_compiles_for_the_chip_under_its_own_key(tmp_path):
    from fastapi.testclient import TestClient

    from polyc.server import Settings, create_app
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1))
    g = {"inputs": [{"name": "x", "shape": [8, 16]}],
         "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}
    with TestClient(app) as c:
        mc = c.post("/v1/compile", json={"graph": g, "target": "manycore"})
        cpu = c.post("/v1/compile", json={"graph": g})
        assert mc.status_code == 200 and cpu.status_code == 200, mc.text
        assert mc.json()["key"] != cpu.json()["key"] and mc.json()["target"] == "manycore"
        assert "polyc_mc_launch" in mc.json()["c_source"]
        bad = c.post("/v1/compile", json={"graph": g, "target": "manycore",
                                          "options": {"threads": 2}})
        assert bad.status_code == 422 and "options/threads" in bad.text
