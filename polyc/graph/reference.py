"""The numpy reference executor: the semantics of DESIGN.md, op by op, as plain numpy.

Every generated kernel is checked against it, so it aims to be obviously right and more
accurate than the kernels: float32, float16 and bfloat16 values are computed in float64
and rounded once at the end of each op (to nearest even: float16 and bfloat16 are
storage types; bfloat16 is ml_dtypes'); int32 and int64 stay exact integer arithmetic
(wrapping like C); bool holds numpy's bool (a cast to it is "nonzero", as C's _Bool).
`eval_node`
runs one op and is shared with constant folding; `run_reference` runs a whole graph.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..errors import GraphError, InternalError, Problem
from .binding import bind_graph, bind_symbols, check_shape, symbol_values
from .symbols import Iota, substitute, substitute_shape
from .ir import INT_BITS, Graph, Node, Tensor, TensorType
from .ops import norm_axes, norm_axis, slice_params


def run_reference(graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute `graph` on `inputs` (name -> array of exactly the input's shape and dtype)
    and return its outputs by name; a symbolic graph runs with its symbols bound from
    the inputs' shapes."""
    values, binding = bind_inputs(graph, inputs)
    if binding:
        graph = bind_graph(graph, binding)
    for c in graph.constants:
        values[c.name] = constant_value(c)
    for node in graph.nodes:
        values[node.output] = eval_node(node, [values[i] for i in node.inputs],
                                        graph.types[node.output])
    # A graph output may be an input: copy so callers never alias their own arrays.
    return {o: np.array(values[o], order="C") for o in graph.outputs}


def constant_value(tensor: Tensor, values: dict[str, int] | None = None) -> np.ndarray:
    """The array of a constant (its `data` is flat, row-major), read-only; an `Iota` of
    a compiled symbolic graph's at the symbols' `values`."""
    t = tensor.type
    if isinstance(tensor.data, Iota):
        return np.arange(substitute(tensor.data.count, values), dtype=t.dtype).reshape(
            substitute_shape(t.shape, values))
    return tensor.array.reshape(t.shape)


