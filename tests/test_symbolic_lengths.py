"""Symbolic dims that are reduced over or become lengths: one compile, every size.

A mean over a symbolic axis multiplies by 1/N, computed in the kernel from the bound
parameter; attention over a symbolic sequence length reduces over it and (causal)
compares positions 0..L-1 made per call; a fused row as long as a symbol lives in a
buffer each thread allocates. Each compiled graph is compared with the reference
executor at several sizes, among them 1 and a small odd one.
"""
from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc import compiler
from polyc.errors import GraphError
from polyc.graph.load import load_graph
from polyc.graph.reference import random_inputs, run_reference
from polyc.graph.symbols import Iota, Reciprocal, symbol
from polyc.kernel.generalise import NotGeneral, generalise
from polyc.targets.cpu import CpuBackend, cpu_machine

PROBES = [{"N": 1009}, {"N": 1013}, {"N": 1019}]


def _check(doc, sizes, *, rtol=1e-4, atol=1e-5):
    """Compile `doc` once; at each {symbol: value} of `sizes`, outputs as the reference's."""
    graph = load_graph(doc)
    compiled = polyc.compile(graph)
    for values in sizes:
        inputs = random_inputs(graph, seed=sum(values.values()), symbols=values)
        got, want = compiled(**inputs), run_reference(graph, inputs)
        for name in graph.outputs:
            assert got[name].shape == want[name].shape
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol,
                                       err_msg=f"{name} at {values}")
    return compiled


def _one(op, shapes, attrs=None, symbols=None):
    names = [f"x{k}" for k in range(len(shapes))]
    return {"name": op, "inputs": [{"name": n, "shape": s} for n, s in zip(names, shapes)],
            "nodes": [{"op": op, "inputs": names, "outputs": ["y"], "attrs": attrs or {},
                       "name": "n"}],
            "outputs": ["y"], "symbols": symbols or {"N": {"min": 1, "max": 1 << 16}}}


# --- a mean's 1/N ---------------------------------------------------------------------

