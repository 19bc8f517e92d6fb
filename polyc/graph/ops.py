"""The op registry: for every op, its arity, its attributes and its type rule, as data.

`OPS[name]` is an `OpSpec`. `check_attrs` normalises a node's attributes (fills defaults,
canonicalises axes); `infer` computes the output type or raises `OpError` naming the
field at fault. The loader turns an `OpError` into a `Problem` naming the node.
Semantics follow numpy / ONNX, as DESIGN.md states.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .ir import DTYPES, INT_BITS, FrozenDict, TensorType
from .op_error import OpError
from .symbolic_rules import (not_broadcastable, same_shape, symbolic_broadcast,
                             symbolic_reshape, symbolic_slice)
from .symbols import as_int, at_least, is_identifier, is_static, is_static_shape, same_dim


# --- attribute kinds ---------------------------------------------------------------

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(name: str, v: Any) -> int:
    if not _is_int(v):
        raise OpError(f"expected an integer, got {v!r}", name)
    return v


def _float(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise OpError(f"expected a finite number, got {v!r}", name)
    return float(v)


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise OpError(f"expected true or false, got {v!r}", name)
    return v


def _ints(name: str, v: Any) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or not all(_is_int(x) for x in v):
        sym = next((x for x in v if is_identifier(x)), None) if isinstance(v, list) else None
        if sym is not None:
            raise OpError(f"expected a list of integers, got {v!r}: a symbol ({sym!r}) cannot "
                          "be used here, the value must be a constant", name)
        raise OpError(f"expected a list of integers, got {v!r}", name)
    return tuple(v)


def _pairs(name: str, v: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(v, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(_is_int(x) for x in p)
            for p in v):
        raise OpError(f"expected a list of [before, after] integer pairs, got {v!r}", name)
    return tuple(tuple(p) for p in v)


def _dtype(name: str, v: Any) -> str:
    if v not in DTYPES:
        raise OpError(f"expected one of {', '.join(DTYPES)}, got {v!r}", name)
    return v


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def check(name: str, v: Any) -> str:
        if v not in choices:
            raise OpError(f"expected one of {', '.join(map(repr, choices))}, got {v!r}", name)
        return v
    return check


REQUIRED = object()  # default of an attribute that must be given


@dataclass(frozen=True)
class Attr:
    kind: Callable[[str, Any], Any]
    default: Any = None  # None: optional with no value; REQUIRED: must be present


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: tuple[int, int]  # (min, max) number of inputs; max -1 = unbounded
    infer: Callable[["OpSpec", FrozenDict, list[TensorType]], TensorType]
    attrs: dict[str, Attr] = field(default_factory=dict)
    composite: bool = False
    float_only: bool = False  # refuses integers (transcendental or fractional results)
    family: str = ""


# --- helpers for type rules ----------------------------------------------------------

def norm_axis(axis: int, ndim: int, name: str = "axis") -> int:
    # A scalar has no axis at all (numpy raises AxisError for axis 0 of a 0-d array).
    if not -ndim <= axis < ndim:
        raise OpError(f"axis {axis} is out of range for a tensor of rank {ndim}", name)
    return axis % ndim


def norm_axes(axes: tuple[int, ...] | None, ndim: int, name: str = "axes") -> tuple[int, ...]:
    """Axes made non-negative and sorted; None means all axes."""
    if axes is None:
        return tuple(range(ndim))
    if len(axes) == 0:
        raise OpError("an empty list of axes is not allowed (omit 'axes' to reduce all)", name)
    out = tuple(sorted(norm_axis(a, ndim, name) for a in axes))
    if len(set(out)) != len(out):
        raise OpError(f"repeated axis in {list(axes)}", name)
    return out


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        dims = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0}
        dims.discard(1)
        if len(dims) > 1 and is_static_shape(dims):
            raise not_broadcastable(shapes)
        out.append(symbolic_broadcast(dims, shapes) if len(dims) > 1 else
                   dims.pop() if dims else 1)
    return tuple(out)


def _same_dtype(ts: list[TensorType], what: str = "inputs") -> str:
    dtypes = {t.dtype for t in ts}
    if len(dtypes) > 1:
        raise OpError("dtype mismatch: " + ", ".join(t.dtype for t in ts), what)
    return ts[0].dtype


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# --- type rules ------------------------------------------------------------------------

def _unary(spec, attrs, ts):
    return ts[0]


def _cast(spec, attrs, ts):
    return TensorType(ts[0].shape, attrs["to"])


def _binary(spec, attrs, ts):
    return TensorType(broadcast_shapes(*(t.shape for t in ts)), _same_dtype(ts))


def _select(spec, attrs, ts):
    dtype = _same_dtype(ts[1:])
    return TensorType(broadcast_shapes(*(t.shape for t in ts)), dtype)


def _reduce(spec, attrs, ts):
    axes = norm_axes(attrs.get("axes"), ts[0].ndim)
    return TensorType(reduced_shape(ts[0].shape, axes, attrs["keepdims"]), ts[0].dtype)


def matmul_shapes(a: tuple[int, ...], b: tuple[int, ...], ta: bool, tb: bool) -> tuple[int, ...]:
    if (ta and len(a) == 1) or (tb and len(b) == 1):
        raise OpError("transpose_a / transpose_b need an operand of rank >= 2",
                      "transpose_a" if ta and len(a) == 1 else "transpose_b")
    if len(a) == 0 or len(b) == 0:
        raise OpError("matmul operands must have rank >= 1", "inputs")
    a2 = (1,) + a if len(a) == 1 else a[:-2] + ((a[-1], a[-2]) if ta else a[-2:])
    b2 = b + (1,) if len(b) == 1 else b[:-2] + ((b[-1], b[-2]) if tb else b[-2:])
    if not same_dim(a2[-1], b2[-2], f"contraction dims {a2[-1]} and {b2[-2]} must be equal"):
        raise OpError(f"contraction dims differ: {a2[-1]} (from {list(a)}) vs {b2[-2]} "
                      f"(from {list(b)})", "inputs")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul(spec, attrs, ts):
    return TensorType(matmul_shapes(ts[0].shape, ts[1].shape, attrs["transpose_a"],
                                    attrs["transpose_b"]), _same_dtype(ts))


def _conv2d(spec, attrs, ts):
    x, w = ts[0], ts[1]
    if x.ndim != 4 or w.ndim != 4:
        raise OpError(f"conv2d needs x [N,C,H,W] and w [O,C,KH,KW], got {list(x.shape)} "
                      f"and {list(w.shape)}", "inputs")
    if not same_dim(x.shape[1], w.shape[1], "x's and w's input channels must be equal"):
        raise OpError(f"input channels differ: x has {x.shape[1]}, w has {w.shape[1]}",
                      "inputs")
    if len(ts) == 3 and not same_shape(ts[2].shape, (w.shape[0],), "bias must match w"):
        raise OpError(f"bias must have shape [{w.shape[0]}], got {list(ts[2].shape)}", "inputs")
    for key, n in (("strides", 2), ("pads", 4), ("dilations", 2)):
        if len(attrs[key]) != n:
            raise OpError(f"expected {n} integers, got {list(attrs[key])}", key)
    if min(attrs["strides"]) < 1:
        raise OpError("strides must be >= 1", "strides")
    if min(attrs["dilations"]) < 1:
        raise OpError("dilations must be >= 1", "dilations")
    if min(attrs["pads"]) < 0:
        raise OpError("pads must be >= 0", "pads")
    out = conv2d_out_hw(x.shape, w.shape, attrs)
    if not all(at_least(d, 1, "the output must not be empty") for d in out):
        raise OpError(f"the output would be empty ({out[0]}x{out[1]})", "inputs")
    return TensorType((x.shape[0], w.shape[0]) + out, _same_dtype(ts))


def conv2d_out_hw(xs, ws, attrs) -> tuple[int, int]:
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilations"]
    oh = (xs[2] + pt + pb - dh * (ws[2] - 1) - 1) // sh + 1
    ow = (xs[3] + pl + pr - dw * (ws[3] - 1) - 1) // sw + 1
    return as_int(oh), as_int(ow)


def _transpose(spec, attrs, ts):
    n = ts[0].ndim
    perm = attrs.get("perm")
    if perm is None:
        return TensorType(ts[0].shape[::-1], ts[0].dtype)
    if sorted(perm) != list(range(n)):
        raise OpError(f"{list(perm)} is not a permutation of the {n} axes", "perm")
    return TensorType(tuple(ts[0].shape[p] for p in perm), ts[0].dtype)


def reshape_target(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    if any(d == 0 or d < -1 for d in shape):
        raise OpError(f"dims must be >= 1 (or one -1), got {list(shape)}", "shape")
    if list(shape).count(-1) > 1:
        raise OpError("at most one -1 is allowed", "shape")
    known = math.prod(d for d in shape if d != -1)
    if not is_static(size):
        return symbolic_reshape(shape, size, known)
    if -1 in shape:
        if size % known:
            raise OpError(f"cannot reshape {size} elements into {list(shape)}", "shape")
        shape = tuple(size // known if d == -1 else d for d in shape)
    if math.prod(shape) != size:
        raise OpError(f"cannot reshape {size} elements into {list(shape)}", "shape")
    return shape


def _reshape(spec, attrs, ts):
    return TensorType(reshape_target(attrs["shape"], ts[0].size), ts[0].dtype)


def _broadcast_to(spec, attrs, ts):
    shape = attrs["shape"]
    if any(d < 1 for d in shape):
        raise OpError(f"dims must be >= 1, got {list(shape)}", "shape")
    src = ts[0].shape
    ok = len(src) <= len(shape) and all(
        s == 1 or same_dim(s, d, f"dim {s} must equal the target's {d}")
        for s, d in zip(src[::-1], shape[::-1]))
    if not ok:
        raise OpError(f"cannot broadcast {list(src)} to {list(shape)}", "shape")
    return TensorType(tuple(shape), ts[0].dtype)


def slice_params(shape: tuple[int, ...], attrs) -> list[tuple[int, int, int]]:
    """Per axis (start, step, length) of the numpy slice; whole axis where not sliced."""
    starts, ends = attrs["starts"], attrs["ends"]
    axes = attrs.get("axes")
    steps = attrs.get("steps")
    if axes is None:
        # The user wrote no 'axes', so an error must not name it.
        if len(starts) > len(shape):
            raise OpError(f"has {len(starts)} entries but the tensor has rank {len(shape)}",
                          "starts")
        axes = tuple(range(len(starts)))
    if steps is None:
        steps = (1,) * len(starts)
    for key, v in (("ends", ends), ("axes", axes), ("steps", steps)):
        if len(v) != len(starts):
            raise OpError(f"has {len(v)} entries but 'starts' has {len(starts)}", key)
    if any(s <= 0 for s in steps):
        raise OpError(f"steps must be > 0, got {list(steps)}", "steps")
    norm = [norm_axis(a, len(shape), "axes") for a in axes]
    if len(set(norm)) != len(norm):
        raise OpError(f"repeated axis in {list(axes)}", "axes")
    params = [(0, 1, d) for d in shape]
    for a, s, e, st in zip(norm, starts, ends, steps):
        if not is_static(shape[a]):
            params[a] = symbolic_slice(shape[a], s, e, st, a)
            continue
        start, stop, step = slice(s, e, st).indices(shape[a])
        length = len(range(start, stop, step))
        if length == 0:
            raise OpError(f"axis {a} would be empty (start {s}, end {e}, step {st} on a "
                          f"dim of {shape[a]})", "starts")
        params[a] = (start, step, length)
    return params


def _slice(spec, attrs, ts):
    return TensorType(tuple(p[2] for p in slice_params(ts[0].shape, attrs)), ts[0].dtype)


def _concat(spec, attrs, ts):
    nd = ts[0].ndim
    if nd == 0:
        raise OpError("cannot concatenate scalars", "inputs")
    axis = norm_axis(attrs["axis"], nd)
    for t in ts[1:]:
        if t.ndim != nd or any(not same_dim(a, b, f"dims outside axis {axis} must be equal")
                               for i, (a, b) in enumerate(zip(t.shape, ts[0].shape))
                               if i != axis):
            raise OpError("shapes " + ", ".join(str(list(t.shape)) for t in ts)
                          + f" differ outside axis {axis}", "inputs")
    shape = list(ts[0].shape)
    shape[axis] = as_int(sum(t.shape[axis] for t in ts))
    return TensorType(tuple(shape), _same_dtype(ts))


def _pad(spec, attrs, ts):
    pads = attrs["pads"]
    if len(pads) != ts[0].ndim:
        raise OpError(f"needs one [before, after] pair per axis ({ts[0].ndim}), got "
                      f"{len(pads)}", "pads")
    if any(x < 0 for p in pads for x in p):
        raise OpError(f"negative pads are not allowed, got {[list(p) for p in pads]}", "pads")
    return TensorType(tuple(as_int(d + a + b) for d, (a, b) in zip(ts[0].shape, pads)),
                      ts[0].dtype)


def _one_hot(spec, attrs, ts):
    indices, on, off = ts
    if indices.dtype not in INT_BITS:
        raise OpError(f"indices must be int32 or int64, got {indices.dtype}", "inputs")
    if on.size != 1 or off.size != 1:
        raise OpError(f"on_value and off_value must hold one value each, got "
                      f"{list(on.shape)} and {list(off.shape)}", "inputs")
    if attrs["depth"] < 1:
        raise OpError(f"must be >= 1, got {attrs['depth']}", "depth")
    # the new axis is placed among the output's dims, so -1 appends it
    axis = norm_axis(attrs["axis"], indices.ndim + 1)
    shape = indices.shape[:axis] + (attrs["depth"],) + indices.shape[axis:]
    return TensorType(shape, _same_dtype([on, off]))


def _norm_params(ts: list[TensorType], axis: int, what: tuple[str, ...]):
    x = ts[0]
    ax = norm_axis(axis, x.ndim)
    norm_shape = x.shape[ax:]
    for t, name in zip(ts[1:], what):
        if not same_shape(t.shape, norm_shape, f"{name} must have the normalised dims' shape"):
            raise OpError(f"{name} must have the normalised dims' shape {list(norm_shape)}, "
                          f"got {list(t.shape)}", "inputs")
    _same_dtype(ts)
    return x


def _layer_norm(spec, attrs, ts):
    return _norm_params(ts, attrs["axis"], ("gamma", "beta"))


def _rms_norm(spec, attrs, ts):
    return _norm_params(ts, attrs["axis"], ("gamma",))


def _batch_norm(spec, attrs, ts):
    x = ts[0]
    if x.ndim < 2:
        raise OpError(f"batch_norm needs rank >= 2 (channels on axis 1), got {list(x.shape)}",
                      "inputs")
    for t, name in zip(ts[1:], ("scale", "bias", "mean", "var")):
        if not same_shape(t.shape, (x.shape[1],), f"{name} must match x's channels"):
            raise OpError(f"{name} must have shape [{x.shape[1]}], got {list(t.shape)}",
                          "inputs")
    _same_dtype(ts)
    return x


def _softmax(spec, attrs, ts):
    norm_axis(attrs["axis"], ts[0].ndim)
    return ts[0]


def _linear(spec, attrs, ts):
    x, w = ts[0], ts[1]
    if w.ndim != 2:
        raise OpError(f"w must be [in, out], got {list(w.shape)}", "inputs")
    if x.ndim < 1 or not same_dim(x.shape[-1], w.shape[0], "x's last dim must equal w's first"):
        raise OpError(f"x's last dim must equal w's first ({w.shape[0]}), got "
                      f"{list(x.shape)}", "inputs")
    out = x.shape[:-1] + (w.shape[1],)
    if len(ts) == 3:
        if not same_shape(broadcast_shapes(out, ts[2].shape), out, "bias must broadcast"):
            raise OpError(f"bias {list(ts[2].shape)} does not broadcast to {list(out)}",
                          "inputs")
    return TensorType(out, _same_dtype(ts))


def _attention(spec, attrs, ts):
    q, k, v = ts
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise OpError("q, k and v need rank >= 2", "inputs")
    if not same_dim(q.shape[-1], k.shape[-1], "q and k must share the last dim"):
        raise OpError(f"q and k must share the last dim, got {q.shape[-1]} and "
                      f"{k.shape[-1]}", "inputs")
    if not same_dim(k.shape[-2], v.shape[-2], "k and v must share Lk"):
        raise OpError(f"k and v must share Lk, got {k.shape[-2]} and {v.shape[-2]}", "inputs")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    return TensorType(batch + (q.shape[-2], v.shape[-1]), _same_dtype(ts))


# --- the table -----------------------------------------------------------------------

_AXES = {"axes": Attr(_ints), "keepdims": Attr(_bool, False)}
_EPS = {"epsilon": Attr(_float, 1e-5)}


def _spec(name, arity, infer, attrs=None, **kw) -> OpSpec:
    return OpSpec(name, arity, infer, attrs or {}, **kw)


UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "relu",
         "reciprocal", "floor", "ceil")
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
COMPARE = ("greater", "less", "equal", "greater_equal", "less_equal", "not_equal")
REDUCE = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")
INT_OK_UNARY = ("neg", "abs", "relu")

OPS: dict[str, OpSpec] = {}
for _n in UNARY:
    OPS[_n] = _spec(_n, (1, 1), _unary, float_only=_n not in INT_OK_UNARY, family="unary")
for _n in BINARY:
    OPS[_n] = _spec(_n, (2, 2), _binary, float_only=_n == "pow", family="binary")
for _n in COMPARE:
    OPS[_n] = _spec(_n, (2, 2), _binary, family="binary")
for _n in REDUCE:
    OPS[_n] = _spec(_n, (1, 1), _reduce, dict(_AXES), family="reduce")
OPS.update({
    "cast": _spec("cast", (1, 1), _cast, {"to": Attr(_dtype, REQUIRED)}, family="unary"),
    "select": _spec("select", (3, 3), _select, family="select"),
    "matmul": _spec("matmul", (2, 2), _matmul, {"transpose_a": Attr(_bool, False),
                                                "transpose_b": Attr(_bool, False)},
                    family="matmul"),
    "conv2d": _spec("conv2d", (2, 3), _conv2d, {"strides": Attr(_ints, (1, 1)),
                                               "pads": Attr(_ints, (0, 0, 0, 0)),
                                               "dilations": Attr(_ints, (1, 1))},
                    family="conv2d"),
    "transpose": _spec("transpose", (1, 1), _transpose, {"perm": Attr(_ints)}, family="move"),
    "reshape": _spec("reshape", (1, 1), _reshape, {"shape": Attr(_ints, REQUIRED)},
                     family="move"),
    "broadcast_to": _spec("broadcast_to", (1, 1), _broadcast_to,
                          {"shape": Attr(_ints, REQUIRED)}, family="move"),
    "slice": _spec("slice", (1, 1), _slice, {"starts": Attr(_ints, REQUIRED),
                                             "ends": Attr(_ints, REQUIRED),
                                             "axes": Attr(_ints), "steps": Attr(_ints)},
                   family="move"),
    "concat": _spec("concat", (1, -1), _concat, {"axis": Attr(_int, REQUIRED)}, family="move"),
    "pad": _spec("pad", (1, 1), _pad, {"pads": Attr(_pairs, REQUIRED),
                                       "value": Attr(_float, 0.0)}, family="move"),
    # composites, opened by graph.decompose
    "softmax": _spec("softmax", (1, 1), _softmax, {"axis": Attr(_int, -1)},
                     composite=True, float_only=True),
    "log_softmax": _spec("log_softmax", (1, 1), _softmax, {"axis": Attr(_int, -1)},
                         composite=True, float_only=True),
    "logsumexp": _spec("logsumexp", (1, 1), _reduce, dict(_AXES), composite=True,
                       float_only=True),
    "reduce_mean": _spec("reduce_mean", (1, 1), _reduce, dict(_AXES), composite=True,
                         float_only=True),
    "variance": _spec("variance", (1, 1), _reduce, dict(_AXES), composite=True,
                      float_only=True),
    "layer_norm": _spec("layer_norm", (1, 3), _layer_norm, {"axis": Attr(_int, -1), **_EPS},
                        composite=True, float_only=True),
    "rms_norm": _spec("rms_norm", (1, 2), _rms_norm, {"axis": Attr(_int, -1), **_EPS},
                      composite=True, float_only=True),
    "batch_norm": _spec("batch_norm", (5, 5), _batch_norm, dict(_EPS), composite=True,
                        float_only=True),
    "gelu": _spec("gelu", (1, 1), _unary, {"approximate": Attr(_choice("none", "tanh"), "none")},
                  composite=True, float_only=True),
    "silu": _spec("silu", (1, 1), _unary, composite=True, float_only=True),
    "linear": _spec("linear", (2, 3), _linear, composite=True),
    "one_hot": _spec("one_hot", (3, 3), _one_hot, {"depth": Attr(_int, REQUIRED),
                                                   "axis": Attr(_int, -1)}, composite=True),
    "attention": _spec("attention", (3, 3), _attention, {"scale": Attr(_float),
                                                         "causal": Attr(_bool, False)},
                       composite=True, float_only=True),
})


def check_attrs(spec: OpSpec, attrs: dict) -> FrozenDict:
    """Validate attribute names and types, fill defaults. Raises OpError."""
    if not isinstance(attrs, dict):
        raise OpError(f"expected an object, got {attrs!r}", "attrs")
    for key in attrs:
        if key not in spec.attrs:
            allowed = ", ".join(spec.attrs) or "none"
            raise OpError(f"unknown attribute {key!r} (allowed: {allowed})", key)
    out = {}
    for key, a in spec.attrs.items():
        if key in attrs and attrs[key] is not None:
            out[key] = a.kind(key, attrs[key])
        elif a.default is REQUIRED:
            raise OpError("missing required attribute", key)
        elif a.default is not None:
            out[key] = a.default
    return FrozenDict(out)


def infer(spec: OpSpec, attrs: FrozenDict, types: list[TensorType]) -> TensorType:
    """The output type of `spec` applied to `types`. Raises OpError."""
    lo, hi = spec.arity
    if len(types) < lo or (hi != -1 and len(types) > hi):
        want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi != -1 else f"at least {lo}"
        raise OpError(f"expects {want} inputs, got {len(types)}", "inputs")
    integer = next((t.dtype for t in types if t.dtype in INT_BITS), None)
    if spec.float_only and integer:
        raise OpError(f"'{spec.name}' is not defined on {integer}", "inputs")
    return spec.infer(spec, attrs, types)
