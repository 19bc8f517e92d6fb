"""graph.decompose: composites become primitives that compute the same tensors."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st


from polyc.compiler import compile
from polyc.graph import Graph, GraphBuilder, load_graph
from polyc.graph.decompose import decompose_graph
from polyc.graph.ops import OPS
from polyc.graph.reference import run_reference
from polyc.graph.verify import verify_graph


def check_well_formed(g: Graph) -> None:
    verify_graph(g, "test")


# One graph per composite op and variant: (builder of its graph, input shapes).
def _unary(op, shape, **attrs):
    def build(b):
        return [b.op(op, b.input("x", shape), out="y", **attrs)]
    return build


def _layer_norm(shape, axis, n_affine):
    def build(b):
        x = b.input("x", shape)
        affine = [b.input(p, shape[axis:]) for p in ("gamma", "beta")[:n_affine]]
        return [b.layer_norm(x, *affine, axis=axis, epsilon=1e-3, out="y")]
    return build


def _rms_norm(shape, gamma):
    def build(b):
        x = b.input("x", shape)
        extra = [b.input("gamma", shape[-1:])] if gamma else []
        return [b.rms_norm(x, *extra, out="y")]
    return build


def _batch_norm(shape):
    def build(b):
        params = [b.input(p, shape[1:2]) for p in ("scale", "bias", "mean", "var")]
        return [b.batch_norm(b.input("x", shape), *params, out="y")]
    return build


def _linear(bias):
    def build(b):
        x, w = b.input("x", [3, 4, 5]), b.input("w", [5, 6])
        extra = [b.input("b", [6])] if bias else []
        return [b.linear(x, w, *extra, out="y")]
    return build


def _attention(lq, lk, batch_q=(2,), batch_k=(2,), **attrs):
    def build(b):
        q = b.input("q", [*batch_q, lq, 8])
        k = b.input("k", [*batch_k, lk, 8])
        v = b.input("v", [*batch_k, lk, 5])
        return [b.attention(q, k, v, out="y", **attrs)]
    return build


def _one_hot(axis):
    def build(b):
        indices = b.constant("indices", [2, 3], [0, 3, 1, -1, 4, 2], "int32")  # 4, -1: off
        return [b.one_hot(indices, b.input("on", []), b.input("off", []), depth=4, axis=axis,
                          out="y")]
    return build


CASES = {
    "one_hot": _one_hot(-1),
    "one_hot_axis0": _one_hot(0),
    "softmax": _unary("softmax", [3, 7]),
    "softmax_axis0": _unary("softmax", [3, 7], axis=0),
    "log_softmax": _unary("log_softmax", [2, 3, 7], axis=1),
    "logsumexp": _unary("logsumexp", [2, 3, 7], axes=[0, 2]),
    "logsumexp_keepdims": _unary("logsumexp", [2, 3, 7], axes=[-1], keepdims=True),
    "logsumexp_all": _unary("logsumexp", [2, 3, 7]),
    "reduce_mean": _unary("reduce_mean", [4, 6], axes=[1]),
    "reduce_mean_all_keepdims": _unary("reduce_mean", [4, 6], keepdims=True),
    "reduce_mean_scalar": _unary("reduce_mean", []),
    "variance": _unary("variance", [4, 6, 3], axes=[0, -1]),
    "variance_keepdims": _unary("variance", [4, 6], keepdims=True),
    "layer_norm": _layer_norm([4, 3, 8], -1, 2),
    "layer_norm_2axes": _layer_norm([4, 3, 8], -2, 2),
    "layer_norm_gamma_only": _layer_norm([4, 8], -1, 1),
    "layer_norm_plain": _layer_norm([4, 8], 1, 0),
    "rms_norm": _rms_norm([4, 8], True),
    "rms_norm_plain": _rms_norm([2, 4, 8], False),
    "batch_norm_4d": _batch_norm([2, 3, 4, 5]),
    "batch_norm_2d": _batch_norm([6, 3]),
    "gelu": _unary("gelu", [5, 9]),
    "gelu_tanh": _unary("gelu", [5, 9], approximate="tanh"),
    "silu": _unary("silu", [5, 9]),
    "linear": _linear(True),
    "linear_no_bias": _linear(False),
    "attention": _attention(5, 7),
    "attention_causal": _attention(6, 6, causal=True),
    "attention_causal_wide": _attention(3, 7, causal=True, scale=0.3),
    "attention_causal_tall": _attention(7, 3, batch_q=(2, 2), batch_k=(1,), causal=True),
}


def build(case: str, dtype: str = "float32") -> Graph:
    b = GraphBuilder(case)
    outputs = CASES[case](b)
    doc = b.to_json(outputs)
    for t in doc["inputs"]:
        t["dtype"] = dtype
    return load_graph(doc)


def random_inputs(g: Graph, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    values = {t.name: rng.standard_normal(t.type.shape).astype(t.type.dtype) for t in g.inputs}
    if "var" in values:  # batch_norm's running variance is positive
        values["var"] = np.abs(values["var"]) + 0.1
    return values


def test_every_composite_has_a_case():
    covered = {n.op for case in CASES for n in build(case).nodes}
    assert covered == {name for name, spec in OPS.items() if spec.composite}


def test_softmax_golden():
    g = decompose_graph(build("softmax"))
    assert [n.op for n in g.nodes] == ["reduce_max", "sub", "exp", "reduce_sum", "reciprocal",
                                       "mul"]
    mx, sub, ex, total, inv, mul = g.nodes
    assert mx.attrs["axes"] == (1,) and mx.attrs["keepdims"]
    assert total.attrs["axes"] == (1,) and total.attrs["keepdims"]
    assert sub.inputs == ("x", mx.output)
    assert ex.inputs == (sub.output,)
    assert inv.inputs == (total.output,)  # one division per row
    assert mul.inputs == (ex.output, inv.output)
    assert mul.output == "y" and g.outputs == ("y",)
    assert {n.origin for n in g.nodes} == {"softmax 'y'"}


def test_layer_norm_uses_the_centred_variance():
    g = decompose_graph(build("layer_norm"))
    assert [n.op for n in g.nodes] == ["reduce_sum", "mul", "sub", "mul", "reduce_sum", "mul",
                                       "add", "rsqrt", "mul", "mul", "add"]
    centred = g.nodes[2]
    assert centred.inputs[0] == "x"
    assert g.nodes[3].inputs == (centred.output, centred.output)
    consts = g.constant_map
    inv_n = g.nodes[1].inputs[1]
    assert consts[inv_n].data == pytest.approx((1 / 8,))
    assert consts[g.nodes[6].inputs[1]].data == pytest.approx((1e-3,))


def test_batch_norm_folds_the_parameters_on_channels():
    g = decompose_graph(build("batch_norm_4d"))
    full = [n for n in g.nodes if g.types[n.output].shape == (2, 3, 4, 5)]
    # Only (x - mean) * a + bias touches the full tensor; rsqrt and scale run on [C].
    assert [n.op for n in full] == ["sub", "mul", "add"]
    assert all(g.types[n.output].shape in ((3,), (3, 1, 1)) for n in g.nodes if n not in full)


def test_causal_mask_is_computed_from_index_vectors():
    g = decompose_graph(build("attention_causal_wide"))
    ops = [n.op for n in g.nodes]
    assert ops == ["matmul", "mul", "greater", "select", "reduce_max", "sub", "exp",
                   "reduce_sum", "reciprocal", "matmul", "mul"]  # normalised after v
    assert g.nodes[0].attrs["transpose_b"]
    assert g.constant_map[g.nodes[1].inputs[1]].data == (0.3,)
    mask, select = g.nodes[2], g.nodes[3]
    consts = g.constant_map
    cols, rows = (consts[i] for i in mask.inputs)
    assert (cols.type.shape, rows.type.shape) == ((1, 7), (3, 1))
    assert cols.data == tuple(range(7)) and rows.data == tuple(range(3))
    assert consts[select.inputs[1]].data == (-math.inf,)
    assert max(c.type.size for c in g.constants) == 7  # never an Lq x Lk constant


@pytest.mark.parametrize("case", sorted(CASES))
def test_decomposed_graph_is_primitive_and_well_formed(case):
    g = build(case)
    d = decompose_graph(g)
    check_well_formed(d)
    assert not any(OPS[n.op].composite for n in d.nodes)
    assert d.outputs == g.outputs and d.inputs == g.inputs and d.notes == g.notes
    assert d.types["y"] == g.types["y"]
    assert d.nodes[-1].output == "y" and d.nodes[-1].name == "y"
    assert {n.origin for n in d.nodes} == {g.nodes[0].provenance}
    assert decompose_graph(g) == d  # deterministic


@pytest.mark.parametrize("case", sorted(CASES))
def test_decomposition_matches_the_reference_float64(case):
    g = build(case, "float64")
    inputs = random_inputs(g)
    want, got = run_reference(g, inputs)["y"], run_reference(decompose_graph(g), inputs)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_decomposition_matches_the_reference_float32(case):
    # Each primitive rounds to float32, the composite reference only once; gelu's
    # 1 + erf(..) loses relative (not absolute) accuracy where it nears 0, hence atol.
    g = build(case)
    inputs = random_inputs(g, seed=1)
    want, got = run_reference(g, inputs)["y"], run_reference(decompose_graph(g), inputs)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_primitive_nodes_pass_through_unchanged():
    b = GraphBuilder()
    x = b.input("x", [4, 4])
    g = b.build([b.relu(b.exp(x))])
    assert decompose_graph(g) == g


def test_fresh_names_avoid_existing_tensors_and_consumers_keep_their_inputs():
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    taken = b.input("y.max", [2, 3])
    y = b.softmax(x, out="y")
    z = b.add(y, taken, out="z")
    g = decompose_graph(b.build([z]))
    check_well_formed(g)
    assert g.nodes[0].output == "y.max_2"
    assert g.producer("z").inputs == ("y", "y.max")


def test_shared_constants_get_distinct_names():
    b = GraphBuilder()
    x = b.input("x", [2, 8])
    g = decompose_graph(b.build([b.layer_norm(b.layer_norm(x, out="a"), out="b")]))
    names = [c.name for c in g.constants]
    assert len(set(names)) == len(names) == 6  # 1/N twice, epsilon; merged by simplify
    assert all(c.name.startswith(("a.", "b.")) for c in g.constants)


@settings(max_examples=25, deadline=None)
@given(lq=st.integers(1, 6), lk=st.integers(1, 6), d=st.integers(1, 4),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_shapes(lq, lk, d, causal, seed):
    b = GraphBuilder()
    q, k, v = b.input("q", [lq, d]), b.input("k", [lk, d]), b.input("v", [lk, 3])
    g = b.build([b.attention(q, k, v, causal=causal, out="y")])
    inputs = random_inputs(g, seed)
    np.testing.assert_allclose(run_reference(decompose_graph(g), inputs)["y"],
                               run_reference(g, inputs)["y"], rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_normalisations_over_any_trailing_axes(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    b = GraphBuilder()
    x = b.input("x", shape, "float64")
    gamma, beta = (b.input(p, shape[axis:], "float64") for p in ("g", "b"))
    outs = [b.layer_norm(x, gamma, beta, axis=axis), b.rms_norm(x, gamma, axis=axis),
            b.log_softmax(x, axis=axis), b.variance(x, axes=[axis])]
    g = b.build(outs)
    d = decompose_graph(g)
    check_well_formed(d)
    inputs = random_inputs(g, data.draw(st.integers(0, 2**16)))
    want, got = run_reference(g, inputs), run_reference(d, inputs)
    for o in outs:
        np.testing.assert_allclose(got[o], want[o], rtol=1e-5, atol=1e-12)


def test_gelu_tanh_is_x_times_sigmoid_and_holds_over_the_whole_range():
    g = decompose_graph(build("gelu_tanh"))
    assert [n.op for n in g.nodes][-2:] == ["sigmoid", "mul"]  # 0.5 (1 + tanh z) = sigmoid(2z)
    x = np.concatenate([np.linspace(-12, 12, 35, dtype=np.float32),
                        np.float32([-1e4, -88, -5.5, -1e-30, 0, 1e-30, 3.3, 88, 1e4, np.inf])])
    x = x.reshape(5, 9)
    b = GraphBuilder("gelu")
    graph = b.build([b.gelu(b.input("x", (5, 9)), approximate="tanh", out="y")])
    got = compile(graph).program({"x": x})["y"]
    xd = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        z = math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)
        # the same function without 1 + tanh's cancellation in the negative tail
        want = xd / (1 + np.exp(-2 * z))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)
    assert got[-1, -1] == np.inf
