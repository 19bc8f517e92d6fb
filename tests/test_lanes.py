"""A gemm's heavy epilogue written back on 16 lanes (`targets/cpu/emit/lanes.py`, the
prelude's `polyc_v_*`): results as the scalar helpers', on every tile shape."""
from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.compiler import Options, compile
from polyc.graph.reference import run_reference
from polyc.microkernels import registry
from polyc.targets.cpu import cpu_machine, host_can_run
from polyc.targets.cpu.prelude import PRELUDE
from test_cexpr import _assert_bounds, _sigmoid, _sweep
from test_microkernels import _isa


def _avx512() -> Options:
    """Options pinning gemm kernels to AVX-512's, whose write-backs use lanes, on one
    thread, and the direct convolution, whose write-back it is; skips where the target
    has none or this host cannot run its code."""
    return replace(_isa("avx512"), parallel=False, winograd=False)


def _code(compiled) -> str:
    """The unit's own C: without the prelude, which defines every helper."""
    assert compiled.c_source.startswith(PRELUDE)
    return compiled.c_source[len(PRELUDE):]


def _on_bias(op: str, values: np.ndarray, **attrs):
    """`op` on x @ w + bias with x zero, so that the epilogue's argument is the bias,
    exactly: every value of the sweep reaches the lanes' helper."""
    b = GraphBuilder(op)
    n = values.size
    y = b.linear(b.input("x", (8, 16)), b.input("w", (16, n)), b.input("bias", (n,)))
    graph = b.build([b.op(op, y, out="y", **attrs)])
    inputs = {"x": np.zeros((8, 16), np.float32),
              "w": np.random.default_rng(0).standard_normal((16, n)).astype(np.float32),
              "bias": values}
    return graph, inputs


@pytest.mark.parametrize("op,exact,ulps,flush", [
    ("exp", np.exp, 2, 2.0 ** -125), ("tanh", np.tanh, 2, 0.0),
    ("sigmoid", _sigmoid, 3, 2.0 ** -125)])
def test_lanes_match_the_scalar_helpers_over_the_whole_range(op, exact, ulps, flush):
    # the scalar versions' bounds (test_cexpr)
    options = _avx512()
    graph, inputs = _on_bias(op, _sweep())
    compiled = compile(graph, options=options)
    assert f"polyc_v_{op}f(" in _code(compiled)
    got = compiled(**inputs)["y"]  # every row op(bias); the last column tile an edge's
    _assert_bounds(op, got, np.broadcast_to(inputs["bias"], got.shape), exact, ulps, flush)


def test_lanes_erf_and_both_gelus():
    options = _avx512()
    x = np.concatenate([np.linspace(-9, 9, 4093), [np.inf, -np.inf, np.nan]]).astype(np.float32)
    graph, inputs = _on_bias("erf", x)
    compiled = compile(graph, options=options)
    assert "polyc_v_erff(" in _code(compiled)
    got = compiled(**inputs)["y"]
    want = [math.erf(v) if not math.isnan(v) else v for v in x.astype(float)]
    for row in got:
        np.testing.assert_allclose(row, want, atol=3e-7)
    for approximate, fn in (("none", "erff"), ("tanh", "sigmoidf")):
        graph, inputs = _on_bias("gelu", x[:-3], approximate=approximate)
        compiled = compile(graph, options=options)
        assert f"polyc_v_{fn}(" in _code(compiled)
        want = run_reference(graph, inputs)["y"]
        np.testing.assert_allclose(compiled(**inputs)["y"], want, rtol=1e-6, atol=1e-6)