def check_inputs(graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return bind_inputs(graph, inputs)[0]


def bind_inputs(graph: Graph, inputs: dict[str, np.ndarray], binder=bind_symbols
                ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The inputs as arrays, checked, and the symbols' values their shapes bind ({} for
    a static graph); `binder(graph, shapes)` is `bind_symbols` or a memo of it."""
    # every compiled call passes here: one pass, and a message is only built for a
    # problem there is
    values, problems = {}, []
    symbolic = bool(graph.symbols)
    for t in graph.inputs:
        if t.name not in inputs:
            problems.append(Problem(f"input {t.name!r} ({t.type}) is missing"))
            continue
        arr = np.asarray(inputs[t.name])
        if (not check_shape(graph, t.name, arr) if symbolic
                else arr.shape != t.type.shape or arr.dtype != t.type.dtype):
            got = f"{arr.dtype}[{','.join(map(str, arr.shape))}]"
            problems.append(Problem(f"input {t.name!r} must be {t.type}, got {got}"))
        values[t.name] = arr
    if len(values) < len(inputs):
        known = ", ".join(t.name for t in graph.inputs) or "none"
        problems[:0] = [Problem(f"input {name!r} is not an input of graph {graph.name!r} "
                                f"(its inputs: {known})")
                        for name in sorted(set(inputs) - set(values))]
    if problems:
        raise GraphError(problems)
    if not symbolic:
        return values, {}
    return values, binder(graph, {k: v.shape for k, v in values.items()})


_WIDENED = tuple(np.dtype(t) for t in ("float32", "float16", "bfloat16"))


def eval_node(node: Node, args: list[np.ndarray], out_type: TensorType) -> np.ndarray:
    """Apply `node`'s op to `args`; the result has exactly `out_type`'s shape and dtype."""
    impl = IMPLS.get(node.op)
    if impl is None:
        raise InternalError("reference", f"no reference implementation of op {node.op!r}")
    # Out-of-domain values give IEEE inf/nan (and casts of them C's garbage), as in the
    # C kernels, rather than numpy warnings (ml_dtypes warns widening a bfloat16 NaN).
    with np.errstate(all="ignore"):
        wide = [a.astype(np.float64) if a.dtype in _WIDENED else a
                for a in map(np.asarray, args)]
        result = np.asarray(impl(node.attrs, *wide))
        if result.shape != out_type.shape:
            raise InternalError("reference", f"{node.provenance}: computed shape "
                                             f"{list(result.shape)}, but its type is {out_type}")
        # np.array, not np.ascontiguousarray: the latter turns a scalar into shape [1].
        return np.array(result, dtype=out_type.dtype, order="C")


# --- math helpers ---------------------------------------------------------------------

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def erf(x: np.ndarray) -> np.ndarray:
    """erf to about 1e-15 relative, in plain numpy (scipy is not a dependency).

    Uses erf(a) = 2/sqrt(pi) exp(-a^2) sum_n (2a^2)^n a / (2n+1)!!, whose terms are all
    positive, so there is no cancellation; past |a| = 6 erf is +-1 in double precision,
    which bounds the loop to about 100 terms. fmin maps NaN to 6 so the loop ends; the
    sign of NaN restores it.
    """
    x = np.asarray(x, dtype=np.float64)
    a = np.fmin(np.abs(x), 6.0)
    two_a2 = 2.0 * a * a
    term = a.copy()
    total = a.copy()
    n = 0
    while np.any(term > total * 2.0 ** -60):
        n += 1
        term = term * two_a2 / (2 * n + 1)
        total += term
    return np.clip(np.sign(x) * _TWO_OVER_SQRT_PI * np.exp(-a * a) * total, -1.0, 1.0)


def _sigmoid(x):
    # exp(-x) only overflows where the result underflows anyway, so 1/(1+inf) = 0 is right.
    return 1.0 / (1.0 + np.exp(-x))


def _shifted(x, axes):
    """x minus its max over `axes` (kept), the max, for overflow-free exp; an all -inf
    slice is shifted by 0 so it stays -inf instead of becoming nan."""
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return x - m, m


def _softmax_along(x, axis):
    e = np.exp(_shifted(x, axis)[0])
    return e / np.sum(e, axis=axis, keepdims=True)


def _softmax(attrs, x):
    return _softmax_along(x, attrs["axis"])


def _log_softmax(attrs, x):
    s, _ = _shifted(x, attrs["axis"])
    return s - np.log(np.sum(np.exp(s), axis=attrs["axis"], keepdims=True))


def _logsumexp(attrs, x):
    axes = norm_axes(attrs.get("axes"), x.ndim)
    s, m = _shifted(x, axes)
    out = m + np.log(np.sum(np.exp(s), axis=axes, keepdims=True))
    return out if attrs["keepdims"] else np.squeeze(out, axis=axes)


# --- elementwise ----------------------------------------------------------------------

def _int_div(a, b):
    # C division truncates toward zero; numpy's // floors, so step back toward zero
    # where the exact quotient was negative and not whole.
    q = np.floor_divide(a, b)
    inexact_negative = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + inexact_negative.astype(q.dtype)


def _div(attrs, a, b):
    return _int_div(a, b) if a.dtype.kind == "i" else a / b


def _compare(fn: Callable) -> Callable:
    # DESIGN.md: the result holds 0/1 in the inputs' dtype (a bool one is a cast of it).
    return lambda attrs, a, b: fn(a, b).astype(a.dtype)


def _cast(attrs, x):
    # numpy's float -> int conversion is C's, truncating toward zero.
    return x.astype(attrs["to"])


def _gelu(attrs, x):
    if attrs["approximate"] == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


# --- reductions -----------------------------------------------------------------------

def _reduction(fn: Callable) -> Callable:
    def impl(attrs, x):
        return fn(x, axis=norm_axes(attrs.get("axes"), x.ndim), keepdims=attrs["keepdims"])
    return impl


def _norm_axes_from(attrs, x) -> tuple[int, ...]:
    """The normalised dims of layer_norm / rms_norm: from `axis` to the last."""
    return tuple(range(norm_axis(attrs["axis"], x.ndim), x.ndim))


def _layer_norm(attrs, x, gamma=1.0, beta=0.0):
    axes = _norm_axes_from(attrs, x)
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.var(x, axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + attrs["epsilon"]) * gamma + beta


def _rms_norm(attrs, x, gamma=1.0):
    ms = np.mean(x * x, axis=_norm_axes_from(attrs, x), keepdims=True)
    return x / np.sqrt(ms + attrs["epsilon"]) * gamma


def _batch_norm(attrs, x, scale, bias, mean, var):
    # Per-channel parameters [C] line up with axis 1 of x [N, C, ...].
    scale, bias, mean, var = (p.reshape((-1,) + (1,) * (x.ndim - 2))
                              for p in (scale, bias, mean, var))
    return (x - mean) / np.sqrt(var + attrs["epsilon"]) * scale + bias


# --- contractions ---------------------------------------------------------------------

def _matmul(attrs, a, b):
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def _linear(attrs, x, w, b=None):
    y = np.matmul(x, w)
    return y if b is None else y + b


def _conv2d(attrs, x, w, b=None):
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilations"]
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    # im2col as a strided view: every dilated window, then every stride-th one;
    # windows [N, C, OH, OW, KH, KW] contracted with w [O, C, KH, KW] in one BLAS call.
    span = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    windows = np.lib.stride_tricks.sliding_window_view(xp, span, axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw, ::dh, ::dw]
    y = np.tensordot(windows, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    return y if b is None else y + b[:, None, None]


def _attention(attrs, q, k, v):
    scale = attrs.get("scale")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if attrs["causal"]:
        # Top-left aligned: query i sees keys 0..i, whatever Lq and Lk are.
        lq, lk = s.shape[-2:]
        s = np.where(np.triu(np.ones((lq, lk), dtype=bool), k=1), -np.inf, s)
    return np.matmul(_softmax_along(s, -1), v)


def _one_hot(attrs, indices, on, off):
    axis = norm_axis(attrs["axis"], indices.ndim + 1)
    hot = np.expand_dims(indices, axis) == np.arange(attrs["depth"]).reshape(
        (-1,) + (1,) * (indices.ndim - axis))
    return np.where(hot, on.reshape(()), off.reshape(()))


# --- data movement --------------------------------------------------------------------

def _slice(attrs, x):
    return x[tuple(slice(start, start + step * (n - 1) + 1, step)
                   for start, step, n in slice_params(x.shape, attrs))]


def _pad(attrs, x):
    return np.pad(x, attrs["pads"], constant_values=attrs["value"])


# --- the table ------------------------------------------------------------------------

Impl = Callable[..., np.ndarray]  # (attrs, *args) -> array


def _elementwise(fn: Callable) -> Impl:
    return lambda attrs, *args: fn(*args)


IMPLS: dict[str, Impl] = {
    # unary
    "neg": _elementwise(np.negative),
    "abs": _elementwise(np.abs),
    "exp": _elementwise(np.exp),
    "log": _elementwise(np.log),
    "sqrt": _elementwise(np.sqrt),
    "rsqrt": _elementwise(lambda x: 1.0 / np.sqrt(x)),
    "tanh": _elementwise(np.tanh),
    "erf": _elementwise(erf),
    "sigmoid": _elementwise(_sigmoid),
    "relu": _elementwise(lambda x: np.maximum(x, 0)),
    "reciprocal": _elementwise(lambda x: 1.0 / x),
    "floor": _elementwise(np.floor),
    "ceil": _elementwise(np.ceil),
    "cast": _cast,
    # binary (numpy broadcasting)
    "add": _elementwise(np.add),
    "sub": _elementwise(np.subtract),
    "mul": _elementwise(np.multiply),
    "div": _div,
    "pow": _elementwise(np.power),
    "maximum": _elementwise(np.maximum),
    "minimum": _elementwise(np.minimum),
    "greater": _compare(np.greater),
    "less": _compare(np.less),
    "equal": _compare(np.equal),
    "greater_equal": _compare(np.greater_equal),
    "less_equal": _compare(np.less_equal),
    "not_equal": _compare(np.not_equal),
    "select": _elementwise(lambda cond, a, b: np.where(cond != 0, a, b)),
    # reductions
    "reduce_sum": _reduction(np.sum),
    "reduce_max": _reduction(np.max),
    "reduce_min": _reduction(np.min),
    "reduce_prod": _reduction(np.prod),
    # contractions
    "matmul": _matmul,
    "conv2d": _conv2d,
    # data movement
    "transpose": lambda attrs, x: np.transpose(x, attrs.get("perm")),
    "reshape": lambda attrs, x: np.reshape(x, attrs["shape"]),
    "broadcast_to": lambda attrs, x: np.broadcast_to(x, attrs["shape"]),
    "slice": _slice,
    "concat": lambda attrs, *xs: np.concatenate(xs, axis=attrs["axis"]),
    "pad": _pad,
    # composites
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "logsumexp": _logsumexp,
    "reduce_mean": _reduction(np.mean),
    "variance": _reduction(np.var),  # ddof=0: the population variance
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "batch_norm": _batch_norm,
    "gelu": _gelu,
    "silu": _elementwise(lambda x: x * _sigmoid(x)),
    "linear": _linear,
    "one_hot": _one_hot,
    "attention": _attention,
}


def random_inputs(graph, seed: int = 0, symbols: dict[str, int] | None = None
                  ) -> dict[str, np.ndarray]:
    """Inputs in a range every op is defined on: positive for float (log, sqrt, pow),
    small nonzero integers for int32 and int64 (div), 0 and 1 for bool. A symbolic graph's shapes
    take `symbols` (each symbol not given: 16, or the end of its range nearer to it)."""
    rng = np.random.default_rng(seed)
    values = symbol_values(graph, symbols or {}) if graph.symbols else {}
    out = {}
    for t in graph.inputs:
        shape = substitute_shape(t.type.shape, values)
        if t.type.dtype in INT_BITS:
            v = rng.integers(1, 10, size=shape) * rng.choice([-1, 1], size=shape)
        elif t.type.dtype == "bool":
            v = rng.integers(0, 2, size=shape)
        else:
            v = rng.uniform(0.5, 2.0, size=shape)
        out[t.name] = np.asarray(v, dtype=t.type.dtype)
    return out
