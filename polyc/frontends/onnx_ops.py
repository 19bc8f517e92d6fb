"""Each ONNX op as ops of polyc's format (`onnx.py` drives; `Importer` is its state).

A converter takes the importer and the node's inputs (polyc tensor names, "" for an
absent optional input) and returns its outputs' tensors. Ops without a primitive of
their own are written with the ones there are (LeakyRelu as a select, HardSwish as a
clamp and a product, Einsum as a broadcast product and a sum), in the node's dtype.
"""
from __future__ import annotations

import math
import string
from typing import Callable

import numpy as np

from ..graph.ir import INT_BITS
from .onnx_state import Importer, dtype_name

Converter = Callable[..., list[str]]
CONVERTERS: dict[str, Converter] = {}
# ops evaluated at import when all their inputs are constants; Shape and Constant always
FOLD_ALWAYS = ("Constant", "Shape")
# the inputs that say how rather than what (a shape, axes, bounds): known at import
SHAPE_INPUTS = {"Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3),
                "Squeeze": (1,), "Unsqueeze": (1,), "ReduceSum": (1,), "ReduceMax": (1,),
                "ReduceMin": (1,), "ReduceMean": (1,), "ReduceSumSquare": (1,),
                "ReduceLogSumExp": (1,), "ReduceL2": (1,)}


