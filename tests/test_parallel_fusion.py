"""Parallel fusion: groups that no path joins become independent parts of one kernel, a
sequence of their own loop nests, each keeping its parallel loops (AKG runs such
"parallel fusion" graphs as one kernel). Every compiled result is checked against the
reference executor."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polyc
from polyc import GraphBuilder
from polyc.compiler import compile
from polyc.graph.reference import run_reference
from polyc.schedule_tree.oracle import ask_parallel
from polyc.targets.cpu import cpu_machine

SAMPLE = Path(__file__).resolve().parent / "data" / "akg"


def _check(graph, compiled, rng=np.random.default_rng(0)):
    inputs = {t.name: rng.uniform(-2, 2, t.type.shape).astype(t.type.dtype) for t in graph.inputs}
    got, want = compiled(**inputs), run_reference(graph, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def _parts():
    """Three independent parts, each large enough for a parallel loop of its own: an
    elementwise op, a column sum (its outer loop carries the sum) and a row sum."""
    b = GraphBuilder("parts")
    x, z, w = b.input("x", [256, 256]), b.input("z", [512, 128]), b.input("w", [384, 256])
    return b, [b.exp(x, out="e"), b.reduce_sum(z, axes=[0], out="cols"),
               b.reduce_sum(w, axes=[1], out="rows")]


def _parallel_loops(source: str) -> int:
    return source.count("#pragma omp parallel")


def test_independent_groups_are_one_kernel_of_parts_in_sequence():
    b, outs = _parts()
    graph = b.build(outs)
    compiled = compile(graph)
    assert len(compiled.kernels) == 1
    text = compiled.kernels[0].to_json()["schedule_text"]
    assert text.splitlines()[1:3] == ["child:", "  sequence:"]  # the root's child
    assert sum("parallel (independent): fused" in line for line in compiled.fusion.report) == 2
    _check(graph, compiled)


def test_each_part_keeps_its_parallel_loops():
    b, outs = _parts()
    together = compile(b.build(outs)).c_source
    alone = 0
    for out in outs:
        bb, outs_again = _parts()
        alone += _parallel_loops(compile(bb.build([outs_again[outs.index(out)]])).c_source)
    assert alone >= 3 and _parallel_loops(together) == alone


def test_a_contraction_on_its_microkernel_stays_a_kernel_of_its_own():
    b = GraphBuilder("mm")
    a, w, x = b.input("a", [128, 128]), b.input("w", [128, 128]), b.input("x", [64, 64])
    graph = b.build([b.op("matmul", a, w, out="y"), b.exp(x, out="e")])
    compiled = compile(graph)
    assert len(compiled.kernels) == 2
    assert any("parallel (independent)" in line and "microkernel" in line
               for line in compiled.fusion.report)
    _check(graph, compiled)


def _ask(graph, a, b):
    from polyc.graph.decompose import decompose_graph
    from polyc.graph.simplify import simplify_graph
    return ask_parallel(simplify_graph(decompose_graph(graph)), a, b, cpu_machine())


def test_a_common_single_value_does_not_join_parts_but_a_common_tensor_does():
    b = GraphBuilder("scaled")
    x, y, s = b.input("x", [64]), b.input("y", [20]), b.input("s", [1])
    graph = b.build([b.op("mul", x, s, out="xs"), b.op("mul", y, s, out="ys")])
    answer = _ask(graph, ("xs",), ("ys",))
    assert answer.legal and "independent" in answer.reason
    compiled = compile(graph)
    assert len(compiled.kernels) == 1
    _check(graph, compiled)
    b = GraphBuilder("t")
    x = b.input("x", [32, 32])
    graph = b.build([b.op("transpose", x, perm=[1, 0], out="t"), b.exp(x, out="e")])
    answer = _ask(graph, ("t",), ("e",))
    assert not answer.legal and "common tensor" in answer.reason


def test_an_akg_parallel_fusion_graph_is_one_kernel():
    # seven Muls by one constant, AKG's "parallel fusion" of seven subgraphs
    (path,) = SAMPLE.rglob("Fused_Mul_fusion_Mul_fusion_*parallel*.info")
    graph = polyc.import_akg(path)
    compiled = compile(graph)
    assert len(compiled.kernels) == 1
    _check(graph, compiled)


@pytest.mark.parametrize("target", ["manycore", "npu"])
def test_on_a_chip_with_scratchpads_parts_are_kernels_of_their_own(target):
    # a sequence of parts has no band for the cores' tiles: AKG's NZ MatMul, its two
    # transposed operands one kernel, was refused as one tile of 15 MiB for a 256 KiB UB
    b = GraphBuilder("two_transposes")
    x, y = b.input("x", [256, 512]), b.input("y", [512, 384])
    graph = b.build([b.op("transpose", x, perm=[1, 0], out="xt"),
                     b.op("transpose", y, perm=[1, 0], out="yt")])
    compiled = compile(graph, target)
    assert len(compiled.kernels) == 2
    assert any("each is a kernel of its own" in line for line in compiled.fusion.report)
    _check(graph, compiled)


@pytest.mark.parametrize("target", ["manycore", "npu"])
def test_on_a_chip_with_scratchpads_a_small_side_does_not_run_in_sequence(target):
    # the cpu runs a small sum before the image-wide add in one kernel (no loop is
    # shared); on a chip that kernel had no band to tile: refused, 1.8 MiB for the UB
    b = GraphBuilder("offset")
    x, bias = b.input("x", [16, 96, 17, 17]), b.input("bias", [96])
    graph = b.build([b.add(x, b.reduce_sum(bias, axes=[0]), out="y")])
    assert len(compile(graph).kernels) == 1
    compiled = compile(graph, target)
    assert len(compiled.kernels) == 2
    assert any("no loop is shared, but the cores" in line for line in compiled.fusion.report)
    _check(graph, compiled)


@pytest.mark.parametrize("target", ["manycore", "npu"])
def test_on_a_chip_with_scratchpads_a_bias_shares_the_channel_loop(target):
    # a bias reshaped to [C, 1, 1] and the image it is added to: every dependence keeps
    # the channel, so one kernel's band over the channels is what the cores tile (the
    # bias once ran before the add, sharing no loop, so the chips took two kernels)
    b = GraphBuilder("bias_add")
    x, bias = b.input("x", [16, 96, 17, 17]), b.input("bias", [96])
    graph = b.build([b.add(x, b.reshape(bias, shape=[96, 1, 1]), out="y")])
    compiled = compile(graph, target)
    assert len(compiled.kernels) == 1
    assert any("legal at depth 1" in line for line in compiled.fusion.report)
    _check(graph, compiled)
