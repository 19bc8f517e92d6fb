"""The ATen ops polyc computes, each a handler writing it with polyc's ops (registered
with `torch_convert.handles`, with the conditions under which polyc takes it)."""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx

from ..errors import GraphError
from .torch_convert import DTYPES, FLOATS, Converter, dtype_of, handles, safe_name

aten = torch.ops.aten


# ----- elementwise -----

def _out_dtype(cv: Converter, node: fx.Node) -> str:
    return dtype_of(cv.out(node))


def _binary(op: str, alpha: bool = False, reverse: bool = False):
    def convert(cv: Converter, a: dict, node: fx.Node) -> str:
        dt = _out_dtype(cv, node)
        x, y = cv.operand(a["self"], dt), cv.operand(a["other"], dt)
        if alpha and a.get("alpha", 1) != 1:
            y = cv.b.mul(y, cv.tensor(a["alpha"], dt))
        if reverse:
            x, y = y, x
        return cv.b.op(op, x, y, out=safe_name(node.name))
    return convert


def _no_rounding(a: dict, node: fx.Node) -> bool:
    return a.get("rounding_mode") is None


def _float_result(a: dict, node: fx.Node) -> bool:
    return DTYPES[node.meta["val"].dtype] in FLOATS


for _op, _name, _alpha in (("add", "add", True), ("sub", "sub", True), ("mul", "mul", False)):
    handles(getattr(aten, _op).Tensor, getattr(aten, _op).Scalar)(_binary(_name, _alpha))
handles(aten.div.Tensor, aten.div.Scalar, check=_float_result)(_binary("div"))
handles(aten.rsub.Scalar, aten.rsub.Tensor)(_binary("sub", alpha=True, reverse=True))
handles(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, check=_float_result)(
    lambda cv, a, n: _binary("pow")(cv, {"self": a["self"], "other": a["exponent"]}, n))


@handles(aten.maximum.default, aten.minimum.default)
def _min_max(cv: Converter, a: dict, node: fx.Node) -> str:
    op = "maximum" if node.target is aten.maximum.default else "minimum"
    return _binary(op)(cv, a, node)


_COMPARE = {aten.gt: "greater", aten.lt: "less", aten.eq: "equal", aten.ge: "greater_equal",
            aten.le: "less_equal", aten.ne: "not_equal"}


def _compare(op: str):
    def convert(cv: Converter, a: dict, node: fx.Node) -> str:
        # polyc's compare ops answer 0/1 in their operands' dtype (DESIGN.md)
        dt = DTYPES[torch.result_type(*[cv.values[v] if isinstance(v, fx.Node) else v
                                        for v in (a["self"], a["other"])])]
        r = cv.b.op(op, cv.operand(a["self"], dt), cv.operand(a["other"], dt))
        return cv.b.cast(r, to="bool", out=safe_name(node.name))
    return convert


for _packet, _name in _COMPARE.items():
    handles(_packet.Tensor, _packet.Scalar)(_compare(_name))

_UNARY = {aten.neg: "neg", aten.abs: "abs", aten.exp: "exp", aten.log: "log", aten.sqrt: "sqrt",
          aten.rsqrt: "rsqrt", aten.tanh: "tanh", aten.erf: "erf", aten.sigmoid: "sigmoid",
          aten.relu: "relu", aten.reciprocal: "reciprocal", aten.floor: "floor",
          aten.ceil: "ceil", aten.silu: "silu"}
_INT_OK = ("neg", "abs", "relu")


def _unary(op: str):
    def convert(cv: Converter, a: dict, node: fx.Node) -> str:
        return cv.b.op(op, cv.tensor(a["self"], ""), out=safe_name(node.name))
    return convert


for _packet, _name in _UNARY.items():
    handles(_packet.default, check=None if _name in _INT_OK else _float_result)(_unary(_name))


@handles(aten.gelu.default, check=_float_result)
def _gelu(cv: Converter, a: dict, node: fx.Node) -> str:
    return cv.b.gelu(cv.tensor(a["self"], ""), approximate=a["approximate"], out=safe_name(node.name))


@handles(aten.where.self)
def _where(cv: Converter, a: dict, node: fx.Node) -> str:
    dt = _out_dtype(cv, node)
    return cv.b.select(cv.tensor(a["condition"], "bool"), cv.operand(a["self"], dt),
                       cv.operand(a["other"], dt), out=safe_name(node.name))


@handles(aten.clamp.default, check=_float_result)
def _clamp(cv: Converter, a: dict, node: fx.Node) -> str:
    dt, y = _out_dtype(cv, node), cv.tensor(a["self"], "")
    if a["min"] is not None:
        y = cv.b.maximum(y, cv.tensor(a["min"], dt))
    if a["max"] is not None:
        y = cv.b.minimum(y, cv.tensor(a["max"], dt))
    return y