def test_lanes_let_nan_through_relu_maximum_and_minimum():
    # as the scalar write-back (and numpy): a NaN on either side wins; each of the four
    # leaves the write-back, stored from the same lanes
    options = _avx512()
    nan, inf = np.nan, np.inf
    a = np.array([nan, 1.0, nan, -2.0, 0.5, -inf, inf, -0.5, 3.0, -0.0] * 5, np.float32)
    c = np.array([2.0, nan, nan, -3.0, 0.5, 1.0, -1.0, nan, -inf, 0.0] * 5, np.float32)
    b = GraphBuilder("nan_lanes")
    n = a.size
    y = b.linear(b.input("x", (3, 4)), b.input("w", (4, n)), b.input("bias", (n,)))
    other = b.input("c", (n,))
    graph = b.build([b.op("maximum", y, other, out="hi"), b.op("minimum", y, other, out="lo"),
                     b.op("relu", y, out="r"), b.op("sigmoid", y, out="s")])
    inputs = {"x": np.zeros((3, 4), np.float32), "w": np.ones((4, n), np.float32),
              "bias": a, "c": c}
    compiled = compile(graph, options=options)
    assert "polyc_v_max(" in _code(compiled) and "polyc_v_relu(" in _code(compiled)
    got = compiled(**inputs)
    for row in range(3):
        np.testing.assert_array_equal(got["hi"][row], np.maximum(a, c))
        np.testing.assert_array_equal(got["lo"][row], np.minimum(a, c))
        np.testing.assert_array_equal(got["r"][row], np.maximum(a, 0))


@pytest.mark.parametrize("m,k,n", [(8, 64, 48), (13, 40, 100), (37, 2500, 61), (2, 24, 17)])
def test_lanes_on_edge_tiles_k_blocks_and_row_values(m, k, n):
    # tiles narrower and shorter than the kernel's, K in several blocks (the partial
    # sums read back on lanes), a value of the row alone (the same in every lane)
    options = _avx512()
    rng = np.random.default_rng(m * n + k)
    b = GraphBuilder("edges")
    y = b.add(b.matmul(b.input("a", (m, k)), b.input("w", (k, n))), b.input("r", (m, 1)))
    graph = b.build([b.gelu(b.add(y, b.input("bias", (n,))), approximate="tanh")])
    inputs = {"a": rng.standard_normal((m, k)).astype(np.float32),
              "w": rng.standard_normal((k, n)).astype(np.float32) / math.sqrt(k),
              "r": rng.standard_normal((m, 1)).astype(np.float32),
              "bias": rng.standard_normal(n).astype(np.float32)}
    compiled = compile(graph, options=options)
    assert "polyc_v_sigmoidf(" in _code(compiled)
    assert re.search(r"polyc_v_set\(t\d+_r\[", _code(compiled))  # the row's value
    want = run_reference(graph, inputs)
    np.testing.assert_allclose(compiled(**inputs)[graph.outputs[0]], want[graph.outputs[0]],
                               rtol=1e-4, atol=1e-4)


def test_no_lanes_for_a_light_epilogue_or_another_isa():
    # bias and relu: gcc's own loop (as fast, and its edge tiles compile fast); avx2's
    # kernels: the prelude has no lanes for them
    b = GraphBuilder("light")
    y = b.linear(b.input("x", (64, 64)), b.input("w", (64, 64)), b.input("bias", (64,)))
    light = b.build([b.relu(y)])
    b = GraphBuilder("heavy")
    y = b.linear(b.input("x", (64, 64)), b.input("w", (64, 64)), b.input("bias", (64,)))
    heavy = b.build([b.gelu(y)])
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((64, 64)).astype(np.float32),
              "w": rng.standard_normal((64, 64)).astype(np.float32),
              "bias": rng.standard_normal(64).astype(np.float32)}
    target = cpu_machine()
    for isa in ("avx512", "avx2"):
        if registry.select("gemm", "float32", target, isa, rates={}) is None:
            continue
        options = Options(microkernel_isa=isa, parallel=False)
        for graph in (light, heavy):
            compiled = compile(graph, options=options)
            assert ("polyc_v_" in _code(compiled)) == (
                isa == "avx512" and graph is heavy)
            if host_can_run(target.arch):
                want = run_reference(graph, inputs)[graph.outputs[0]]
                np.testing.assert_allclose(compiled(**inputs)[graph.outputs[0]], want,
                                           rtol=1e-4, atol=1e-4)


