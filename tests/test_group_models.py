"""The fusion oracle's kept group models: a merged group's model built from its parts'
(renamed) and the dependences between them equals the one computed afresh."""
from __future__ import annotations

import pytest

from polyc import GraphBuilder
from polyc.graph.decompose import decompose_graph
from polyc.graph.simplify import simplify_graph
from polyc.kernel import build_kernels
from polyc.schedule_tree.dependences import between_statements, compute_dependences
from polyc.schedule_tree.group_models import GroupModels
from polyc.schedule_tree.model import build_model

FIELDS = ("domain", "reads", "writes", "order", "flow", "anti", "output", "input")


def _matmul_chain():
    b = GraphBuilder("chain")
    t = b.input("x", [8, 12])
    for i in range(4):
        t = b.matmul(b.exp(t) if i == 2 else t, b.input(f"w{i}", [12, 12]))
    return b.build([b.op("softmax", t, axis=-1)])


def _siblings_and_reductions():
    b = GraphBuilder("sib")
    x = b.input("x", [6, 10])
    m = b.reduce_max(x, axes=[1], keepdims=True)
    return b.build([b.sub(x, m), b.reduce_sum(x, axes=[0]), b.op("transpose", x, perm=[1, 0])])


@pytest.mark.parametrize("make", [_matmul_chain, _siblings_and_reductions])
def test_a_group_grown_node_by_node_has_the_dependences_of_the_whole(make):
    graph = simplify_graph(decompose_graph(make()))
    models = GroupModels(graph)
    names = [n.name for n in graph.nodes]
    group = (names[0],)
    for name in names[1:]:
        merged = group + (name,)
        (kernel,) = build_kernels(graph, (merged,))
        got = models.merged(kernel, group, (name,))
        want = compute_dependences(build_model(
            kernel.statements, {a.tensor: a.c_name for a in kernel.arrays}, models.ctx),
            siblings_only=True)
        for field in FIELDS:
            assert getattr(got, field).is_equal(getattr(want, field)), (merged, field)
        # a fused kernel's reuse: every pair of different statements, and only those
        full = compute_dependences(build_model(
            kernel.statements, {a.tensor: a.c_name for a in kernel.arrays}, models.ctx))
        assert got.input.is_equal(between_statements(full.input)), merged
        group = merged


def test_a_final_kernel_takes_its_groups_model_only_when_its_statements_match():
    graph = simplify_graph(decompose_graph(_matmul_chain()))
    models = GroupModels(graph)
    a, b, c = (n.name for n in graph.nodes[:3])
    (ab,) = build_kernels(graph, ((a, b),))
    models.merged(ab, (a,), (b,))
    known = models.known(ab)
    assert known is not None
    want = compute_dependences(build_model(
        ab.statements, {x.tensor: x.c_name for x in ab.arrays}, models.ctx), siblings_only=True)
    for field in FIELDS:
        assert getattr(known, field).is_equal(getattr(want, field)), field
    (abc,) = build_kernels(graph, ((a, b, c),))
    assert models.known(abc) is None  # never modelled
    (other,) = build_kernels(graph, ((b, c),))
    assert models.known(other) is None


def test_compiled_kernels_run_the_dataflow_only_where_no_proposal_modelled_them(monkeypatch):
    """A softmax is one group grown by proposals isl answers (its row reductions): its
    kernel's passes take the oracle's model; its output still matches the reference
    executor."""
    import numpy as np

    from polyc.compiler import compile
    from polyc.graph.reference import run_reference
    from polyc.schedule_tree import passes

    b = GraphBuilder("sm")
    graph = b.build([b.softmax(b.input("x", [16, 40]), axis=-1)])
    calls = []
    real = passes.compute_dependences
    monkeypatch.setattr(passes, "compute_dependences",
                        lambda m, **kw: calls.append(m) or real(m, **kw))
    result = compile(graph, "cpu")
    assert len(result.kernels) == 1 and calls == []
    inputs = {"x": np.random.default_rng(0).standard_normal((16, 40), dtype=np.float32)}
    want = run_reference(graph, inputs)
    got = result(**inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
