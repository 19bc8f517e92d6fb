"""Fusion with feedback from the schedule-tree engine: what fuses, what does not and why.

Each composite opened into primitives must end up as the kernels DESIGN.md promises, with
its intermediates in small buffers, and the oracle must refuse with a reason what cannot
share loops. Every compiled result is also checked against the reference.
"""
from __future__ import annotations

from dataclasses import replace

import islpy as isl
import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.compiler import Options, compile
from polyc.graph.decompose import decompose_graph
from polyc.graph.fuse import fuse_graph
from polyc.graph.reference import run_reference
from polyc.graph.simplify import simplify_graph
from polyc.kernel.comprehension import loads
from polyc.schedule_tree.oracle import ask_fusion
from polyc.targets.cpu import cpu_machine
from polyc.targets.cpu.plan import microkernel_name


def _microkernels(kernel, flops):  # the cpu backend's answer to the oracle
    return microkernel_name(kernel, cpu_machine(), flops)


def _check(graph, compiled):
    # inputs of the graph alone (not of the tests run before it in this process), and an
    # absolute tolerance on the scale of the result: a sum of 72 products near 10 is
    # off by 1e-5 in float32 when the compiler adds in another order
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.uniform(-2, 2, t.type.shape).astype(t.type.dtype) for t in graph.inputs}
    got, want = compiled(**inputs), run_reference(graph, inputs)
    for name in want:
        scale = max(1.0, float(np.max(np.abs(want[name]), initial=0.0)))
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5 * scale)


def _reads_of(kernel, tensor):
    """How many statements of the kernel load `tensor`: how often it is read per element."""
    return sum(any(ld.tensor == tensor for ld, _ in loads(s.expr)) for s in kernel.statements)


def _single(op, shape, **attrs):
    b = GraphBuilder(op)
    x = b.input("x", shape)
    ins = [x]
    if op in ("layer_norm", "rms_norm"):
        ins.append(b.input("gamma", shape[-1:]))
    if op == "layer_norm":
        ins.append(b.input("beta", shape[-1:]))
    return b.build([b.op(op, *ins, out="y", **attrs)])


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
def test_row_composites_become_one_kernel_reading_x_at_most_twice(op):
    graph = _single(op, [64, 96])
    compiled = compile(graph)
    assert len(compiled.kernels) == 1
    (k,) = compiled.kernels
    assert _reads_of(k.kernel, "x") <= 2
    # every intermediate lives in a buffer no larger than a row
    locals_ = [a for a in k.kernel.arrays if a.role == "local"]
    assert locals_ and all(a.kept is not None and np.prod(a.buffer_shape) <= 96 for a in locals_)
    assert any("not materialised in memory" in line for line in k.fusion_report)
    _check(graph, compiled)


def _column_norm(shape, axis):
    """x normalised over `axis` (a batch-norm's statistics), from composites."""
    b = GraphBuilder("colnorm")
    x = b.input("x", shape)
    mean = b.op("reduce_mean", x, axes=[axis], keepdims=True)
    var = b.op("variance", x, axes=[axis], keepdims=True)
    eps = b.constant("eps", [1], [1e-5])
    return b.build([b.op("div", b.op("sub", x, mean), b.op("sqrt", b.op("add", var, eps)),
                         out="y")])


def test_a_row_kernel_over_a_3d_tensor_keeps_its_row_scalars():
    """Rows of a 3-d tensor are a band of two loops whose iterations share no element:
    its tiles gained nothing, and their point loops left a row's max, sum and log no
    buffer to be contracted into (the log computed again for every element: 5x slower
    than the same rows as a 2-d tensor). The band stays whole; the scalars are scalars."""
    graph = _single("log_softmax", [64, 512, 128], axis=-1)
    compiled = compile(graph)
    (k,) = compiled.kernels
    report = "\n".join(k.fusion_report)
    for t in ("y.max", "y.sum", "y.log"):
        assert f"{t} (float32[64,512,1]) is not materialised in memory" in report, report
    _check(graph, compiled)