def _plain_copy(a: dict, node: fx.Node) -> bool:
    return a.get("layout") in (None, torch.strided) and a.get("device") in (None, torch.device("cpu"))


@handles(aten._to_copy.default, check=_plain_copy)
def _to_copy(cv: Converter, a: dict, node: fx.Node) -> str:
    src = a["self"]
    return cv.cast(cv.tensor(src, ""), dtype_of(cv.values[src]), _out_dtype(cv, node))


# ----- reductions and composites -----

def _dims(dim: Any, ndim: int) -> list[int] | None:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return [d % ndim for d in (dim if isinstance(dim, (list, tuple)) else [dim])]


def _no_dtype(a: dict, node: fx.Node) -> bool:
    return a.get("dtype") is None and _float_result(a, node)


def _reduce(op: str):
    def convert(cv: Converter, a: dict, node: fx.Node) -> str:
        x = a["self"]
        axes = _dims(a.get("dim"), cv.values[x].dim())
        attrs = {"keepdims": bool(a.get("keepdim", False))} | ({"axes": axes} if axes is not None else {})
        return cv.b.op(op, cv.tensor(x, ""), out=safe_name(node.name), **attrs)
    return convert


handles(aten.sum.dim_IntList, aten.sum.default, check=_no_dtype)(_reduce("reduce_sum"))
handles(aten.mean.dim, aten.mean.default, check=_no_dtype)(_reduce("reduce_mean"))
handles(aten.amax.default, check=_float_result)(_reduce("reduce_max"))
handles(aten.amin.default, check=_float_result)(_reduce("reduce_min"))


def _softmax(op: str):
    def convert(cv: Converter, a: dict, node: fx.Node) -> str:
        return cv.b.op(op, cv.tensor(a["self"], ""), axis=a["dim"], out=safe_name(node.name))
    return convert


def _same_dtype_softmax(a: dict, node: fx.Node) -> bool:
    return not a["half_to_float"] and _float_result(a, node)


handles(aten._softmax.default, check=_same_dtype_softmax)(_softmax("softmax"))
handles(aten._log_softmax.default, check=_same_dtype_softmax)(_softmax("log_softmax"))


def _only_first_result(a: dict, node: fx.Node) -> bool:
    """A multi-result op whose other results (statistics kept for the backward) nobody
    reads: polyc computes the first."""
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _layer_norm_ok(a: dict, node: fx.Node) -> bool:
    return _only_first_result(a, node) and DTYPES[node.meta["val"][0].dtype] in FLOATS


@handles(aten.native_layer_norm.default, check=_layer_norm_ok)
def _layer_norm(cv: Converter, a: dict, node: fx.Node) -> tuple[str]:
    x = a["input"]
    axis = cv.values[x].dim() - len(a["normalized_shape"])
    eps = float(a["eps"])
    if a["weight"] is None and a["bias"] is not None:  # polyc's beta comes after gamma
        y = cv.b.layer_norm(cv.tensor(x, ""), axis=axis, epsilon=eps)
        return (cv.b.add(y, cv.tensor(a["bias"], ""), out=safe_name(node.name)),)
    ins = [cv.tensor(a[k], "") for k in ("input", "weight", "bias") if a[k] is not None]
    y = cv.b.layer_norm(*ins, axis=axis, epsilon=eps, out=safe_name(node.name))
    return (y,)


def _attention_ok(a: dict, node: fx.Node) -> bool:
    q, mask = a["query"].meta["val"], a["attn_mask"]
    # a boolean mask would need -inf, which polyc's constants cannot hold (JSON has none)
    return (_only_first_result(a, node) and a["dropout_p"] == 0 and DTYPES[q.dtype] in FLOATS
            and (mask is None or mask.meta["val"].dtype == q.dtype))


@handles(aten._scaled_dot_product_flash_attention_for_cpu.default, check=_attention_ok)
def _attention(cv: Converter, a: dict, node: fx.Node) -> tuple[str]:
    q, k, v = (cv.tensor(a[key], "") for key in ("query", "key", "value"))
    if a["attn_mask"] is None:
        attrs = {"causal": bool(a["is_causal"])}
        if a["scale"] is not None:
            attrs["scale"] = float(a["scale"])
        return (cv.b.attention(q, k, v, out=safe_name(node.name), **attrs),)
    # an additive mask: polyc's attention has none, so its composition written out
    # (PyTorch refuses a mask together with is_causal)
    dt = dtype_of(cv.out(node)[0])
    depth = cv.values[a["query"]].shape[-1]
    scale = a["scale"] if a["scale"] is not None else depth ** -0.5
    scores = cv.b.mul(cv.b.matmul(q, k, transpose_b=True), cv.tensor(scale, dt))
    probs = cv.b.softmax(cv.b.add(scores, cv.tensor(a["attn_mask"], "")), axis=-1)
    return (cv.b.matmul(probs, v, out=safe_name(node.name)),)


