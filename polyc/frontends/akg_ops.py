"""The AKG op table: each MindSpore primitive of the composite-kernel corpus as polyc ops,
with MindSpore's semantics (its operator documentation is the reference).

A handler names the attributes it takes (with their kinds) and emits polyc nodes
through the `Importer`, the last one producing the AKG op's output tensor. Notes on
semantics where polyc's ops differ:
- compare ops and IsInf / IsNan give bool: polyc's compare (0/1 in the inputs' dtype)
  then a cast to bool. LogicalOr / LogicalAnd / LogicalNot on bool are maximum,
  minimum and equal-to-false (bool is computed as 0.0 / 1.0, `graph.storage`).
- IsInf(x) is |x| > the largest finite value of x's dtype; IsNan(x) is x != x.
- MatMul with a `dst_type` wider than its inputs (float16 -> float32) casts the inputs
  (exactly) and multiplies in `dst_type`, as the cube accumulates in float32.
- Conv2D takes NHWC data and an [O, KH, KW, C] weight when its tensors are NHWC
  (NCHW / OIHW otherwise); `pad_list` is [top, bottom, left, right]; `stride` and
  `dilation` are 4 values in NCHW order; only `groups` 1.
- PadAkg(head, tail, pad_val) pads each axis; UnPadAkg(tail) cuts `tail` off its end.
- ElemAny(x) is 1 in `dst_type`, shape [1], when any element of x is nonzero, else 0.
- AddN sums its inputs; BroadcastTo's -1 keeps that dim.
- MatMul's optional third input is a bias, added to the float32 accumulator before the
  one rounding to `dst_type`.
- FRACTAL_NZ tensors (`akg_layout`) are taken by the elementwise ops, the reductions
  (axes on the NZ shape) and MatMul, which compute on their ND matrices.
Refused by name: Custom (user code), CReal / CImag / Complex (complex numbers),
Gather (an index read from a tensor is not an affine access).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..graph.ir import DTYPES, TensorType
from . import akg_layout
from .akg_import import AkgError, Importer, plain_format, same_type
from .akg_layout import NZ

Emit = Callable[[Importer, list, dict, TensorType], None]


# --- attribute kinds: value -> checked value, or ValueError naming what was expected ---

def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError("expected an integer")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("expected true or false")
    return v


def _ints(v: Any) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                          for x in v):
        raise ValueError("expected a list of integers")
    return v


def _int_or_ints(v: Any) -> list[int]:
    return [_int(v)] if not isinstance(v, list) else _ints(v)


def _dtype(v: Any) -> str:
    if v not in DTYPES:
        raise ValueError(f"expected one of {', '.join(DTYPES)}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("expected a string")
    return v


def _shapes(v: Any) -> list:
    if not isinstance(v, list):
        raise ValueError("expected a shape or a list of shapes")
    return v


def _format(v: Any) -> str:
    if v != NZ and not plain_format(v):
        raise ValueError(f"layout {v!r} is not supported (only plain row-major layouts "
                         f"and {NZ})")
    return v


def _formats(v: Any) -> list:
    if not isinstance(v, list) or not all(isinstance(f, str) for f in v):
        raise ValueError("expected a list of layout names")
    return v


@dataclass(frozen=True)
class Handler:
    emit: Emit
    attrs: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    refusal: str | None = None  # why polyc does not take this op (before any other check)
    nz: bool = False  # takes FRACTAL_NZ tensors (as their ND matrices, akg_layout)


def _one(ins: list, n: int | None = None) -> list[str]:
    """The op's tensors, one per input_desc entry; `n` of them when given."""
    flat = [t for group in ins for t in group]
    if n is not None and len(flat) != n:
        raise AkgError(f"expects {n} inputs, got {len(flat)}", "input_desc")
    return flat


# --- handlers ----------------------------------------------------------------------------

