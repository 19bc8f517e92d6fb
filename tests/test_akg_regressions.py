"""Bugs the AKG corpus found, as small graphs: each compiled kernel is checked against the
reference executor (and the fusion it should get, where that was the bug)."""
from __future__ import annotations

import numpy as np

import polyc
from polyc.graph.reference import random_inputs, run_reference


def _check(graph, rtol=1e-5):
    compiled = polyc.compile(graph)
    inputs = random_inputs(graph, 5)
    got, ref = compiled(**inputs), run_reference(graph, inputs)
    for name, r in ref.items():
        scale = max(1.0, float(np.abs(r).max()))
        np.testing.assert_allclose(got[name].astype(np.float64), r.astype(np.float64),
                                   rtol=rtol, atol=rtol * scale, err_msg=name)
    return compiled


def test_buffers_under_a_loop_of_one_iteration_are_not_per_thread():
    # sponge: broadcast [1, N, 1] -> [1, N, 3] fused under a loop of extent 1 became
    # per-thread buffers written in one parallel loop and read in another (garbage)
    b = polyc.GraphBuilder("sponge")
    x, y, z = b.input("x", [1, 4430, 1]), b.input("y", [1, 4430, 3]), b.input("z", [1, 4430, 3])
    m = b.mul(z, b.mul(b.broadcast_to(x, shape=[1, 4430, 3]), y))
    _check(b.build([m, b.neg(m)]))


def test_whole_reduction_of_a_tensor_with_a_leading_one_does_not_race():
    # cyclegan: the parallel mark of the dropped loop of one iteration landed on the
    # channel loop, which carries the reduction
    b = polyc.GraphBuilder("cyclegan")
    x, y = b.input("x", [1, 3, 256, 256]), b.input("y", [1, 3, 256, 256])
    t = b.tanh(x)
    d = b.sub(t, y)
    total = b.reshape(b.reduce_sum(b.abs(d)), shape=[1])
    graph = b.build([b.reshape(t, shape=[1, 3, 256, 256]), d, total])
    for _ in range(3):  # lost updates are likely, not certain, in one run
        _check(graph, rtol=1e-4)


def test_float16_ops_round_each_result():
    # bert: gcc turned float16 -> float32 -> op -> float16 into float16 ops and, with
    # -fassociative-math, computed x * (y * z) as (x * y) * z
    b = polyc.GraphBuilder("bert")
    x, y = b.input("x", [64, 96], "float16"), b.input("y", [64, 1], "float16")
    z = b.input("z", [64, 96], "float16")
    out = b.cast(b.mul(x, b.mul(y, z)), to="float32")
    _check(b.build([out]), rtol=0)


def test_loops_of_one_iteration_are_shared():
    b = polyc.GraphBuilder("unit")
    x, y = b.input("x", [1, 581, 3]), b.input("y", [1, 581, 3])
    compiled = _check(b.build([b.reduce_sum(b.mul(x, y), axes=[2])]))
    assert len(compiled.kernels) == 1


def test_a_scalar_chain_joins_the_loop_that_broadcasts_it():
    b = polyc.GraphBuilder("lamb")
    lr, ratio, v = b.input("lr", [1]), b.input("ratio", [1]), b.input("v", [1024])
    step = b.minimum(b.mul(lr, ratio), b.constant("cap", [1], [10.0]))
    compiled = _check(b.build([b.sub(v, b.mul(step, v))]))
    assert len(compiled.kernels) == 1
    assert any("no loop is shared, but" in line for line in compiled.fusion.report)


def test_a_scalar_chain_runs_before_a_large_broadcast_in_one_kernel():
    # bert's gradient clipping: a [1, 1] chain shared its loop of one iteration with the
    # [1, 1024, 4096] division it feeds, so one iteration touched 32 MiB and the oracle
    # kept them apart; in sequence the scalar runs once and the division keeps its loops
    b = polyc.GraphBuilder("clip")
    norm, x = b.input("norm", [1, 1]), b.input("x", [1024, 4096])
    s = b.maximum(b.sqrt(b.abs(norm)), b.constant("eps", [1], [1e-6]))
    compiled = _check(b.build([b.div(x, b.reshape(s, shape=[1, 1, 1]))]))
    assert len(compiled.kernels) == 1
    assert "computes at most 64 values" in "\n".join(compiled.kernels[0].fusion_report)


def test_a_reduction_over_a_unit_axis_shares_its_loops_with_its_readers():
    # cyclegan / sponge: a sum over the axes [0, 2, 3] of [1, C, H, W] iterated its unit
    # batch axis first, so the per-channel reshapes after it took a kernel of their own
    b = polyc.GraphBuilder("channel_sums")
    x = b.input("x", [1, 16, 20, 24])
    s = b.reduce_sum(x, axes=[0, 2, 3])
    compiled = _check(b.build([b.reshape(s, shape=[16]), b.neg(s)]))
    assert len(compiled.kernels) == 1


def test_a_small_producer_shares_the_channel_loop_of_its_broadcast():
    # cyclegan's BiasAdd: the bias reshaped to [C, 1, 1] loops over C first, the image
    # over its batch of one (it once ran in sequence before the add, 1/961 of the
    # work); every dependence keeps the channel, so both share its loop, the bias a
    # scalar per channel
    b = polyc.GraphBuilder("bias_add")
    x, bias = b.input("x", [1, 512, 31, 31]), b.input("bias", [512])
    compiled = _check(b.build([b.add(x, b.reshape(bias, shape=[512, 1, 1]))]))
    assert len(compiled.kernels) == 1
    report = "\n".join(compiled.kernels[0].fusion_report)
    assert "legal at depth 1" in report
    assert "reshape_1 (float32[512,1,1]) is not materialised in memory" in report


def test_a_scalar_set_under_an_if_and_selected_after_it_is_not_miscompiled():
    # AKG's concat.info: with AVX-512, gcc 12's if-conversion loaded the second input's
    # first rows as zeros in `if (i < 4) t = a[i] * 2; out = i < 4 ? t : b[i - 4] + 1`
    b = polyc.GraphBuilder("concat")
    x, y = b.input("x", [4, 2]), b.input("y", [8, 2])
    two, one = b.constant("two", [1], [2.0]), b.constant("one", [1], [1.0])
    compiled = _check(b.build([b.concat(b.mul(x, two), b.add(y, one), axis=0)]), rtol=0)
    assert 'optimize("no-tree-loop-if-convert")' in compiled.c_source


def test_a_streamed_loop_that_the_ast_split_keeps_its_copy_without_the_output():
    # transformer's softmax in the NZ layout: the loop marked to stream its output was
    # split by the AST build into a copy writing only a local, whose stage buffer was
    # printed with no type and no address (`None polyc_stage[256]`): gcc failed
    b = polyc.GraphBuilder("softmax_nz_out")
    x = b.input("x", [16, 16, 128, 128])
    nz = [b.transpose(b.reshape(t, shape=[16, 16, 8, 16, 8, 16]), perm=[0, 1, 4, 2, 3, 5])
          for t in (x, b.cast(x, to="float16"))]
    compiled = _check(b.build(nz), rtol=0)
    assert "polyc_stream(" in compiled.c_source
