"""Compile time that grows gently with the graph: long elementwise chains, wide fans and
matmul chains, each once a way to hold a compile worker for the whole time limit."""
from __future__ import annotations

import resource
import time

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.compiler import compile
from polyc.graph.decompose import decompose_graph
from polyc.graph.fuse import MAX_GROUP_NODES
from polyc.graph.load import load_graph
from polyc.graph.reference import run_reference
from polyc.graph.storage import STORAGE, widen_storage
from polyc.schedule_tree import oracle
from polyc.targets.cpu import cpu_machine

UNARY = ("exp", "tanh", "neg", "abs", "sigmoid")


def chain(n: int, shape=(16, 32), dtype="float32") -> dict:
    nodes, prev = [], "x"
    for i in range(n):
        op = UNARY[i % len(UNARY)]
        if i % 7 == 6:  # binary ops too: one input read twice
            nodes.append({"op": "mul", "inputs": [prev, "x"], "outputs": [f"t{i}"]})
        else:
            nodes.append({"op": op, "inputs": [prev], "outputs": [f"t{i}"]})
        prev = f"t{i}"
    return {"name": "chain", "inputs": [{"name": "x", "shape": list(shape), "dtype": dtype}],
            "nodes": nodes, "outputs": [prev]}


def fan(n: int) -> dict:
    nodes = [{"op": UNARY[i % len(UNARY)], "inputs": ["x"], "outputs": [f"t{i}"]}
             for i in range(n)]
    return {"name": "fan", "inputs": [{"name": "x", "shape": [8, 16]}],
            "nodes": nodes, "outputs": [f"t{i}" for i in range(n)]}


def check(graph, compiled):
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.uniform(-1, 1, t.type.shape).astype(t.type.dtype)
              for t in graph.inputs}
    got, want = compiled(**inputs), run_reference(graph, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("graph", [chain(12), chain(9, (3, 5, 7), "float64"),
                                   chain(6, (33,), "int32") | {"nodes": [
                                       {"op": "neg", "inputs": ["x"], "outputs": ["a"]},
                                       {"op": "abs", "inputs": ["a"], "outputs": ["b"]},
                                       {"op": "add", "inputs": ["a", "b"], "outputs": ["c"]}],
                                       "outputs": ["c"]},
                                   fan(6)], ids=["f32", "f64", "int32", "fan"])
def test_pointwise_answers_are_isls(graph):
    """The oracle's shortcut for elementwise groups says what isl's model says."""
    g = load_graph(graph)
    machine = cpu_machine()
    names = [n.name for n in g.nodes]
    pairs = [(tuple(names[:k]), tuple(names[k:k + j])) for k in range(1, len(names))
             for j in (1, 2) if k + j <= len(names)]
    for a, b in pairs:
        quick = oracle._pointwise_answer(g, a, b, machine)
        assert quick is not None, (a, b)
        assert quick == oracle._isl_answer(g, a, b, machine, lambda k, f: None), (a, b)


def test_pointwise_answers_with_scalar_constants_are_isls():
    """gelu's tanh form multiplies by scalar constants, literals in the C: the
    shortcut answers its groups as isl does."""
    b = GraphBuilder("gelu")
    g = decompose_graph(b.build([b.gelu(b.input("x", [8, 16]), approximate="tanh")]))
    names = [n.name for n in g.nodes]
    assert any(len(g.types[t].shape) == 0 for n in g.nodes for t in n.inputs)
    machine = cpu_machine()
    for k in range(1, len(names)):
        a, b_ = tuple(names[:k]), (names[k],)
        quick = oracle._pointwise_answer(g, a, b_, machine)
        assert quick is not None and quick == oracle._isl_answer(
            g, a, b_, machine, lambda kernel, flops: None), (a, b_)


def test_pointwise_answers_with_broadcast_inputs_are_isls():
    """A tensor from outside the groups read broadcast (a row, a column) is one element
    per point: the shortcut answers as isl does; a broadcast of a tensor the groups
    make (another shape) and a reduction are left to isl."""
    g = load_graph({"name": "bc", "inputs": [{"name": "x", "shape": [4, 8]},
                                             {"name": "v", "shape": [8]},
                                             {"name": "r", "shape": [4, 1]}],
                    "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["a"]},
                              {"op": "add", "inputs": ["a", "v"], "outputs": ["b"]},
                              {"op": "mul", "inputs": ["r", "b"], "outputs": ["c"]},
                              {"op": "reduce_sum", "inputs": ["c"], "outputs": ["s"],
                               "attrs": {"axes": [1], "keepdims": True}},
                              {"op": "sub", "inputs": ["c", "s"], "outputs": ["d"]}],
                    "outputs": ["d"]})
    names = tuple(n.name for n in g.nodes)
    machine = cpu_machine()
    for a, b in ((names[:1], names[1:2]), (names[:1], names[1:3]), (names[:2], names[2:3])):
        quick = oracle._pointwise_answer(g, a, b, machine)
        assert quick is not None and quick == oracle._isl_answer(
            g, a, b, machine, lambda kernel, flops: None), (a, b)
    assert oracle._pointwise_answer(g, (names[2],), (names[3],), machine) is None  # reduction
    assert oracle._pointwise_answer(g, (names[3],), (names[4],), machine) is None  # s broadcast