def _elementwise(op: str, arity: int) -> Handler:
    def emit(imp, ins, attrs, declared):
        imp.emit(op, *_one(ins, arity), out=imp.out)
    return Handler(emit, nz=True)


def _to_bool(imp: Importer, x: str) -> None:
    """The AKG op's bool output from a 0/1 tensor `x` (itself when already bool)."""
    if imp.types[x].dtype == "bool":
        imp.identity(x, imp.out)
    else:
        imp.emit("cast", x, out=imp.out, to="bool")


def _compare(op: str) -> Handler:
    def emit(imp, ins, attrs, declared):
        _to_bool(imp, imp.emit(op, *_one(ins, 2)))
    return Handler(emit, nz=True)


def _need_bool(imp: Importer, xs: list[str]) -> list[str]:
    for x in xs:
        if imp.types[x].dtype != "bool":
            raise AkgError(f"{imp.op} takes bool, got {imp.types[x]}", "input_desc")
    return xs


def _logical(op: str) -> Handler:
    def emit(imp, ins, attrs, declared):
        imp.emit(op, *_need_bool(imp, _one(ins, 2)), out=imp.out)
    return Handler(emit, nz=True)


def _logical_not(imp, ins, attrs, declared):
    (x,) = _need_bool(imp, _one(ins, 1))
    imp.emit("equal", x, imp.scalar(0, "bool"), out=imp.out)


_FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38,
              "float32": 3.4028234663852886e38, "float64": 1.7976931348623157e308}


def _float_input(imp: Importer, ins: list) -> str:
    (x,) = _one(ins, 1)
    if imp.types[x].dtype not in _FLOAT_MAX:
        raise AkgError(f"{imp.op} takes a float tensor, got {imp.types[x]}", "input_desc")
    return x


def _is_inf(imp, ins, attrs, declared):
    x = _float_input(imp, ins)
    big = imp.scalar(_FLOAT_MAX[imp.types[x].dtype], imp.types[x].dtype)
    _to_bool(imp, imp.emit("greater", imp.emit("abs", x), big))


def _is_nan(imp, ins, attrs, declared):
    x = _float_input(imp, ins)
    _to_bool(imp, imp.emit("not_equal", x, x))


def _cast(imp, ins, attrs, declared):
    to = attrs.get("dst_type", attrs.get("DstT"))
    if to is None:
        raise AkgError("missing required attribute", "attr.dst_type")
    if "DstT" in attrs and attrs["DstT"] != to:
        raise AkgError(f"DstT {attrs['DstT']!r} contradicts dst_type {to!r}", "attr.DstT")
    (x,) = _one(ins, 1)
    if "SrcT" in attrs and attrs["SrcT"] != imp.types[x].dtype:
        raise AkgError(f"SrcT {attrs['SrcT']!r} contradicts the input's "
                       f"{imp.types[x].dtype}", "attr.SrcT")
    imp.emit("cast", x, out=imp.out, to=to)


def _broadcast_to(imp, ins, attrs, declared):
    (x,) = _one(ins, 1)
    shape = list(attrs.get("shape", declared.shape))
    src = imp.types[x].shape
    for k in range(1, len(shape) + 1):  # -1 keeps the input's dim (aligned from the right)
        if shape[-k] == -1:
            if k > len(src):
                raise AkgError(f"-1 in {shape} has no input dim to keep", "attr.shape")
            shape[-k] = src[-k]
    imp.emit("broadcast_to", x, out=imp.out, shape=shape)