def _finite_fill(a: dict, node: fx.Node) -> bool:
    return _float_result(a, node) and math.isfinite(a["value"])


@handles(aten.masked_fill.Scalar, check=_finite_fill)
def _masked_fill(cv: Converter, a: dict, node: fx.Node) -> str:
    dt = _out_dtype(cv, node)
    return cv.b.select(cv.tensor(a["mask"], ""), cv.tensor(a["value"], dt),
                       cv.tensor(a["self"], ""), out=safe_name(node.name))


# ----- contractions -----

def _operand(cv: Converter, arg: fx.Node) -> tuple[str, bool]:
    """A matmul operand, and whether it is the transpose of the last two dims of a
    tensor: the matmul then reads that tensor transposed (`transpose_a/b`) instead of
    a transposed copy (a Linear's weight arrives as `aten.t(weight)`)."""
    src = None
    if arg.op == "call_function" and arg.target is aten.t.default:
        src = arg.args[0]
    elif arg.op == "call_function" and arg.target is aten.transpose.int:
        nd = cv.values[arg].dim()
        if sorted(d % nd for d in arg.args[1:3]) == [nd - 2, nd - 1]:
            src = arg.args[0]
    if src is not None and src in cv.names and cv.values[src].dim() >= 2:
        return cv.names[src], True
    return cv.tensor(arg, ""), False


def _matmul(cv: Converter, x: fx.Node, w: fx.Node, out: str | None) -> str:
    (a, ta), (b, tb) = _operand(cv, x), _operand(cv, w)
    return cv.b.matmul(a, b, transpose_a=ta, transpose_b=tb, out=out)


def _float_matmul(a: dict, node: fx.Node) -> bool:
    return _float_result(a, node)


@handles(aten.mm.default, aten.bmm.default, check=_float_matmul)
def _mm(cv: Converter, a: dict, node: fx.Node) -> str:
    return _matmul(cv, a["self"], a["mat2"], safe_name(node.name))


@handles(aten.addmm.default, check=_float_matmul)
def _addmm(cv: Converter, a: dict, node: fx.Node) -> str:
    dt = _out_dtype(cv, node)
    y = _matmul(cv, a["mat1"], a["mat2"], None)
    if a["alpha"] != 1:
        y = cv.b.mul(y, cv.tensor(a["alpha"], dt))
    bias = cv.tensor(a["self"], dt)
    if a["beta"] != 1:
        bias = cv.b.mul(bias, cv.tensor(a["beta"], dt))
    return cv.b.add(y, bias, out=safe_name(node.name))


# ----- data movement: shapes read from the results -----

def _reshape(cv: Converter, a: dict, node: fx.Node) -> str:
    return cv.b.reshape(cv.tensor(a["self"], ""), shape=cv.target_shape(node, free=True),
                        out=safe_name(node.name))


handles(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
        aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
        aten.flatten.using_ints, view=True)(_reshape)


@handles(aten.clone.default, aten.alias.default, view=True)
def _identity(cv: Converter, a: dict, node: fx.Node) -> str:
    return cv.tensor(a["self"], "")


@handles(aten.expand.default, view=True)
def _expand(cv: Converter, a: dict, node: fx.Node) -> str:
    return cv.b.broadcast_to(cv.tensor(a["self"], ""), shape=cv.target_shape(node),
                             out=safe_name(node.name))


def _perm(cv: Converter, name: str, perm: list[int], node: fx.Node) -> str:
    if perm == sorted(perm):
        return name
    return cv.b.transpose(name, perm=perm, out=safe_name(node.name))


@handles(aten.t.default, view=True)
def _t(cv: Converter, a: dict, node: fx.Node) -> str:
    nd = cv.values[a["self"]].dim()
    return _perm(cv, cv.tensor(a["self"], ""), [1, 0] if nd == 2 else list(range(nd)), node)


@handles(aten.transpose.int, view=True)
def _transpose(cv: Converter, a: dict, node: fx.Node) -> str:
    nd = cv.values[a["self"]].dim()
    perm = list(range(nd))
    i, j = a["dim0"] % nd, a["dim1"] % nd
    perm[i], perm[j] = perm[j], perm[i]
    return _perm(cv, cv.tensor(a["self"], ""), perm, node)


@handles(aten.permute.default, view=True)
def _permute(cv: Converter, a: dict, node: fx.Node) -> str:
    nd = cv.values[a["self"]].dim()
    return _perm(cv, cv.tensor(a["self"], ""), [d % nd for d in a["dims"]], node)