def test_pointwise_shortcut_leaves_other_groups_to_isl():
    machine = cpu_machine()
    for dtype in STORAGE:  # widening casts recomputed where read: isl's model counts them
        g = widen_storage(load_graph(chain(4, (33,), dtype)))
        names = [n.name for n in g.nodes]
        assert oracle._pointwise_answer(g, tuple(names[:2]), tuple(names[2:3]), machine) is None


def _epilogue_graphs():
    def linear_gelu(b):
        return b.gelu(b.linear(b.input("x", [64, 96]), b.input("w", [96, 80]), b.input("c", [80])),
                      approximate="tanh")

    def batched_residual(b):
        x = b.input("x", [3, 20, 24])
        y = b.matmul(x, b.input("w", [3, 24, 40]))
        return b.mul(b.add(b.relu(y), b.input("r", [3, 20, 40])), b.sigmoid(y))

    def transposed(b):
        return b.exp(b.matmul(b.input("x", [30, 16]), b.input("w", [50, 16]), transpose_b=True))

    def conv(b):
        y = b.conv2d(b.input("x", [2, 8, 12, 12]), b.input("k", [16, 8, 3, 3]),
                     b.input("c", [16]), pads=[1, 1, 1, 1])
        return b.tanh(b.relu(y))

    def then_a_reduction(b):  # isl answers the proposals with the reduction
        return b.reduce_sum(b.exp(b.matmul(b.input("x", [64, 96]), b.input("w", [96, 80]))),
                            axes=[1])

    def half(b):  # float16 storage: widening casts recomputed where read, isl's to count
        y = b.matmul(b.input("x", [64, 96]), b.input("w", [96, 80]))
        return b.relu(b.add(y, b.cast(b.input("h", [64, 80], "float16"), to="float32")))
    return [linear_gelu, batched_residual, transposed, conv, then_a_reduction, half]


@pytest.mark.parametrize("make", _epilogue_graphs(), ids=lambda f: f.__name__)
def test_epilogue_answers_are_isls(make, monkeypatch):
    """The oracle's shortcut for a contraction with elementwise work on its result says
    what isl's model of the merged kernel says, on every proposal along the graph."""
    from polyc import targets
    from polyc.options import Options
    b = GraphBuilder(make.__name__)
    g = compile(b.build([make(b)]), "cpu", build=False).primitive
    machine = cpu_machine()
    microkernels = targets.backend("cpu").microkernels(machine, Options())
    names = [n.name for n in g.nodes]
    pairs = [(tuple(names[:k]), tuple(names[k:k + j])) for k in range(1, len(names))
             for j in (1, 2) if k + j <= len(names)]
    shortcut, taken = oracle._epilogue_answer, []
    monkeypatch.setattr(oracle, "_epilogue_answer",
                        lambda *args: taken.append(shortcut(*args)) or taken[-1])
    quick = [oracle._isl_answer(g, a, b_, machine, microkernels) for a, b_ in pairs]
    monkeypatch.setattr(oracle, "_epilogue_answer", lambda *args: None)
    assert quick == [oracle._isl_answer(g, a, b_, machine, microkernels) for a, b_ in pairs]
    answered = sum(answer is not None for answer in taken)
    assert answered == 0 if make.__name__ == "half" else answered > 0


def test_a_long_chain_is_cut_into_kernels_within_the_fusion_budget():
    n = 3 * MAX_GROUP_NODES + 5
    result = compile(chain(n), "cpu")
    sizes = [len(g) for g in result.fusion.groups]
    assert sizes == [MAX_GROUP_NODES] * 3 + [5]
    assert any("over the fusion budget of 32 per kernel" in line for line in result.fusion.report)
    check(result.graph, result)


def cpu_seconds() -> float:
    """CPU time of this process and of the children it waited for (gcc): unlike the
    wall clock, it does not count the time other tenants of a shared host hold a core."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def test_a_1000_node_chain_compiles_in_seconds():
    # the attack's figures: 25 / 50 / 100 / 200 nodes took 0.3 / 1.3 / 5.6 / 25 s in
    # fusion alone, and 500 ran into the 60 s limit. Linear now: 3-7 s of CPU by the
    # host (Sapphire Rapids 3-4 s, Zen 3 6-7 s); the bound is a complexity guard with
    # room for slower hosts, not a speed claim (the benchmarks make those)
    start = cpu_seconds()
    result = compile(chain(1000), "cpu")
    elapsed = cpu_seconds() - start
    check(result.graph, result)
    assert elapsed < 20.0, result.trace.timings


def test_a_wide_fan_compiles_in_seconds():
    start = cpu_seconds()
    result = compile(fan(100), "cpu")  # was 14.8 s in fusion
    assert cpu_seconds() - start < 5.0, result.trace.timings
    check(result.graph, result)