def _channel_scale(shape):
    b = GraphBuilder("channel_scale")
    x, gamma, beta = b.input("x", shape), b.input("gamma", shape[1:2]), b.input("beta", shape[1:2])
    per_channel = [shape[1], 1, 1]
    return b.build([b.add(b.mul(x, b.reshape(gamma, shape=per_channel)),
                          b.reshape(beta, shape=per_channel), out="y")])


@pytest.mark.parametrize("graph", [
    _single("softmax", [12, 10, 40], axis=0),
    _single("variance", [12, 10, 40], axes=[0, 2]),
    _channel_scale([2, 10, 5, 7]),
], ids=["softmax-axis-0", "variance-axes-0-2", "channel-scale"])
def test_a_kernel_shares_the_axes_every_dependence_keeps(graph):
    """An axis every dependence keeps (the middle one of a softmax over the first, the
    channels of a batch norm's scale and shift) is a loop all of a fused kernel's
    statements share, outermost, so one iteration touches one value of it; a variance
    over axes 0 and 2 was three kernels, its sums over all of x each."""
    compiled = compile(graph)
    assert len(compiled.kernels) == 1, [k.kernel.nodes for k in compiled.kernels]
    (k,) = compiled.kernels
    outer = k.schedule.get_root().child(0)
    while outer.get_type() != isl.schedule_node_type.band:
        outer = outer.child(0)
    first = str(outer.band_get_partial_schedule().get_union_pw_aff(0))
    assert "-> [(i1)]" in first, first  # the kept axis, in every statement's own level
    assert outer.band_member_get_coincident(0)
    assert any("its outer loop over an axis every dependence keeps" in line
               for line in k.fusion_report), k.fusion_report
    _check(graph, compiled)


@pytest.mark.parametrize("op,shape,axis", [
    ("softmax", [64, 96], 0), ("log_softmax", [64, 96], 0), ("softmax", [6, 40, 96], 1),
    ("log_softmax", [6, 40, 96], 1), ("softmax", [6, 5, 7], 0), ("softmax", [300, 3], 0),
    ("norm", [64, 96], 0), ("norm", [5, 64, 48], 1)])
def test_column_composites_become_one_kernel_of_column_blocks(op, shape, axis):
    """A reduction over a leading or middle axis shares no loop with its consumers in
    the nodes' own order, but every dependence keeps the column: the oracle answers with
    column blocks, and the kernel's passes run down the rows inside each block."""
    graph = _column_norm(shape, axis) if op == "norm" else _single(op, shape, axis=axis)
    compiled = compile(graph)
    assert len(compiled.kernels) == 1, [k.kernel.nodes for k in compiled.kernels]
    (k,) = compiled.kernels
    fused = [line for line in k.fusion_report if line.startswith("vertical: fused")]
    # elementwise nodes over x's shape (softmax's shifted and exp) join each other point
    # by point, every loop shared; a reduction joins in column blocks
    blocked = [line for line in fused if "the columns in blocks of" in line]
    assert blocked and all(line in blocked or f"legal at depth {len(shape)}, permutable" in line
                           for line in fused), k.fusion_report
    assert 'mark: "column_block ' in k.to_json()["schedule_text"]
    # nothing the size of x is stored: what a block's later pass needs is recomputed
    # (a buffer is not contracted where the blocks' loop runs once: nothing to save)
    size = graph.types[graph.inputs[0].name].size
    locals_ = [a for a in k.kernel.arrays if a.role == "local"]
    assert all(a.kept is not None or a.type.size < size for a in locals_), \
        [(a.tensor, a.kept) for a in locals_]
    _check(graph, compiled)


def test_gelu_of_linear_is_one_kernel_with_the_matmul():
    b = GraphBuilder("linear_gelu")
    x, w, bias = b.input("x", [32, 48]), b.input("w", [48, 40]), b.input("b", [40])
    graph = b.build([b.gelu(b.linear(x, w, bias), approximate="tanh", out="y")])
    compiled = compile(graph)
    assert len(compiled.kernels) == 1
    assert _reads_of(compiled.kernels[0].kernel, "x") == 1
    _check(graph, compiled)