def _reshape(imp, ins, attrs, declared):
    (x,) = _one(ins, 1)
    # The declared output shape is the reshape's; the attribute, where given, must agree
    # with it (it may hold a -1, and writes a scalar [1] as [])
    shape = attrs.get("shape")
    if shape is not None:
        known = [d for d in shape if d != -1]
        size = imp.types[x].size
        fits = shape.count(-1) <= 1 and all(d >= 1 for d in known) and size % max(
            1, math.prod(known)) == 0
        resolved = [size // math.prod(known) if d == -1 else d for d in shape] if fits else None
        if resolved is None or not same_type(TensorType(tuple(resolved), declared.dtype),
                                             declared):
            raise AkgError(f"{shape} contradicts the declared output {declared}",
                           "attr.shape")
    imp.emit("reshape", x, out=imp.out, shape=list(declared.shape))


def _transpose(imp, ins, attrs, declared):
    if "perm" not in attrs:
        raise AkgError("missing required attribute", "attr.perm")
    imp.emit("transpose", *_one(ins, 1), out=imp.out, perm=attrs["perm"])


def _reduce(op: str) -> Handler:
    def emit(imp, ins, attrs, declared):
        (x,) = _one(ins, 1)
        axes = attrs.get("axis", [])
        keep = attrs.get("keep_dims", False)
        if x in imp.nz:
            _reduce_nz(imp, op, x, axes, keep, declared)
            return
        # MindSpore: an empty axis list reduces every axis (polyc: no 'axes')
        kw = {"axes": axes} if axes else {}
        if imp.types[x].ndim == 1 and declared.shape == (1,):
            keep = True  # MindSpore's scalar [1] is the kept axis: no reshape from []
        imp.emit(op, x, out=imp.out, keepdims=keep, **kw)
    return Handler(emit, {"axis": _int_or_ints, "keep_dims": _bool}, nz=True)


def _reduce_nz(imp: Importer, op: str, x: str, axes: list[int], keep: bool,
               declared: TensorType) -> None:
    """A reduction of an NZ tensor, whose axes count on the NZ shape, as one of its ND
    matrix. Once a matrix dim is reduced the result is no longer blocked: its NZ-shaped
    result ([..., 1, M1, M0, 1] for N, kept) has the row-major order of the ND one
    ([..., M, 1]), so MindSpore declares it DefaultFormat and a reshape gives it."""
    nz = akg_layout.nz_shape(imp.types[x].shape)
    nd_axes, problem = akg_layout.nd_axes(axes, len(nz))
    if problem:
        raise AkgError(problem, "attr.axis")
    matrix_reduced = any(a >= len(nz) - 4 for a in nd_axes)
    if imp.declared_nz == matrix_reduced:
        raise AkgError(f"the result is {'not ' * matrix_reduced}{NZ} after reducing axes "
                       f"{axes}, but is declared {'' if imp.declared_nz else 'not '}{NZ}",
                       "output_desc")
    if not matrix_reduced:
        imp.emit(op, x, out=imp.out, keepdims=keep, axes=nd_axes)
        return
    norm = {a % len(nz) for a in axes} if axes else set(range(len(nz)))
    shape = [1 if a in norm else d for a, d in enumerate(nz) if keep or a not in norm]
    if tuple(shape or [1]) != declared.shape:
        raise AkgError(f"declared {declared}, but reducing axes {axes} of {NZ} "
                       f"{imp.akg_type(x)} gives shape {shape}", "output_desc")
    y = imp.emit(op, x, keepdims=keep, axes=nd_axes)
    imp.emit("reshape", y, out=imp.out, shape=list(declared.shape))


def _select(imp, ins, attrs, declared):
    imp.emit("select", *_one(ins, 3), out=imp.out)


def _widened(imp: Importer, xs: list[str], dtype: str) -> list[str]:
    return [x if imp.types[x].dtype == dtype else imp.emit("cast", x, to=dtype) for x in xs]


def _matmul(imp, ins, attrs, declared):
    ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)
    for old, new, value in (("transpose_x1", "transpose_a", ta),
                            ("transpose_x2", "transpose_b", tb)):
        if old in attrs and attrs[old] != value:
            raise AkgError(f"contradicts {new}", f"attr.{old}")
    a, b, *bias = _one(ins)
    if len(bias) > 1:
        raise AkgError(f"expects 2 inputs and an optional bias, got {2 + len(bias)}",
                       "input_desc")
    for key, x in (("left_format", a), ("right_format", b)):
        if key in attrs and (attrs[key] == NZ) != (x in imp.nz):
            raise AkgError(f"{attrs[key]!r} contradicts the operand's layout", f"attr.{key}")
    dtype = attrs.get("dst_type", imp.types[a].dtype)
    if attrs.get("cast_type", dtype) != dtype:
        raise AkgError(f"{attrs['cast_type']!r} differs from dst_type {dtype!r}",
                       "attr.cast_type")
    if not bias:
        a, b = _widened(imp, [a, b], dtype)
        imp.emit("matmul", a, b, out=imp.out, transpose_a=ta, transpose_b=tb)
        return
    # The cube adds the bias to its float32 accumulator: one rounding to dst_type
    acc = "float64" if dtype == "float64" else "float32"
    a, b, c = _widened(imp, [a, b, bias[0]], acc)
    y = imp.emit("add", imp.emit("matmul", a, b, transpose_a=ta, transpose_b=tb), c,
                 out=imp.out if dtype == acc else None)
    if dtype != acc:
        imp.emit("cast", y, out=imp.out, to=dtype)