def _slice_ok(a: dict, node: fx.Node) -> bool:
    return all(d > 0 for d in node.meta["val"].shape) and (a.get("step") or 1) > 0


def _slice_axis(cv: Converter, x: fx.Node, dim: int, start: int, end: int, step: int = 1,
                out: str | None = None) -> str:
    size = cv.values[x].shape[dim]
    if not isinstance(size, int):  # polyc's symbolic slice clamps where the range decides
        if not (isinstance(start, int) and isinstance(end, int)):
            raise GraphError(f"node {out or x.name!r}: a slice along dim {dim} (size {size}) "
                             f"from {start} to {end}, which depend on a dynamic size")
    else:
        start, end = max(min(start, size), -size), max(min(end, size), -size)
    return cv.b.slice(cv.tensor(x, ""), starts=[start], ends=[end], axes=[dim], steps=[step],
                      out=out)


@handles(aten.slice.Tensor, check=_slice_ok, view=True)
def _slice(cv: Converter, a: dict, node: fx.Node) -> str:
    x = a["self"]
    dim = a["dim"] % cv.values[x].dim()
    start = 0 if a["start"] is None else a["start"]
    end = cv.values[x].shape[dim] if a["end"] is None else a["end"]
    return _slice_axis(cv, x, dim, start, end, a["step"], safe_name(node.name))


def _split_ok(a: dict, node: fx.Node) -> bool:
    return all(d > 0 for t in node.meta["val"] for d in t.shape)


@handles(aten.split.Tensor, aten.split_with_sizes.default, check=_split_ok, view=True)
def _split(cv: Converter, a: dict, node: fx.Node) -> tuple[str, ...]:
    x = a["self"]
    dim = a["dim"] % cv.values[x].dim()
    parts, start = [], 0
    for k, piece in enumerate(cv.out(node)):
        n = piece.shape[dim]
        parts.append(_slice_axis(cv, x, dim, start, start + n, out=f"{safe_name(node.name)}#{k}"))
        start += n
    return tuple(parts)


def _cat_ok(a: dict, node: fx.Node) -> bool:
    vals = [t.meta["val"] for t in a["tensors"]]
    return len({v.dtype for v in vals}) == 1 and all(v.numel() > 0 for v in vals)


@handles(aten.cat.default, check=_cat_ok)
def _cat(cv: Converter, a: dict, node: fx.Node) -> str:
    nd = cv.out(node).dim()
    return cv.b.concat(*[cv.tensor(t, "") for t in a["tensors"]], axis=a["dim"] % nd,
                       out=safe_name(node.name))


# ----- convolutional networks -----

def _conv_ok(a: dict, node: fx.Node) -> bool:
    return (a["input"].meta["val"].dim() == 4 and not a["transposed"] and a["groups"] == 1
            and not any(a["output_padding"]) and _float_result(a, node))


@handles(aten.convolution.default, check=_conv_ok)
def _convolution(cv: Converter, a: dict, node: fx.Node) -> str:
    ins = [cv.tensor(a[k], "") for k in ("input", "weight", "bias") if a[k] is not None]
    ph, pw = a["padding"]
    return cv.b.conv2d(*ins, strides=list(a["stride"]), pads=[ph, pw, ph, pw],
                       dilations=list(a["dilation"]), out=safe_name(node.name))


def _batch_norm_ok(a: dict, node: fx.Node) -> bool:
    return (_only_first_result(a, node) and a["weight"] is not None and a["bias"] is not None
            and DTYPES[node.meta["val"][0].dtype] in FLOATS)


@handles(aten._native_batch_norm_legit_no_training.default, check=_batch_norm_ok)
def _batch_norm(cv: Converter, a: dict, node: fx.Node) -> tuple[str]:
    ins = [cv.tensor(a[k], "") for k in ("input", "weight", "bias", "running_mean", "running_var")]
    return (cv.b.batch_norm(*ins, epsilon=float(a["eps"]), out=safe_name(node.name)),)


@handles(aten.leaky_relu.default, check=_float_result)
def _leaky_relu(cv: Converter, a: dict, node: fx.Node) -> str:
    dt, x = _out_dtype(cv, node), cv.tensor(a["self"], "")
    positive = cv.b.greater(x, cv.tensor(0, dt))
    return cv.b.select(positive, x, cv.b.mul(x, cv.tensor(a["negative_slope"], dt)),
                       out=safe_name(node.name))


@handles(aten.hardtanh.default, check=_float_result)
def _hardtanh(cv: Converter, a: dict, node: fx.Node) -> str:
    return _clamp(cv, {"self": a["self"], "min": a["min_val"], "max": a["max_val"]}, node)