def op(*names: str):
    def register(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[n] = fn
        return fn
    return register


def convert(imp: Importer, node) -> None:
    if node.domain not in ("", "ai.onnx"):
        raise imp.fail(f"ops of domain '{node.domain}' are not supported")
    present = [v for v in node.input if v]
    for v in present:
        if not imp.defined(v):
            raise imp.fail(f"input '{v}' is not defined (no graph input, initializer or "
                           "earlier node output has that name)", field="input")
    # any op on constants alone is evaluated here, supported or not: exporters write
    # shape arithmetic with Gather, Cast, Range...
    if node.op_type in FOLD_ALWAYS or (present and all(
            imp.alias.get(v, v) in imp.consts for v in present)):
        _fold(imp, node)
        return
    if node.op_type not in CONVERTERS:
        raise imp.fail(f"ONNX op {node.op_type} is not supported by polyc's importer "
                       f"(supported: {', '.join(sorted(CONVERTERS))})")
    for pos in SHAPE_INPUTS.get(node.op_type, ()):
        if pos < len(node.input) and node.input[pos]:
            imp.known(node.input[pos], _input_name(node, pos))
    start = len(imp.nodes)
    try:
        outs = CONVERTERS[node.op_type](imp, list(node.input), **imp.attrs())
    except TypeError as e:  # an attribute the op does not have
        raise imp.fail(f"unexpected attribute: {e}") from e
    made = {n["outputs"][0] for n in imp.nodes[start:]}
    for value, tensor in zip(node.output, outs):
        if value and tensor != value:
            if tensor in made:  # the tensor this node made takes the ONNX name
                _rename(imp, start, tensor, value)
            else:  # an Identity, a no-op reduction: the value is another's tensor
                imp.alias[value] = tensor
    extra = [v for v in node.output[len(outs):] if v]
    if extra:
        raise imp.fail(f"output '{extra[0]}' of {node.op_type} is not supported", field="output")


def _input_name(node, pos: int) -> str:
    """The name ONNX's schema gives input `pos` of the node's op."""
    import onnx

    schema = onnx.defs.get_schema(node.op_type, node.domain or "")
    return schema.inputs[min(pos, len(schema.inputs) - 1)].name


def _rename(imp: Importer, start: int, old: str, new: str) -> None:
    """The tensor `old`, written since node `start`, renamed `new` where it is written
    and read."""
    imp.types[new] = imp.types.pop(old)
    for n in imp.nodes[start:]:
        n["inputs"] = [new if v == old else v for v in n["inputs"]]
        n["outputs"] = [new if v == old else v for v in n["outputs"]]


def _fold(imp: Importer, node) -> None:
    """Evaluates a node on constants with ONNX's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Shape":
        a = imp.attrs()
        shape = np.array(imp.shape(node.input[0]), dtype=np.int64)
        imp.consts[node.output[0]] = shape[a.get("start", 0):a.get("end", len(shape))]
        return
    feeds = {v: imp.consts[imp.alias.get(v, v)] for v in node.input if v}
    try:
        got = ReferenceEvaluator(node).run(None, feeds)
    except Exception as e:  # the node is wrong for its constant inputs
        raise imp.fail(f"cannot evaluate on its constant inputs: {e}") from e
    for value, a in zip(node.output, got):
        if value:
            imp.consts[value] = np.asarray(a)


# --- elementwise ---------------------------------------------------------------------

SIMPLE = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Neg": "neg", "Abs": "abs",
          "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
          "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf",
          "Floor": "floor", "Ceil": "ceil"}


@op(*SIMPLE)
def _simple(imp: Importer, inputs, **attrs):
    return [imp.op(SIMPLE[imp.node.op_type], *map(imp.tensor, inputs))]


@op("Pow")
def _pow(imp: Importer, inputs):
    x, y = inputs
    dt = imp.dtype(x)
    # polyc's pow is float only: in float64 the powers of integers are exact up to 2^53
    # (every int32 result; an int64 result past that is rounded)
    if dt in INT_BITS:
        xf, yf = (imp.op("cast", imp.tensor(v), to="float64") for v in (x, y))
        return [imp.op("cast", imp.op("pow", xf, yf), to=dt)]
    if imp.dtype(y) != dt:  # ONNX lets the exponent have its own type
        y = imp.op("cast", imp.tensor(y), to=dt)
    return [imp.op("pow", imp.tensor(x), imp.tensor(y))]


@op("Max", "Min", "Sum", "Mean")
def _variadic(imp: Importer, inputs):
    kind = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[imp.node.op_type]
    acc = imp.tensor(inputs[0])
    for v in inputs[1:]:
        acc = imp.op(kind, acc, imp.tensor(v))
    if imp.node.op_type == "Mean":
        acc = imp.op("div", acc, imp.const(len(inputs), imp.dtype(inputs[0])))
    return [acc]


def _scalar(imp: Importer, v: float, like: str) -> str:
    return imp.const(v, imp.dtype(like))


@op("Clip")
def _clip(imp: Importer, inputs):
    x = imp.tensor(inputs[0])
    lo = inputs[1] if len(inputs) > 1 else ""
    hi = inputs[2] if len(inputs) > 2 else ""
    if lo:
        x = imp.op("maximum", x, imp.tensor(lo))
    if hi:
        x = imp.op("minimum", x, imp.tensor(hi))
    return [x]


@op("Sign")
def _sign(imp: Importer, inputs):
    x = imp.tensor(inputs[0])
    zero = _scalar(imp, 0, x)
    return [imp.op("sub", imp.op("greater", x, zero), imp.op("less", x, zero))]


def _where_positive(imp: Importer, x: str, negative: str) -> str:
    """x where x > 0, else `negative`."""
    return imp.op("select", imp.op("greater", x, _scalar(imp, 0, x)), x, negative)


@op("LeakyRelu")
def _leaky_relu(imp: Importer, inputs, alpha: float = 0.01):
    x = imp.tensor(inputs[0])
    return [_where_positive(imp, x, imp.op("mul", x, _scalar(imp, alpha, x)))]


def _expm1_scaled(imp: Importer, x: str, alpha: float) -> str:
    e = imp.op("sub", imp.op("exp", x), _scalar(imp, 1, x))
    return imp.op("mul", e, _scalar(imp, alpha, x))


@op("Elu")
def _elu(imp: Importer, inputs, alpha: float = 1.0):
    x = imp.tensor(inputs[0])
    return [_where_positive(imp, x, _expm1_scaled(imp, x, alpha))]


@op("Selu")
def _selu(imp: Importer, inputs, alpha: float = 1.67326319217681884765625,
          gamma: float = 1.05070102214813232421875):
    x = imp.tensor(inputs[0])
    return [imp.op("mul", _where_positive(imp, x, _expm1_scaled(imp, x, alpha)),
                   _scalar(imp, gamma, x))]


def _hard(imp: Importer, x: str, alpha: float, beta: float) -> str:
    """max(0, min(1, alpha * x + beta))"""
    t = imp.op("add", imp.op("mul", x, _scalar(imp, alpha, x)), _scalar(imp, beta, x))
    return imp.op("maximum", imp.op("minimum", t, _scalar(imp, 1, x)), _scalar(imp, 0, x))


@op("HardSigmoid")
def _hard_sigmoid(imp: Importer, inputs, alpha: float = 0.2, beta: float = 0.5):
    return [_hard(imp, imp.tensor(inputs[0]), alpha, beta)]


@op("HardSwish")
def _hard_swish(imp: Importer, inputs):
    x = imp.tensor(inputs[0])
    return [imp.op("mul", x, _hard(imp, x, 1 / 6, 0.5))]


def _softplus_of(imp: Importer, x: str) -> str:
    return imp.op("log", imp.op("add", imp.op("exp", x), _scalar(imp, 1, x)))


@op("Softplus")
def _softplus(imp: Importer, inputs):
    return [_softplus_of(imp, imp.tensor(inputs[0]))]


@op("Softsign")
def _softsign(imp: Importer, inputs):
    x = imp.tensor(inputs[0])
    return [imp.op("div", x, imp.op("add", imp.op("abs", x), _scalar(imp, 1, x)))]


@op("Mish")
def _mish(imp: Importer, inputs):
    x = imp.tensor(inputs[0])
    return [imp.op("mul", x, imp.op("tanh", _softplus_of(imp, x)))]


@op("Gelu")
def _gelu(imp: Importer, inputs, approximate: str = "none"):
    if approximate not in ("none", "tanh"):
        raise imp.fail(f"approximate must be 'none' or 'tanh', got {approximate!r}",
                       field="approximate")
    return [imp.op("gelu", imp.tensor(inputs[0]), approximate=approximate)]


@op("Cast")
def _cast(imp: Importer, inputs, to: int, saturate: int = 1):
    return [imp.op("cast", imp.tensor(inputs[0]), to=dtype_name(to, "to"))]


@op("Identity")
def _identity(imp: Importer, inputs):
    return [imp.tensor(inputs[0])]


@op("Where")
def _where(imp: Importer, inputs):
    return [imp.op("select", *map(imp.tensor, inputs))]


# compare ops answer 0/1 in their inputs' dtype; ONNX's answer is bool
def _to_bool(imp: Importer, t: str) -> str:
    return imp.op("cast", t, to="bool")


@op("Greater", "Less", "Equal")
def _compare(imp: Importer, inputs):
    name = imp.node.op_type.lower()
    return [_to_bool(imp, imp.op(name, *map(imp.tensor, inputs)))]


@op("GreaterOrEqual", "LessOrEqual")
def _compare_or_equal(imp: Importer, inputs):
    a, b = map(imp.tensor, inputs)
    strict = "greater" if imp.node.op_type == "GreaterOrEqual" else "less"
    # max of the two answers, not 1 - the opposite: a NaN compares false both ways
    either = imp.op("maximum", imp.op(strict, a, b), imp.op("equal", a, b))
    return [_to_bool(imp, either)]


# --- normalisations, softmax ----------------------------------------------------------

@op("Softmax", "LogSoftmax")
def _softmax(imp: Importer, inputs, axis: int = -1):
    name = "softmax" if imp.node.op_type == "Softmax" else "log_softmax"
    return [imp.op(name, imp.tensor(inputs[0]), axis=axis)]


def _param(imp: Importer, value: str, shape: tuple[int, ...]) -> str:
    """A scale or bias broadcast to exactly the normalised dims' shape, as polyc asks."""
    t = imp.tensor(value)
    have = imp.shape(value)
    if have == shape:
        return t
    if len(have) > len(shape) and all(d == 1 for d in have[:len(have) - len(shape)]):
        have = have[len(have) - len(shape):]
        t = imp.op("reshape", t, shape=list(have))
    return imp.op("broadcast_to", t, shape=list(shape))


def _normalised(imp: Importer, value: str, axis: int) -> tuple[str, int, int]:
    """The tensor a normalisation reads, its first normalised axis and its rank."""
    x = imp.tensor(value)
    rank = len(imp.shape(x))
    return x, axis + rank if axis < 0 else axis, rank


@op("LayerNormalization")
def _layer_norm(imp: Importer, inputs, axis: int = -1, epsilon: float = 1e-5,
                stash_type: int = 1):
    x, axis, rank = _normalised(imp, inputs[0], axis)
    dims = imp.shape(x)[axis:]
    params = [_param(imp, v, dims) for v in inputs[1:3] if v]
    outs = [imp.op("layer_norm", x, *params, axis=axis, epsilon=epsilon)]
    wanted = [v for v in imp.node.output[1:] if v]
    if wanted:  # Mean and InvStdDev, kept dims
        axes = list(range(axis, rank))
        mean = imp.op("reduce_mean", x, axes=axes, keepdims=True)
        var = imp.op("variance", x, axes=axes, keepdims=True)
        inv = imp.op("rsqrt", imp.op("add", var, _scalar(imp, epsilon, x)))
        outs += [mean, inv]
    return outs


@op("RMSNormalization")
def _rms_norm(imp: Importer, inputs, axis: int = -1, epsilon: float = 1e-5,
              stash_type: int = 1):
    x, axis, _ = _normalised(imp, inputs[0], axis)
    return [imp.op("rms_norm", x, _param(imp, inputs[1], imp.shape(x)[axis:]), axis=axis,
                   epsilon=epsilon)]


@op("BatchNormalization")
def _batch_norm(imp: Importer, inputs, epsilon: float = 1e-5, momentum: float = 0.9,
                training_mode: int = 0):
    if training_mode:
        raise imp.fail("training_mode 1 (statistics of the batch) is not supported; "
                       "polyc compiles the inference form", field="training_mode")
    return [imp.op("batch_norm", *map(imp.tensor, inputs), epsilon=epsilon)]


# --- contractions ---------------------------------------------------------------------

@op("MatMul")
def _matmul(imp: Importer, inputs):
    return [imp.op("matmul", *map(imp.tensor, inputs))]


@op("Gemm")
def _gemm(imp: Importer, inputs, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,
          transB: int = 0):
    a, b = imp.tensor(inputs[0]), imp.tensor(inputs[1])
    y = imp.op("matmul", a, b, transpose_a=bool(transA), transpose_b=bool(transB))
    if alpha != 1.0:
        y = imp.op("mul", y, _scalar(imp, alpha, a))
    if len(inputs) > 2 and inputs[2]:
        c = imp.tensor(inputs[2])
        if beta != 1.0:
            c = imp.op("mul", c, _scalar(imp, beta, a))
        y = imp.op("add", y, c)
    return [y]


MAX_GROUPS = 64  # a convolution per group: a depthwise one over many channels is refused


@op("Conv")
def _conv(imp: Importer, inputs, auto_pad: str = "NOTSET", dilations=None, group: int = 1,
          kernel_shape=None, pads=None, strides=None):
    x, w = imp.tensor(inputs[0]), imp.tensor(inputs[1])
    xs, ws = imp.shape(x), imp.shape(w)
    if len(xs) not in (3, 4):
        raise imp.fail(f"only 1-D and 2-D convolutions (a 3-D or 4-D input) are supported, "
                       f"got rank {len(xs)}")
    if xs[1] % group or ws[0] % group or group > MAX_GROUPS:
        raise imp.fail(f"group {group} with {xs[1]} input and {ws[0]} output channels: polyc "
                       f"takes up to {MAX_GROUPS} groups that divide both", field="group")
    one_d = len(xs) == 3
    if one_d:  # a 1-D convolution is a 2-D one over an image of height 1
        x = imp.op("reshape", x, shape=[*xs[:2], 1, xs[2]])
        w = imp.op("reshape", w, shape=[*ws[:2], 1, ws[2]])
        xs, ws = imp.shape(x), imp.shape(w)
        dilations, strides = [1, *(dilations or (1,))], [1, *(strides or (1,))]
        pads = [0, pads[0], 0, pads[1]] if pads else None
    dilations = list(dilations or (1, 1))
    strides = list(strides or (1, 1))
    if auto_pad in ("NOTSET", ""):
        pads = list(pads or (0, 0, 0, 0))
    elif auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0, 0, 0, 0]
        for i in range(2):
            out = -(-xs[2 + i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (ws[2 + i] - 1) * dilations[i] + 1 - xs[2 + i])
            small, big = total // 2, total - total // 2
            pads[i], pads[2 + i] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    else:
        raise imp.fail(f"unknown auto_pad {auto_pad!r}", field="auto_pad")
    args = [x, w] + ([imp.tensor(inputs[2])] if len(inputs) > 2 and inputs[2] else [])
    y = imp.op("concat", *[
        imp.op("conv2d", *_group(imp, args, g, group), strides=strides, pads=pads,
               dilations=dilations) for g in range(group)], axis=1) if group > 1 else \
        imp.op("conv2d", *args, strides=strides, pads=pads, dilations=dilations)
    if one_d:
        n, o, _, length = imp.shape(y)
        y = imp.op("reshape", y, shape=[n, o, length])
    return [y]


def _group(imp: Importer, args: list[str], g: int, groups: int) -> list[str]:
    """Group `g`'s input channels, filters and bias: a grouped convolution is one
    convolution per group, concatenated over the output channels."""
    out = []
    for k, t in enumerate(args):
        n = imp.shape(t)[1 if k == 0 else 0] // groups
        out.append(imp.op("slice", t, starts=[g * n], ends=[(g + 1) * n], axes=[1 if k == 0 else 0]))
    return out


@op("Einsum")
def _einsum(imp: Importer, inputs, equation: str):
    """Each operand transposed to one order of all the letters (the output's, then the
    summed ones) with 1s for those it lacks, the product broadcast, the summed letters
    reduced: a contraction the fusion oracle sees as one reduction of a product."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if "." in eq:
        raise imp.fail("ellipsis ('...') in an einsum equation is not supported",
                       field="equation")
    if len(terms) != len(inputs) or any(not set(t) <= set(string.ascii_letters) for t in terms):
        raise imp.fail(f"equation {equation!r} does not match {len(inputs)} operand(s)",
                       field="equation")
    if any(len(set(t)) != len(t) for t in terms):
        raise imp.fail("a letter repeated within one operand (a diagonal) is not supported",
                       field="equation")
    if not arrow:
        counts = {c: lhs.count(c) for c in set(lhs.replace(",", ""))}
        out = "".join(sorted(c for c, n in counts.items() if n == 1))
    summed = sorted(set(lhs.replace(",", "")) - set(out))
    order = list(out) + summed
    sizes: dict[str, int] = {}
    acc = None
    for term, v in zip(terms, inputs):
        t, shape = imp.tensor(v), imp.shape(v)
        for c, d in zip(term, shape):
            if sizes.get(c, d) != d and 1 not in (d, sizes[c]):
                raise imp.fail(f"letter {c!r} has sizes {sizes[c]} and {d}", field="equation")
            sizes[c] = max(sizes.get(c, d), d)
        mine = [c for c in order if c in term]
        perm = [term.index(c) for c in mine]
        if perm != sorted(perm):
            t = imp.op("transpose", t, perm=perm)
        full = [shape[term.index(c)] if c in term else 1 for c in order]
        if len(full) != len(shape):
            t = imp.op("reshape", t, shape=full or [])
        acc = t if acc is None else imp.op("mul", acc, t)
    if summed:
        acc = imp.op("reduce_sum", acc, axes=list(range(len(out), len(order))))
    return [acc]


# --- data movement --------------------------------------------------------------------

def _axes(imp: Importer, inputs, attr, rank: int | None = None) -> list[int]:
    """The axes of a Squeeze or Unsqueeze (an input since opset 13), made non-negative
    against `rank` (the output's for an Unsqueeze: the input's plus one per axis)."""
    axes = imp.known(inputs[1], "axes").tolist() if len(inputs) > 1 and inputs[1] else attr
    axes = list(axes or [])
    rank = len(imp.shape(inputs[0])) + len(axes) if rank is None else rank
    return sorted(a + rank if a < 0 else a for a in axes)


@op("Reshape")
def _reshape(imp: Importer, inputs, allowzero: int = 0):
    have = imp.shape(inputs[0])
    want = imp.known(inputs[1], "shape").tolist()
    if not allowzero:  # a 0 keeps the input's dim
        want = [have[i] if d == 0 and i < len(have) else d for i, d in enumerate(want)]
    if -1 in want:
        rest = math.prod(d for d in want if d != -1)
        want[want.index(-1)] = math.prod(have) // rest if rest else 0
    return [imp.op("reshape", imp.tensor(inputs[0]), shape=want)]


@op("Flatten")
def _flatten(imp: Importer, inputs, axis: int = 1):
    have = imp.shape(inputs[0])
    axis = axis + len(have) if axis < 0 else axis
    want = [math.prod(have[:axis]), math.prod(have[axis:])]
    return [imp.op("reshape", imp.tensor(inputs[0]), shape=want)]


@op("Squeeze")
def _squeeze(imp: Importer, inputs, axes=None):
    have = imp.shape(inputs[0])
    drop = _axes(imp, inputs, axes, len(have)) or [i for i, d in enumerate(have) if d == 1]
    if any(have[a] != 1 for a in drop):
        raise imp.fail(f"cannot squeeze axes {drop} of shape {list(have)}", field="axes")
    want = [d for i, d in enumerate(have) if i not in drop]
    return [imp.op("reshape", imp.tensor(inputs[0]), shape=want)]


@op("Unsqueeze")
def _unsqueeze(imp: Importer, inputs, axes=None):
    have = list(imp.shape(inputs[0]))
    for a in _axes(imp, inputs, axes):
        have.insert(a, 1)
    return [imp.op("reshape", imp.tensor(inputs[0]), shape=have)]


@op("Expand")
def _expand(imp: Importer, inputs):
    want = imp.known(inputs[1], "shape").tolist()
    out = list(np.broadcast_shapes(tuple(imp.shape(inputs[0])), tuple(want)))
    return [imp.op("broadcast_to", imp.tensor(inputs[0]), shape=out)]


@op("Transpose")
def _transpose(imp: Importer, inputs, perm=None):
    attrs = {} if perm is None else {"perm": list(perm)}
    return [imp.op("transpose", imp.tensor(inputs[0]), **attrs)]


@op("Concat")
def _concat(imp: Importer, inputs, axis: int):
    parts = [imp.tensor(v) for v in inputs if math.prod(imp.shape(v)) > 0]
    return [imp.op("concat", *parts, axis=axis)]


@op("Slice")
def _slice(imp: Importer, inputs):
    x = imp.tensor(inputs[0])
    shape = imp.shape(x)
    starts = imp.known(inputs[1], "starts").tolist()
    ends = imp.known(inputs[2], "ends").tolist()
    axes = (imp.known(inputs[3], "axes").tolist() if len(inputs) > 3 and inputs[3]
            else list(range(len(starts))))
    steps = (imp.known(inputs[4], "steps").tolist() if len(inputs) > 4 and inputs[4]
             else [1] * len(starts))
    out_s, out_e, out_a, out_st = [], [], [], []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = a + len(shape) if a < 0 else a
        if st <= 0:
            raise imp.fail(f"step {st} on axis {a}: polyc slices with positive steps",
                           field="steps")
        d = shape[a]
        # ONNX clamps out-of-range bounds (INT64_MAX means "to the end")
        s = min(max(s + d if s < 0 else s, 0), d)
        e = min(max(e + d if e < 0 else e, 0), d)
        out_s.append(s), out_e.append(e), out_a.append(a), out_st.append(st)
    if any(e <= s for s, e in zip(out_s, out_e)):
        raise imp.fail("the slice is empty: polyc tensors have no zero-sized dims",
                       field="starts")
    return [imp.op("slice", x, starts=out_s, ends=out_e, axes=out_a, steps=out_st)]


@op("Pad")
def _pad(imp: Importer, inputs, mode: str = "constant"):
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise imp.fail(f"unknown pad mode {mode!r}", field="mode")
    x = imp.tensor(inputs[0])
    rank = len(imp.shape(x))
    pads = imp.known(inputs[1], "pads").tolist()
    axes = (imp.known(inputs[3], "axes").tolist() if len(inputs) > 3 and inputs[3]
            else list(range(rank)))
    value = 0.0
    if len(inputs) > 2 and inputs[2]:
        value = float(np.asarray(imp.known(inputs[2], "constant_value")).reshape(-1)[0])
    pairs = [[0, 0] for _ in range(rank)]
    for i, a in enumerate(axes):
        a = a + rank if a < 0 else a
        pairs[a] = [pads[i], pads[i + len(axes)]]
    if any(p < 0 for pair in pairs for p in pair):
        raise imp.fail("negative pads (cropping) are not supported", field="pads")
    if mode == "constant":
        return [imp.op("pad", x, pads=pairs, value=value)]
    for axis, (before, after) in enumerate(pairs):
        if before or after:
            x = _pad_from_input(imp, x, axis, before, after, mode)
    return [x]


def _pad_from_input(imp: Importer, x: str, axis: int, before: int, after: int, mode: str) -> str:
    """Pad one axis with the input's own elements: a concat of slices of it (an element
    at a time where `reflect` reverses them: polyc slices step forward only)."""
    n = imp.shape(x)[axis]
    if mode == "reflect" and max(before, after) >= n:
        raise imp.fail(f"reflect pads of {max(before, after)} on axis {axis} need more than "
                       f"{n} elements", field="pads")

    def rows(start: int, stop: int) -> str:
        return imp.op("slice", x, starts=[start], ends=[stop], axes=[axis])

    def repeated(start: int, count: int) -> list[str]:
        shape = list(imp.shape(x))
        shape[axis] = count
        return [imp.op("broadcast_to", rows(start, start + 1), shape=shape)] if count else []

    if mode == "edge":
        head, tail = repeated(0, before), repeated(n - 1, after)
    elif mode == "reflect":
        head = [rows(i, i + 1) for i in range(before, 0, -1)]
        tail = [rows(n - 1 - i, n - i) for i in range(1, after + 1)]
    else:  # wrap: the elements cyclically before the first and after the last
        head = [rows((k - before) % n, (k - before) % n + 1) for k in range(before)]
        tail = [rows(k % n, k % n + 1) for k in range(after)]
    return imp.op("concat", *head, x, *tail, axis=axis)


# --- reductions -----------------------------------------------------------------------

@op("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceSumSquare",
    "ReduceLogSumExp", "ReduceL2")
def _reduce(imp: Importer, inputs, axes=None, keepdims: int = 1, noop_with_empty_axes: int = 0):
    x = imp.tensor(inputs[0])
    if len(inputs) > 1 and inputs[1]:
        axes = imp.known(inputs[1], "axes").tolist()
    if not axes:
        if noop_with_empty_axes:
            return [x]
        axes = list(range(len(imp.shape(x))))
    kind = imp.node.op_type
    if kind in ("ReduceSumSquare", "ReduceL2"):
        x = imp.op("mul", x, x)
    name = {"ReduceSum": "reduce_sum", "ReduceMax": "reduce_max", "ReduceMin": "reduce_min",
            "ReduceMean": "reduce_mean", "ReduceSumSquare": "reduce_sum",
            "ReduceLogSumExp": "logsumexp", "ReduceL2": "reduce_sum"}[kind]
    y = imp.op(name, x, axes=list(axes), keepdims=bool(keepdims))
    return [imp.op("sqrt", y) if kind == "ReduceL2" else y]


@op(*FOLD_ALWAYS)
def _folded(imp: Importer, inputs, **attrs):  # convert() folds these before they get here
    raise imp.fail("cannot be evaluated at import")