def test_an_elementwise_chain_joins_a_contraction_as_one_group(monkeypatch):
    """gelu's nodes are pointwise: they are grouped first, without isl, so isl is asked
    about the matmul's group twice (its bias, then the whole chain), not once for each
    node the chain would join it one at a time."""
    import polyc.schedule_tree.oracle as oracle
    asked = []
    isl_answer = oracle._isl_answer
    monkeypatch.setattr(oracle, "_isl_answer", lambda graph, a, b, *rest, **kw: (
        asked.append((a, b)), isl_answer(graph, a, b, *rest, **kw))[1])
    b = GraphBuilder("linear_gelu")
    x, w, bias = b.input("x", [32, 48]), b.input("w", [48, 40]), b.input("b", [40])
    graph = b.build([b.gelu(b.linear(x, w, bias), approximate="tanh", out="y")])
    compiled = compile(graph, build=False)
    assert len(compiled.kernels) == 1 and len(asked) == 2, asked


def test_attention_is_at_most_two_kernels():
    b = GraphBuilder("attention")
    q, k, v = (b.input(n, [2, 16, 8]) for n in "qkv")
    graph = b.build([b.attention(q, k, v, causal=True, out="y")])
    compiled = compile(graph)
    assert len(compiled.kernels) <= 2
    _check(graph, compiled)


def test_causal_attention_folds_its_mask_into_the_scores_epilogue():
    # the mask (a compare of two iotas, [L, L] broadcast over heads) is computed in the
    # scores' write-back from the tile's row and column, and the softmax runs on each
    # block of rows of the scores once it is final, then the product with v: one kernel
    b = GraphBuilder("attention")
    q, k, v = (b.input(n, [2, 128, 64]) for n in "qkv")
    graph = b.build([b.attention(q, k, v, causal=True, out="y")])
    compiled = compile(graph)
    assert [k.kernel.nodes for k in compiled.kernels] == [(
        "y.scores", "y.scaled", "y.mask", "y.masked", "y.max", "y.shifted", "y.exp", "y.sum",
        "y.inv_sum", "y.unscaled", "y")]
    scores = compiled.kernels[0]
    assert any(line.startswith("microkernel S") for line in scores.fusion_report)
    assert any("folded into the epilogue of" in line for line in scores.fusion_report)
    assert "y.mask" not in {a.tensor for a in scores.kernel.arrays}
    _check(graph, compiled)


@pytest.mark.parametrize("epilogue", ["iota_mask", "doubled_bias"])
def test_an_elementwise_tensor_read_by_a_matmul_epilogue_is_folded_into_it(epilogue):
    # computed over fewer dims than the matmul's output, it is no epilogue statement of
    # its own: folded, the kernel is again a contraction with an elementwise epilogue
    b = GraphBuilder("epilogue")
    x, w = b.input("x", [2, 96, 128]), b.input("w", [128, 160])
    h = b.matmul(x, w)
    if epilogue == "iota_mask":  # a causal-like mask over rows and columns, not batches
        rows = b.constant("rows", [96, 1], list(range(96)), "int32")
        cols = b.constant("cols", [1, 160], list(range(160)), "int32")
        zero = b.constant("zero", [], [0.0])
        y = b.select(b.greater(cols, rows, out="m"), zero, h, out="y")
    else:
        bias = b.mul(b.input("bias", [160]), b.constant("two", [], [2.0]), out="m")
        y = b.add(h, bias, out="y")
    graph = b.build([y])
    compiled = compile(graph)
    (kernel,) = compiled.kernels
    assert any(line.startswith("microkernel S") for line in kernel.fusion_report)
    assert "m" not in {s.target for s in kernel.kernel.statements}
    _check(graph, compiled)