def test_lanes_on_folded_images_and_the_tiles_across_them():
    # a 1x1 convolution over four 7x7 images, folded into one row of columns: a tile
    # inside one image on lanes (its channel's bias the same in every lane), one
    # across two images too, in the pieces inside each image (in scalars, a division a
    # column, 8x256x7x7 to 256 with bias and silu had run 2.25x the time of its relu)
    options = _avx512()
    rng = np.random.default_rng(2)
    b = GraphBuilder("folded")
    y = b.conv2d(b.input("x", (4, 64, 7, 7)), b.input("w", (32, 64, 1, 1)), b.input("bias", (32,)))
    graph = b.build([b.gelu(y)])
    inputs = {"x": rng.standard_normal((4, 64, 7, 7)).astype(np.float32),
              "w": rng.standard_normal((32, 64, 1, 1)).astype(np.float32) / 8,
              "bias": rng.standard_normal(32).astype(np.float32)}
    compiled = compile(graph, options=options)
    code = _code(compiled)
    assert "% 49 + mk_nr <= 49" in code and "polyc_v_mask(mk_ce - mk_c)" in code
    assert "polyc_v_erff(" in code and "polyc_erff(" not in code
    want = run_reference(graph, inputs)[graph.outputs[0]]
    np.testing.assert_allclose(compiled(**inputs)[graph.outputs[0]], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", ["sgemm_avx512_32x14", "sgemm_avx512_32x14_bcast",
                                    "sgemm_avx512_8x48"])
@pytest.mark.parametrize("xs,co,tiles", [
    ((2, 64, 14, 14), 64, ()),  # tiles inside one output row
    ((2, 64, 7, 7), 40, ()),  # the window kernels' two rows a tile; 40 channels: edges
    ((1, 32, 20, 20), 64, ()),  # tiles across rows: by runs
    ((1, 128, 20, 20), 32, (("kc", 192),)),  # and K in blocks, the sums read back
    ((1, 64, 30, 30), 48, ()),  # the 8x48's B rows in place, its tiles across rows
], ids=["14x14", "7x7", "20x20", "k-blocks", "30x30"])
def test_lanes_on_convolutions_reading_their_window_in_place(kernel, xs, co, tiles):
    # B read in place: a tile inside one output row on lanes, its channel's bias the
    # same in every lane; the columns of other tiles on lanes by runs, each inside one
    # output row; any tile width (14: one vector, masked)
    options = _avx512()
    if kernel != "sgemm_avx512_8x48" and "avx512vl" not in cpu_machine().features:
        pytest.skip("the window kernels need avx512vl")
    options = replace(options, gemm_kernel=kernel, microkernel_tiles=tiles)
    rng = np.random.default_rng(sum(xs) + co)
    ws = (co, xs[1], 3, 3)
    b = GraphBuilder("conv_silu")
    y = b.conv2d(b.input("x", xs), b.input("w", ws), b.input("bias", (co,)), pads=[1] * 4)
    graph = b.build([b.silu(y)])
    inputs = {"x": rng.standard_normal(xs).astype(np.float32),
              "w": (rng.standard_normal(ws) / math.sqrt(9 * xs[1])).astype(np.float32),
              "bias": rng.standard_normal(co).astype(np.float32)}
    compiled = compile(graph, options=options)
    code = _code(compiled)
    assert f"polyc_{kernel}_b_" in code and "polyc_v_sigmoidf(" in code
    want = run_reference(graph, inputs)[graph.outputs[0]]
    np.testing.assert_allclose(compiled(**inputs)[graph.outputs[0]], want, rtol=1e-4, atol=1e-5)