@pytest.mark.parametrize("op, shapes, attrs", [
    ("reduce_mean", [[6, "N"]], {"axes": [1]}),
    ("reduce_mean", [["N", 5]], {"axes": [0], "keepdims": True}),
    ("variance", [[3, "N"]], {"axes": [1]}),
    ("layer_norm", [[4, "N"], ["N"], ["N"]], {}),
    ("rms_norm", [[4, "N"], ["N"]], {}),
    ("log_softmax", [[4, "N"]], {}),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_norm_over_a_symbolic_axis(op, shapes, attrs):
    compiled = _check(_one(op, shapes, attrs), [{"N": 1}, {"N": 7}, {"N": 300}])
    if op != "log_softmax":  # the factor comes from the bound N, never a constant
        assert "(1.0 / (double)(polyc_sym_N))" in compiled.c_source


def test_a_mean_over_two_symbols_is_refused_naming_the_factor():
    """1/(N*M) is no affine function's reciprocal: refused, naming the constant."""
    with pytest.raises(GraphError) as e:
        polyc.compile(_one("reduce_mean", [["N", "M"]], {},
                           {"N": {"min": 1, "max": 64}, "M": {"min": 1, "max": 64}}),
                      build=False)
    assert "field 'symbols'" in str(e.value) and "constants" in str(e.value)


# --- attention over a symbolic length -------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_attention_over_a_symbolic_length(causal):
    doc = {"name": "att", "inputs": [{"name": n, "shape": [2, "L", 16]} for n in "qkv"],
           "nodes": [{"op": "attention", "inputs": ["q", "k", "v"], "outputs": ["y"],
                      "attrs": {"causal": causal}}],
           "outputs": ["y"], "symbols": {"L": {"min": 1, "max": 4096}}}
    compiled = _check(doc, [{"L": 1}, {"L": 7}, {"L": 100}])
    assert "int64_t polyc_sym_L" in compiled.c_source


PROJ_ATT = {"name": "proj_att", "inputs": [{"name": "x", "shape": ["L", 64]},
                                           {"name": "w", "shape": [64, 64]}],
            "nodes": [{"op": "matmul", "inputs": ["x", "w"], "outputs": ["q"]},
                      {"op": "attention", "inputs": ["q", "x", "x"], "outputs": ["y"]}],
            "outputs": ["y"], "symbols": {"L": {"min": 1, "max": 4096}}}


def test_a_kernel_planned_by_its_length_alone_runs_the_portable_loops(monkeypatch):
    """Attention's scores with their softmax keep all L columns in one block, which no
    block of the memory model holds for every L up to 4096: that kernel, not the whole
    graph, runs without microkernels; the projection before it and P @ V keep theirs.
    The probes at L = 1009, 1013, 1019 are compiled with balanced tiles, then without,
    then with the scores kernel portable: fusion reads none of that, and runs once each.
    L2 is pinned to 1 MiB: the rows of scores a block holds follow it, and with them where
    the probes first disagree (the scores' tree on a 2 MiB L2 and a 6-row kernel) or
    whether a 14-row kernel has a tail at all (not on 512 KiB)."""
    pinned = cpu_machine().with_capacity("L2", 1 << 20)
    monkeypatch.setattr(CpuBackend, "machine", lambda self: pinned)
    fused = []
    real = compiler.plan_fusion
    monkeypatch.setattr(compiler, "plan_fusion", lambda g, *rest: fused.append(
        tuple(t.type.shape for t in g.inputs)) or real(g, *rest))
    compiled = _check(PROJ_ATT, [{"L": 1}, {"L": 100}, {"L": 1100}])
    mapped = {k.name: bool(k.microkernels) for k in compiled.kernels}
    assert mapped == {"polyc_k0_q": True, "polyc_k1_y_scores": False, "polyc_k2_y": True}
    report = "\n".join(compiled.kernels[0].fusion_report)
    assert "kernel polyc_k1_y_scores without microkernels, the portable loops instead " \
           "(before, kernel polyc_k1_y_scores's gemm plan depended on the sizes)" in report
    assert {(1009, 64), (1013, 64), (1019, 64)} <= {shapes[0] for shapes in fused}
    assert len(fused) == len(set(fused))


def test_attention_with_two_lengths():
    doc = {"name": "cross", "inputs": [{"name": "q", "shape": ["Q", 8]},
                                       {"name": "k", "shape": ["K", 8]},
                                       {"name": "v", "shape": ["K", 8]}],
           "nodes": [{"op": "attention", "inputs": ["q", "k", "v"], "outputs": ["y"],
                      "attrs": {"causal": True}}],
           "outputs": ["y"], "symbols": {"Q": {"min": 1, "max": 512}, "K": {"min": 1, "max": 512}}}
    _check(doc, [{"Q": 1, "K": 1}, {"Q": 7, "K": 3}, {"Q": 5, "K": 40}])


def test_attention_lengths_that_never_agree_are_a_load_error():
    doc = {"inputs": [{"name": "q", "shape": ["L", 8]}, {"name": "k", "shape": ["L", 8]},
                      {"name": "v", "shape": ["M", 8]}],
           "nodes": [{"op": "attention", "inputs": ["q", "k", "v"], "outputs": ["y"],
                      "name": "att"}],
           "outputs": ["y"], "symbols": {"L": {"min": 1, "max": 8}, "M": {"min": 9, "max": 64}}}
    with pytest.raises(GraphError) as e:
        load_graph(doc)
    assert "node 'att' (attention)" in str(e.value)


def test_attention_lengths_that_disagree_at_call_time_name_the_node():
    doc = {"inputs": [{"name": "q", "shape": ["L", 8]}, {"name": "k", "shape": ["L", 8]},
                      {"name": "v", "shape": ["M", 8]}],
           "nodes": [{"op": "attention", "inputs": ["q", "k", "v"], "outputs": ["y"],
                      "name": "att"}],
           "outputs": ["y"], "symbols": {"L": {"min": 1, "max": 64}, "M": {"min": 1, "max": 64}}}
    compiled = polyc.compile(doc)
    x = np.ones((5, 8), np.float32)
    assert compiled(q=x, k=x, v=x)["y"].shape == (5, 8)
    with pytest.raises(GraphError) as e:
        compiled(q=x, k=x, v=np.ones((6, 8), np.float32))
    assert "node 'att' (attention)" in str(e.value) and "L=5, M=6" in str(e.value)


# --- a per-thread buffer as long as a symbol ------------------------------------------

def test_a_row_as_long_as_a_symbol_is_allocated_per_thread():
    """layer_norm over [16, N] keeps x - mean in a row buffer of N floats per thread:
    on the heap (N = 40000 is past any stack buffer's limit), one per thread."""
    compiled = _check(_one("layer_norm", [[16, "N"]]), [{"N": 1}, {"N": 7}, {"N": 40000}])
    assert "malloc(sizeof(float) * (size_t)(polyc_sym_N))" in compiled.c_source
    assert "#pragma omp for" in compiled.c_source


def test_a_softmax_fused_after_its_matmul_over_a_symbolic_axis():
    doc = {"name": "mm_softmax", "inputs": [{"name": "x", "shape": [64, 32]},
                                            {"name": "w", "shape": [32, "N"]}],
           "nodes": [{"op": "matmul", "inputs": ["x", "w"], "outputs": ["h"]},
                     {"op": "softmax", "inputs": ["h"], "outputs": ["y"]}],
           "outputs": ["y"], "symbols": {"N": {"min": 1, "max": 8192}}}
    _check(doc, [{"N": 1}, {"N": 7}, {"N": 333}])


# --- generalising values --------------------------------------------------------------

def test_generalise_fits_a_reciprocal_of_an_affine_count():
    n = symbol("N")
    got = generalise([1 / 1009, 1 / 1013, 1 / 1019], PROBES, "c")
    assert got == Reciprocal(n)
    got = generalise([1 / (64 * 1009), 1 / (64 * 1013), 1 / (64 * 1019)], PROBES, "c")
    assert got == Reciprocal(64 * n)


@pytest.mark.parametrize("values", [
    [1009 ** -0.5, 1013 ** -0.5, 1019 ** -0.5],  # 1/sqrt(N): not 1/affine
    [1 / 1009, 1 / 1013, 1 / 1020],  # 1/N, but not at the last probe
    [0.5, 0.25, -1.0],
])
def test_generalise_refuses_other_floats(values):
    with pytest.raises(NotGeneral) as e:
        generalise(values, PROBES, "the constant")
    assert "the constant" in str(e.value)


def test_generalise_fits_positions_as_an_iota():
    got = generalise([tuple(range(p["N"])) for p in PROBES], PROBES, "data")
    assert got == Iota(symbol("N"))
    with pytest.raises(NotGeneral):
        generalise([tuple(range(1, p["N"] + 1)) for p in PROBES], PROBES, "data")