def test_the_report_records_each_proposal_with_its_reason():
    compiled = compile(_single("softmax", [16, 32]))
    report = compiled.kernels[0].fusion_report
    assert any(line.startswith("vertical: fused {y.shifted, y.exp} into y.max: legal at depth 1")
               for line in report), report
    assert all("footprint" in line for line in report if "fused" in line)


def _oracle(graph, a, b):
    g = simplify_graph(decompose_graph(graph))
    return ask_fusion(g, a, b, cpu_machine(), _microkernels)


def test_oracle_rejects_a_consumer_of_a_whole_reduction():
    b = GraphBuilder("t")
    x = b.input("x", [64, 64])
    graph = b.build([b.sub(x, b.reduce_sum(x, out="s"), out="y")])
    answer = _oracle(graph, ("s",), ("y",))
    assert not answer.legal and answer.depth == 0
    assert "needs the producer's for several values" in answer.reason


def test_oracle_rejects_a_transposed_read_in_the_producers_loop_order():
    b = GraphBuilder("t")
    x = b.input("x", [48, 80])
    graph = b.build([b.op("transpose", b.relu(x, out="r"), out="y", perm=[1, 0])])
    answer = _oracle(graph, ("r",), ("y",))
    assert not answer.legal and "transposed read" in answer.reason
    compiled = compile(graph)
    assert len(compiled.kernels) == 2
    _check(graph, compiled)


def test_oracle_rejects_a_fusion_whose_footprint_exceeds_the_cache():
    # rows of 4 Mi floats: one shared iteration touches 32 MiB, more than L2
    b = GraphBuilder("t")
    x = b.input("x", [2, 1 << 22])
    graph = b.build([b.sub(x, b.reduce_max(x, axes=[1], keepdims=True, out="m"), out="y")])
    answer = _oracle(graph, ("m",), ("y",))
    assert answer.legal and answer.depth == 1 and not answer.profitable
    assert "more than L2" in answer.reason
    plan = fuse_graph(simplify_graph(decompose_graph(graph)),
                      lambda g, a, b: ask_fusion(g, a, b, cpu_machine(), _microkernels))
    assert plan.groups == (("m",), ("y",))


def test_oracle_rejects_siblings_that_traverse_their_input_differently():
    # a transpose and an elementwise op of one input share no reuse along any loop
    b = GraphBuilder("t")
    x = b.input("x", [32, 32])
    graph = b.build([b.op("transpose", x, perm=[1, 0], out="t"), b.exp(x, out="e")])
    answer = _oracle(graph, ("t",), ("e",))
    assert not answer.legal
    assert "traverse it differently" in answer.reason


def test_a_column_sum_and_a_row_sum_read_their_input_once():
    # both walk x row by row (the reduced axes stay in place): one nest, x read once
    b = GraphBuilder("t")
    x = b.input("x", [32, 48])
    graph = b.build([b.reduce_sum(x, axes=[0], out="cols"), b.reduce_sum(x, axes=[1], out="rows")])
    answer = _oracle(graph, ("cols",), ("rows",))
    assert answer.legal and answer.depth == 2 and answer.saved_bytes == 32 * 48 * 4
    compiled = compile(graph)
    assert len(compiled.kernels) == 1
    _check(graph, compiled)


def test_oracle_accepts_siblings_reading_one_input_alike():
    b = GraphBuilder("t")
    x = b.input("x", [32, 48])
    graph = b.build([b.exp(x, out="e"), b.neg(x, out="n")])
    answer = _oracle(graph, ("e",), ("n",))
    assert answer.legal and answer.depth == 2 and answer.saved_bytes == 32 * 48 * 4
    assert len(compile(graph).kernels) == 1