def _conv2d(imp, ins, attrs, declared):
    x, w = _one(ins, 2)
    if attrs.get("groups", 1) != 1 or attrs.get("group", 1) != 1:
        raise AkgError("only groups 1 (a dense convolution) is supported", "attr.groups")
    if attrs.get("mode", 1) != 1:
        raise AkgError(f"mode {attrs['mode']} is not a plain convolution", "attr.mode")
    for key, n in (("stride", 4), ("dilation", 4), ("pad_list", 4)):
        if key in attrs and len(attrs[key]) != n:
            raise AkgError(f"expected {n} integers, got {attrs[key]}", f"attr.{key}")
    sh, sw = attrs.get("stride", [1, 1, 1, 1])[2:]
    dh, dw = attrs.get("dilation", [1, 1, 1, 1])[2:]
    top, bottom, left, right = attrs.get("pad_list", [0, 0, 0, 0])
    nhwc = imp.formats[x] == "NHWC"
    dtype = attrs.get("dst_type", imp.types[x].dtype)
    x, w = _widened(imp, [x, w], dtype)
    if nhwc:
        x = imp.emit("transpose", x, perm=[0, 3, 1, 2])
        w = imp.emit("transpose", w, perm=[0, 3, 1, 2])
    wt = imp.types[w]
    if "kernel_size" in attrs and list(attrs["kernel_size"]) != list(wt.shape[2:]):
        raise AkgError(f"{attrs['kernel_size']} contradicts the weight {wt}", "attr.kernel_size")
    if "out_channel" in attrs and attrs["out_channel"] != wt.shape[0]:
        raise AkgError(f"{attrs['out_channel']} contradicts the weight {wt}", "attr.out_channel")
    y = imp.emit("conv2d", x, w, out=None if nhwc else imp.out, strides=[sh, sw],
                 pads=[top, left, bottom, right], dilations=[dh, dw])
    if nhwc:
        imp.emit("transpose", y, out=imp.out, perm=[0, 2, 3, 1])


def _pad(imp, ins, attrs, declared):
    (x,) = _one(ins, 1)
    head, tail = attrs.get("head"), attrs.get("tail")
    if head is None or tail is None:
        raise AkgError("missing required attribute", "attr.head" if head is None else "attr.tail")
    if len(head) != len(tail):
        raise AkgError(f"head {head} and tail {tail} differ in length", "attr.tail")
    imp.emit("pad", x, out=imp.out, pads=[[h, t] for h, t in zip(head, tail)],
             value=attrs.get("pad_val", 0))


