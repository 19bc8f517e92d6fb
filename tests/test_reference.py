"""The numpy reference executor against hand-checked values and independent formulations."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyc import GraphBuilder, GraphError
from polyc.errors import InternalError
from polyc.graph.ir import Node, TensorType, int_range
from polyc.graph.ops import OPS
from polyc.graph.reference import IMPLS, erf, eval_node, run_reference

RNG = np.random.default_rng(1234)


def rand(*shape, dtype="float32", low=-2.0, high=2.0):
    return RNG.uniform(low, high, shape).astype(dtype)


def run1(op: str, *args, **attrs) -> np.ndarray:
    """Run one `op` node on `args` through a validated graph."""
    b = GraphBuilder(op)
    names = [b.input(f"x{i}", np.shape(a), str(np.asarray(a).dtype)) for i, a in enumerate(args)]
    y = b.op(op, *names, **attrs)
    out = run_reference(b.build([y]), {n: np.asarray(a) for n, a in zip(names, args)})[y]
    assert out.flags.c_contiguous
    return out


def close(got, want, dtype="float32", rtol=1e-6, atol=1e-6):
    assert got.dtype == np.dtype(dtype)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_every_op_has_an_implementation():
    assert set(OPS) <= set(IMPLS)


# --- unary -----------------------------------------------------------------------------

_math_erf = np.vectorize(math.erf)

UNARY_CASES = {
    "neg": (lambda x: -x, -2, 2),
    "abs": (np.abs, -2, 2),
    "exp": (np.exp, -2, 2),
    "log": (np.log, 0.1, 3),
    "sqrt": (np.sqrt, 0.1, 3),
    "rsqrt": (lambda x: 1 / np.sqrt(x), 0.1, 3),
    "tanh": (np.tanh, -3, 3),
    "erf": (_math_erf, -3, 3),
    "sigmoid": (lambda x: np.array([1 / (1 + math.exp(-v)) for v in x.flat]).reshape(x.shape),
                -5, 5),
    "relu": (lambda x: np.where(x > 0, x, 0), -2, 2),
    "reciprocal": (lambda x: 1 / x, 0.5, 3),
}


@pytest.mark.parametrize("op", sorted(UNARY_CASES))
def test_unary_float32(op):
    fn, low, high = UNARY_CASES[op]
    x = rand(3, 4, low=low, high=high)
    close(run1(op, x), fn(x.astype(np.float64)))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("op,want", [("neg", [3, 0, -5]), ("abs", [3, 0, 5]),
                                     ("relu", [0, 0, 5])])
def test_unary_integers_are_exact(op, want, dtype):
    out = run1(op, np.array([-3, 0, 5], dtype))
    assert out.dtype == np.dtype(dtype) and out.tolist() == want


def test_erf_matches_math_erf_to_double_precision():
    x = np.concatenate([np.linspace(-7, 7, 2001), [0.0, 1e-300, -1e-12, 5.9, 6.0, 6.1]])
    np.testing.assert_allclose(erf(x), _math_erf(x), rtol=2e-15, atol=0)


def test_erf_of_infinities_and_nan():
    out = erf(np.array([np.inf, -np.inf, np.nan]))
    assert out[0] == 1.0 and out[1] == -1.0 and np.isnan(out[2])


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_cast_float_to_integers_truncates_toward_zero(dtype):
    out = run1("cast", np.array([-2.7, -0.5, 0.5, 2.7, 3.0], np.float32), to=dtype)
    assert out.dtype == np.dtype(dtype) and out.tolist() == [-2, 0, 0, 2, 3]


def test_cast_int32_to_floats():
    x = np.array([-3, 16777217], np.int32)
    assert run1("cast", x, to="float64").tolist() == [-3.0, 16777217.0]
    assert run1("cast", x, to="float32").tolist() == [-3.0, 16777216.0]


def test_float32_is_computed_in_float64():
    # In float32, 1e8 + 1 rounds back to 1e8 and the sum would be 0.
    out = run1("reduce_sum", np.array([1e8, 1, -1e8], np.float32))
    assert out.dtype == np.float32 and out == 1.0


# --- binary, compare, select -------------------------------------------------------------

BINARY_CASES = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                "pow": np.power, "maximum": np.maximum, "minimum": np.minimum}


@pytest.mark.parametrize("op", sorted(BINARY_CASES))
def test_binary_broadcasts(op):
    a, b = rand(2, 1, 3, low=0.5, high=2), rand(4, 1, low=0.5, high=2)
    close(run1(op, a, b), BINARY_CASES[op](a.astype(np.float64), b.astype(np.float64)))


def test_binary_float64_scalar_operand():
    a = rand(2, 3, dtype="float64")
    close(run1("mul", a, np.array(2.5)), a * 2.5, dtype="float64", rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_div_truncates_toward_zero(dtype):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1], dtype)
    b = np.array([2, 2, -2, -2, 3, 3, 5, -3], dtype)
    out = run1("div", a, b)
    assert out.dtype == np.dtype(dtype) and out.tolist() == [3, -3, -3, 3, 2, -2, 0, 0]


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_integer_div_matches_c_division(dtype, data):
    lo, hi = int_range(dtype)
    pairs = data.draw(st.lists(st.tuples(st.integers(lo + 1, hi),
                                         st.integers(lo + 1, hi).filter(bool)),
                               min_size=1, max_size=20))
    a, b = (np.array(v, dtype) for v in zip(*pairs))
    node = Node("div", ("a", "b"), "q")
    out = eval_node(node, [a, b], TensorType(a.shape, dtype))
    want = [abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1) for x, y in pairs]
    assert out.tolist() == want


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_arithmetic_wraps_like_c(dtype):
    lo, hi = int_range(dtype)
    out = run1("add", np.array([hi], dtype), np.array([1], dtype))
    assert out.tolist() == [lo]


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_compare_returns_input_dtype_holding_0_or_1(dtype):
    a = np.array([[1, 2, 3]], dtype)
    b = np.array([[2], [3]], dtype)
    for op, fn in (("greater", np.greater), ("less", np.less), ("equal", np.equal)):
        out = run1(op, a, b)
        assert out.dtype == np.dtype(dtype)
        assert out.tolist() == fn(a, b).astype(int).tolist()


def test_select_broadcasts_three_operands_and_nonzero_picks_a():
    cond = np.array([[0], [2], [-1]], np.int32)  # condition dtype may differ from a and b
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array(-9, np.float32)
    out = run1("select", cond, a, b)
    assert out.dtype == np.float32
    assert out.tolist() == [[-9] * 4, [1, 2, 3, 4], [1, 2, 3, 4]]


# --- reductions ------------------------------------------------------------------------

@pytest.mark.parametrize("op,fn", [("reduce_sum", np.sum), ("reduce_max", np.max),
                                   ("reduce_min", np.min), ("reduce_prod", np.prod),
                                   ("reduce_mean", np.mean)])
@pytest.mark.parametrize("axes", [None, [-1], [0, 2], [-3, 1]])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(op, fn, axes, keepdims):
    x = rand(2, 3, 4)
    want = fn(x.astype(np.float64), axis=None if axes is None else tuple(axes), keepdims=keepdims)
    attrs = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
    close(run1(op, x, **attrs), want)


def test_reduce_sum_by_hand():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert run1("reduce_sum", x, axes=[-1]).tolist() == [3, 12]
    assert run1("reduce_sum", x, axes=[0], keepdims=True).tolist() == [[3, 5, 7]]
    assert run1("reduce_prod", x + 1).tolist() == 720


def test_variance_is_population_variance():
    x = np.array([[1, 2, 3, 6]], np.float32)
    close(run1("variance", x, axes=[-1]), [3.5])
    y = rand(3, 5)
    mean = y.astype(np.float64).mean(axis=0, keepdims=True)
    want = ((y - mean) ** 2).sum(axis=0, keepdims=True) / 3
    close(run1("variance", y, axes=[0], keepdims=True), want)


def test_logsumexp_is_stable():
    x = np.array([[1000, 1000], [0, math.log(3)]], np.float64)
    close(run1("logsumexp", x, axes=[-1]), [1000 + math.log(2), math.log(4)], dtype="float64")
    close(run1("logsumexp", x, keepdims=True), [[1000 + math.log(2)]], dtype="float64")


def test_logsumexp_of_minus_infinity_is_minus_infinity():
    out = run1("logsumexp", np.array([-np.inf, -np.inf]))
    assert out == -np.inf


# --- matmul ----------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                   ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 6)), ((4,), (2, 4, 5)),
                                   ((2, 3, 4), (4,))])
def test_matmul_numpy_semantics(sa, sb):
    a, b = rand(*sa), rand(*sb)
    close(run1("matmul", a, b), np.matmul(a.astype(np.float64), b.astype(np.float64)))


def test_matmul_transposes_swap_last_two_dims():
    a, b = rand(2, 4, 3), rand(5, 4)
    want = np.einsum("bki,jk->bij", a.astype(np.float64), b.astype(np.float64))
    close(run1("matmul", a, b, transpose_a=True, transpose_b=True), want)


def test_matmul_1d_by_hand_and_int32():
    assert run1("matmul", np.array([1, 2, 3], np.int32), np.array([4, 5, 6], np.int32)) == 32
    out = run1("matmul", np.array([[1, 2], [3, 4]], np.int32), np.array([1, 1], np.int32))
    assert out.dtype == np.int32 and out.tolist() == [3, 7]


def test_linear_with_and_without_bias():
    x, w, b = rand(2, 3, 4), rand(4, 5), rand(5)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    close(run1("linear", x, w), x64 @ w64)
    close(run1("linear", x, w, b), x64 @ w64 + b)


# --- conv2d ----------------------------------------------------------------------------

def naive_conv2d(x, w, b, strides, pads, dilations):
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dilations
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            for p in range(kh):
                for q in range(kw):
                    hi, wi = i * sh + p * dh - pt, j * sw + q * dw - pl
                    if 0 <= hi < h and 0 <= wi < wd:
                        y[:, :, i, j] += x[:, :, hi, wi] @ w[:, :, p, q].T
    return y if b is None else y + b[:, None, None]


@pytest.mark.parametrize("strides,pads,dilations,bias", [
    ((1, 1), (0, 0, 0, 0), (1, 1), False),
    ((2, 1), (1, 2, 0, 1), (1, 1), True),
    ((1, 2), (2, 0, 1, 3), (2, 3), True),
    ((3, 3), (1, 1, 1, 1), (2, 1), False),
])
def test_conv2d_matches_naive_loops(strides, pads, dilations, bias):
    x, w = rand(2, 3, 9, 10, dtype="float64"), rand(4, 3, 3, 2, dtype="float64")
    b = rand(4, dtype="float64") if bias else None
    args = (x, w, b) if bias else (x, w)
    out = run1("conv2d", *args, strides=list(strides), pads=list(pads),
               dilations=list(dilations))
    close(out, naive_conv2d(x, w, b, strides, pads, dilations), dtype="float64", rtol=1e-12)


def test_conv2d_resnet_sized_layer():
    x, w, b = rand(1, 64, 56, 56), rand(64, 64, 3, 3), rand(64)
    out = run1("conv2d", x, w, b, pads=[1, 1, 1, 1])
    assert out.shape == (1, 64, 56, 56) and out.dtype == np.float32
    x64 = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    for o, i, j in ((0, 0, 0), (5, 55, 0), (63, 17, 55)):
        want = np.sum(x64[0, :, i:i + 3, j:j + 3] * w[o]) + b[o]
        assert out[0, o, i, j] == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_conv2d_int32():
    x = np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 2, 2), np.int32)
    out = run1("conv2d", x, w, strides=[2, 2])
    assert out.dtype == np.int32 and out.tolist() == [[[[10, 18], [42, 50]]]]


# --- data movement ---------------------------------------------------------------------

def test_transpose_with_and_without_perm():
    x = rand(2, 3, 4)
    close(run1("transpose", x, perm=[1, 2, 0]), x.transpose(1, 2, 0))
    close(run1("transpose", x), x.transpose(2, 1, 0))


def test_reshape_with_minus_one_and_broadcast_to():
    x = np.arange(12, dtype=np.int32)
    assert run1("reshape", x, shape=[3, -1]).tolist() == x.reshape(3, 4).tolist()
    out = run1("broadcast_to", np.array([[1], [2]], np.int32), shape=[3, 2, 4])
    assert out.shape == (3, 2, 4) and out.flags.writeable and out[2, 1].tolist() == [2] * 4


@pytest.mark.parametrize("attrs,index", [
    ({"starts": [1], "ends": [3]}, np.s_[1:3]),
    ({"starts": [-3, 0], "ends": [100, -1], "steps": [2, 3]}, np.s_[-3:100:2, 0:-1:3]),
    ({"starts": [1], "ends": [-1], "axes": [-1]}, np.s_[..., 1:-1]),
    ({"starts": [0, 2], "ends": [4, 5], "axes": [2, 0], "steps": [2, 1]}, np.s_[2:5, :, 0:4:2]),
])
def test_slice_numpy_semantics(attrs, index):
    x = np.arange(6 * 7 * 5, dtype=np.float64).reshape(6, 7, 5)
    close(run1("slice", x, **attrs), x[index], dtype="float64", rtol=0, atol=0)


def test_concat_negative_axis_three_inputs():
    a, b, c = rand(2, 1), rand(2, 3), rand(2, 2)
    close(run1("concat", a, b, c, axis=-1), np.concatenate([a, b, c], axis=1))


def test_pad_with_value():
    out = run1("pad", np.array([[1, 2]], np.float32), pads=[[1, 0], [2, 1]], value=-1.5)
    assert out.tolist() == [[-1.5] * 5, [-1.5, -1.5, 1, 2, -1.5]]


# --- composites ------------------------------------------------------------------------

def direct_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [0, -1, 1])
def test_softmax_and_log_softmax(axis):
    x = rand(3, 4, 2, low=-5, high=5)
    want = direct_softmax(x.astype(np.float64), axis)
    close(run1("softmax", x, axis=axis), want)
    close(run1("log_softmax", x, axis=axis), np.log(want))


def test_softmax_by_hand_and_stable():
    out = run1("softmax", np.array([1000, 1000 + math.log(3)], np.float32))
    assert np.all(np.isfinite(out)) and out.tolist() == pytest.approx([0.25, 0.75], abs=1e-3)
    out = run1("log_softmax", np.array([0.0, 0.0], np.float64))
    assert out.tolist() == pytest.approx([-math.log(2)] * 2)


@pytest.mark.parametrize("axis,affine", [(-1, 0), (-1, 1), (-2, 2), (1, 2)])
def test_layer_norm(axis, affine):
    x = rand(2, 3, 4).astype(np.float64)
    axes = tuple(range(axis % 3, 3))
    norm_shape = x.shape[axis % 3:]
    params = [rand(*norm_shape, dtype="float64") for _ in range(affine)]
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-3)
    if affine >= 1:
        want = want * params[0]
    if affine == 2:
        want = want + params[1]
    close(run1("layer_norm", x, *params, axis=axis, epsilon=1e-3), want, dtype="float64",
          rtol=1e-12)


def test_layer_norm_by_hand():
    out = run1("layer_norm", np.array([[1, 3]], np.float32), epsilon=0.0)
    assert out.tolist() == [[-1, 1]]


def test_rms_norm():
    x, g = rand(2, 3, 4, dtype="float64"), rand(3, 4, dtype="float64")
    want = x / np.sqrt((x * x).mean(axis=(1, 2), keepdims=True) + 1e-5) * g
    close(run1("rms_norm", x, g, axis=1), want, dtype="float64", rtol=1e-12)
    want = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5)
    close(run1("rms_norm", x), want, dtype="float64", rtol=1e-12)


def test_batch_norm_over_axis_1():
    x = rand(2, 3, 4, 5)
    scale, bias, mean = rand(3), rand(3), rand(3)
    var = rand(3, low=0.5, high=2)
    want = np.empty(x.shape)
    for c in range(3):
        want[:, c] = (x[:, c] - mean[c]) / math.sqrt(var[c] + 1e-5) * scale[c] + bias[c]
    close(run1("batch_norm", x, scale, bias, mean, var), want)


def test_gelu_both_forms():
    x = rand(5, 6, low=-4, high=4)
    x64 = x.astype(np.float64)
    close(run1("gelu", x), 0.5 * x64 * (1 + _math_erf(x64 / math.sqrt(2))))
    c = math.sqrt(2 / math.pi)
    close(run1("gelu", x, approximate="tanh"),
          0.5 * x64 * (1 + np.tanh(c * (x64 + 0.044715 * x64 ** 3))))


def test_silu():
    x = rand(7, low=-6, high=6).astype(np.float64)
    close(run1("silu", x), [v / (1 + math.exp(-v)) for v in x], dtype="float64", rtol=1e-14)


def naive_attention(q, k, v, scale, causal):
    """Row by row, masking by skipping the keys a query may not see."""
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    lq, lk = q.shape[-2], k.shape[-2]
    out = np.zeros(batch + (lq, v.shape[-1]))
    for idx in np.ndindex(*batch):
        qb = np.broadcast_to(q, batch + q.shape[-2:])[idx]
        kb = np.broadcast_to(k, batch + k.shape[-2:])[idx]
        vb = np.broadcast_to(v, batch + v.shape[-2:])[idx]
        for i in range(lq):
            seen = min(i + 1, lk) if causal else lk
            s = np.array([qb[i] @ kb[j] * scale for j in range(seen)])
            p = np.exp(s - s.max())
            out[idx + (i,)] = (p / p.sum()) @ vb[:seen]
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(3, 5), (5, 3), (4, 4)])
def test_attention(causal, lq, lk):
    q, k, v = rand(2, 1, lq, 8), rand(3, lk, 8), rand(1, lk, 6)
    args = [a.astype(np.float64) for a in (q, k, v)]
    close(run1("attention", q, k, v, causal=causal),
          naive_attention(*args, 1 / math.sqrt(8), causal))
    close(run1("attention", q, k, v, causal=causal, scale=0.3),
          naive_attention(*args, 0.3, causal))


def test_causal_attention_first_query_sees_only_first_key():
    q, k = np.ones((2, 2), np.float32), np.ones((3, 2), np.float32)
    v = np.array([[1.0], [10.0], [100.0]], np.float32)
    out = run1("attention", q, k, v, causal=True)
    assert out[:, 0].tolist() == pytest.approx([1.0, 5.5])


# --- run_reference ---------------------------------------------------------------------

def small_graph():
    b = GraphBuilder("g")
    x = b.input("x", [2, 3])
    b.input("n", [3], "int32")
    c = b.constant("c", [3], [1, 2, 3.5])
    y = b.add(x, c, out="y")
    z = b.reduce_sum(y, axes=[-1], out="z")
    return b.build([z, "x", "c", "n"])


def test_run_reference_chains_nodes_and_returns_inputs_and_constants():
    x = rand(2, 3)
    n = np.array([1, 2, 3], np.int32)
    out = run_reference(small_graph(), {"x": x, "n": n})
    assert list(out) == ["z", "x", "c", "n"]
    close(out["z"], (x.astype(np.float64) + [1, 2, 3.5]).sum(axis=-1))
    assert out["c"].dtype == np.float32 and out["c"].tolist() == [1, 2, 3.5]
    assert out["x"] is not x and np.array_equal(out["x"], x)
    assert out["n"].dtype == np.int32


@pytest.mark.parametrize("inputs,message", [
    ({"x": np.zeros((2, 3), np.float32)}, "'n'"),
    ({"x": np.zeros((2, 3), np.float32), "n": np.zeros(3, np.int32),
      "extra": np.zeros(1)}, "'extra'"),
    ({"x": np.zeros((3, 2), np.float32), "n": np.zeros(3, np.int32)}, "'x' must be float32[2,3]"),
    ({"x": np.zeros((2, 3), np.float64), "n": np.zeros(3, np.int32)}, "got float64[2,3]"),
    ({"x": np.zeros((2, 3), np.float32), "n": np.zeros(3, np.int64)}, "'n' must be int32[3]"),
])
def test_run_reference_checks_inputs(inputs, message):
    with pytest.raises(GraphError, match=re.escape(message)):
        run_reference(small_graph(), inputs)


def test_eval_node_refuses_a_result_of_the_wrong_shape():
    node = Node("add", ("a", "b"), "c", name="c")
    with pytest.raises(InternalError, match="computed shape"):
        eval_node(node, [np.zeros(2), np.zeros(2)], TensorType((3,), "float64"))