def test_a_cycle_through_a_third_kernel_is_never_proposed():
    # an oracle that keeps m on its own; y reads both e and m: fusing e with y would put
    # e's kernel on both sides of m's, so that pair is never asked
    b = GraphBuilder("t")
    x = b.input("x", [16, 24])
    e = b.exp(x, out="e")
    m = b.reduce_sum(e, axes=[0], out="m")
    graph = simplify_graph(decompose_graph(b.build([b.sub(e, m, out="y")])))
    asked = []

    def oracle(g, a, b):
        asked.append({*a, *b})
        real = ask_fusion(g, a, b, cpu_machine(), _microkernels)
        if "m" in a + b:
            return replace(real, legal=False, reason="kept apart by this test")
        return real

    plan = fuse_graph(graph, oracle)
    assert "vertical: y + e: rejected: another kernel sits between them (fusing would " \
           "create a cycle)" in plan.report
    assert {"e", "y"} not in asked and ("m",) in plan.groups


def test_fusion_can_be_turned_off():
    graph = _single("softmax", [8, 8])
    assert len(compile(graph, options=Options(fuse=False), build=False).kernels) == 6


def test_tiling_fits_the_tile_level_and_stays_correct():
    b = GraphBuilder("t")
    x = b.input("x", [512, 384])
    graph = b.build([b.transpose(x, out="y")])
    compiled = compile(graph)
    text = compiled.kernels[0].to_json()["schedule_text"]
    assert "mod" in text  # a tile band and a point band
    _check(graph, compiled)
    explicit = compile(graph, options=Options(tile_sizes=(16, 64)))
    assert "mod 16" in explicit.kernels[0].to_json()["schedule_text"]
    _check(graph, explicit)


def test_a_nan_survives_vectorised_max_and_min_reductions():
    # the three reductions share one SIMD loop with one accumulator per lane; OpenMP does
    # not say what max/min make of a NaN when lanes combine, so polyc keeps a NaN flag
    b = GraphBuilder("t")
    x = b.input("x", [16, 300])
    e = b.exp(x)
    graph = b.build([b.reduce_max(e, axes=[1], out="hi"), b.reduce_min(e, axes=[1], out="lo"),
                     b.reduce_sum(e, axes=[1], out="s")])
    compiled = compile(graph)
    assert "reduction(|:" in compiled.c_source
    xs = np.random.default_rng(1).uniform(-1, 1, (16, 300)).astype(np.float32)
    xs[3, 100] = xs[7, 299] = np.nan
    got, want = compiled(x=xs), run_reference(graph, {"x": xs})
    for name in ("hi", "lo", "s"):
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(want[name]))
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4)


@pytest.mark.parametrize("op,width", [("softmax", 1024), ("layer_norm", 1000),
                                      ("rms_norm", 300)])
def test_a_reduction_pass_over_a_row_prefetches_the_next_row(op, width):
    graph = _single(op, [64, width])  # large enough for threads over rows
    compiled = compile(graph)
    assert "omp parallel for" in compiled.c_source
    assert f"__builtin_prefetch(&t0_x[((c0 + 1)) * {width}" in compiled.c_source
    _check(graph, compiled)


def test_a_small_convolution_keeps_its_microkernel():
    # a small CNN's first conv (442 KFLOP, under the 1 MFLOP a matmul needs to keep its
    # microkernel) fused with the batch norm and conv after it, as plain loops over 3-wide
    # windows: 5x slower than both convs on the microkernel
    b = GraphBuilder("cnn")
    x, w1 = b.input("x", [1, 3, 32, 32]), b.input("w1", [8, 3, 3, 3])
    w2 = b.input("w2", [16, 8, 3, 3])
    h = b.relu(b.op("conv2d", x, w1, pads=[1, 1, 1, 1], out="c1"), out="r")
    graph = b.build([b.op("conv2d", h, w2, pads=[1, 1, 1, 1], strides=[2, 2], out="c2")])
    compiled = compile(graph)
    convs = [k for k in compiled.kernels if {"c1", "c2"} & set(k.kernel.nodes)]
    assert all(any(line.startswith("microkernel S") for line in k.fusion_report)
               for k in convs), [k.fusion_report for k in convs]
    _check(graph, compiled)