def _unpad(imp, ins, attrs, declared):
    (x,) = _one(ins, 1)
    shape, tail = imp.types[x].shape, attrs.get("tail")
    if tail is None:
        raise AkgError("missing required attribute", "attr.tail")
    if len(tail) != len(shape) or any(t < 0 or t >= d for t, d in zip(tail, shape)):
        raise AkgError(f"{tail} does not fit {imp.types[x]}", "attr.tail")
    imp.emit("slice", x, out=imp.out, starts=[0] * len(shape),
             ends=[d - t for d, t in zip(shape, tail)])


def _one_hot(imp, ins, attrs, declared):
    if "depth" not in attrs:
        raise AkgError("missing required attribute", "attr.depth")
    imp.emit("one_hot", *_one(ins, 3), out=imp.out, depth=attrs["depth"],
             axis=attrs.get("axis", -1))


def _counted(imp: Importer, xs: list[str], attrs: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value not in (len(xs), [len(xs)]):
            raise AkgError(f"{value} contradicts the {len(xs)} inputs", f"attr.{key}")


def _concat(imp, ins, attrs, declared):
    xs = _one(ins)
    _counted(imp, xs, attrs, ("N", "inputNums", "dyn_input_sizes"))
    if "axis" not in attrs:
        raise AkgError("missing required attribute", "attr.axis")
    imp.emit("concat", *xs, out=imp.out, axis=attrs["axis"])


def _add_n(imp, ins, attrs, declared):
    xs = _one(ins)
    _counted(imp, xs, attrs, ("n", "dyn_input_sizes"))
    if len(xs) == 1:
        imp.identity(xs[0], imp.out)
        return
    total = xs[0]
    for k, x in enumerate(xs[1:], 2):
        total = imp.emit("add", total, x, out=imp.out if k == len(xs) else None)


def _elem_any(imp, ins, attrs, declared):
    (x,) = _one(ins, 1)
    if imp.types[x].dtype != "bool":
        x = imp.emit("cast", x, to="bool")
    as_number = imp.emit("cast", x, to=attrs.get("dst_type", declared.dtype))
    imp.emit("reshape", imp.emit("reduce_max", as_number), out=imp.out, shape=[1])


def _assign(imp, ins, attrs, declared):
    target, value = _one(ins, 2)
    _store(imp, target, value)
    imp.identity(value, imp.out)


def _inplace_assign(imp, ins, attrs, declared):
    target, value, result = _one(ins, 3)
    _store(imp, target, value)
    imp.identity(result, imp.out)


def _store(imp: Importer, target: str, value: str) -> None:
    if target not in {t["name"] for t in imp.inputs}:
        raise AkgError(f"stores into {target!r}, which is not a kernel input", "input_desc")
    if imp.types[target] != imp.types[value]:
        raise AkgError(f"stores {imp.types[value]} into {target!r}: {imp.types[target]}",
                       "input_desc")
    if target in imp.assigned:
        raise AkgError(f"stores into {target!r} a second time", "input_desc")
    imp.assigned[target] = value


def _refused(reason: str) -> Handler:
    def emit(imp, ins, attrs, declared):
        raise AssertionError("a refused op is never emitted")
    return Handler(emit, refusal=reason)


_BINARY = {"Add": "add", "TensorAdd": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "div",
           "Div": "div", "Maximum": "maximum", "Minimum": "minimum", "Pow": "pow"}
_UNARY = {"Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Rsqrt": "rsqrt",
          "Tanh": "tanh", "Abs": "abs", "Reciprocal": "reciprocal"}
_COMPARE = {"Greater": "greater", "Less": "less", "Equal": "equal",
            "GreaterEqual": "greater_equal", "LessEqual": "less_equal",
            "NotEqual": "not_equal"}
# Mul sometimes carries its operands' shapes and layouts, repeating its tensors
_MUL_ECHO = {"x_shape": _shapes, "y_shape": _shapes, "data_format": _formats}


def _mul(imp, ins, attrs, declared):
    """Mul's `data_format` echoes its operands' layouts. NC1HWC0, which the tensors do
    not carry themselves, leaves their shapes physical ([N, C/16, H, W, 16]): multiplying
    them elementwise is still right when they broadcast only over N, H and W (C1 and C0
    equal), or one is a single value."""
    x, y = _one(ins, 2)
    blocked = [f for f in attrs.get("data_format", []) if f != NZ and not plain_format(f)]
    shapes = [imp.types[t].shape for t in (x, y) if imp.types[t].size != 1]
    if blocked and shapes and (set(blocked) != {"NC1HWC0"} or any(
            len(s) != 5 or (s[1], s[4]) != (shapes[0][1], shapes[0][4]) for s in shapes)):
        raise AkgError(f"layout {blocked[0]!r} with operands {imp.types[x]} and "
                       f"{imp.types[y]} is not supported (NC1HWC0 broadcasting over N, H "
                       "and W only, or a single value)", "attr.data_format")
    imp.emit("mul", x, y, out=imp.out)

HANDLERS: dict[str, Handler] = {
    **{name: _elementwise(op, 2) for name, op in _BINARY.items()},
    **{name: _elementwise(op, 1) for name, op in _UNARY.items()},
    **{name: _compare(op) for name, op in _COMPARE.items()},
    "Mul": Handler(_mul, _MUL_ECHO, nz=True),
    "LogicalOr": _logical("maximum"),
    "LogicalAnd": _logical("minimum"),
    "LogicalNot": Handler(_logical_not, nz=True),
    "IsInf": Handler(_is_inf, nz=True),
    "IsNan": Handler(_is_nan, nz=True),
    "Cast": Handler(_cast, {"dst_type": _dtype, "DstT": _dtype, "SrcT": _str}, nz=True),
    "BroadcastTo": Handler(_broadcast_to, {"shape": _ints}),
    "Reshape": Handler(_reshape, {"shape": _ints}),
    "Transpose": Handler(_transpose, {"perm": _ints}),
    "ReduceSum": _reduce("reduce_sum"),
    "ReduceMax": _reduce("reduce_max"),
    "ReduceMin": _reduce("reduce_min"),
    "Select": Handler(_select, nz=True),
    "MatMul": Handler(_matmul, {
        "transpose_a": _bool, "transpose_b": _bool, "transpose_x1": _bool,
        "transpose_x2": _bool, "dst_type": _dtype, "cast_type": _dtype,
        "left_format": _format, "right_format": _format}, nz=True),
    "Conv2D": Handler(_conv2d, {
        "stride": _ints, "dilation": _ints, "pad_list": _ints, "pad": _ints,
        "pad_mode": _str, "groups": _int, "group": _int, "mode": _int, "format": _str,
        "kernel_size": _ints, "out_channel": _int, "dst_type": _dtype}),
    "PadAkg": Handler(_pad, {"head": _ints, "tail": _ints, "pad_val": _int}),
    "UnPadAkg": Handler(_unpad, {"tail": _ints}),
    "OneHot": Handler(_one_hot, {"depth": _int, "axis": _int}),
    "Concat": Handler(_concat, {"axis": _int, "N": _int, "inputNums": _int,
                                "dyn_input_sizes": _ints}),
    "AddN": Handler(_add_n, {"n": _int, "dyn_input_sizes": _ints}, nz=True),
    "ElemAny": Handler(_elem_any, {"dst_type": _dtype}),
    "Assign": Handler(_assign),
    "InplaceAssign": Handler(_inplace_assign, {"fake_output": _bool}),
    "Custom": _refused("it runs user-written code (func_source_str) polyc cannot analyse"),
    "CReal": _refused("complex numbers are not a polyc dtype"),
    "CImag": _refused("complex numbers are not a polyc dtype"),
    "Complex": _refused("complex numbers are not a polyc dtype"),
    "Gather": _refused("its index is read from a tensor, which is not an affine access"),
}
