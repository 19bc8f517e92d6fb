"""ATen ops -> polyc's subgraph format, for the torch.compile backend (`torch_backend.py`).

`torch.compile` hands the backend an FX graph that AOTAutograd has lowered to ATen ops
(`aten.addmm`, `aten.native_layer_norm`, `aten.view` ...). `supported(node)` answers for
one node, from the shapes and dtypes Dynamo traced (`node.meta["val"]`), whether polyc can
compute it; `to_graph(module, values)` writes a partition (an `fx.GraphModule` of
supported nodes) as a polyc `Graph`, given the concrete value of every node of one call,
so every shape is an integer and a view's target shape is read from its result, never
from its (possibly symbolic) arguments.

View ops (`view`, `transpose`, `expand` ...) are copies in polyc, so a partition made
only of them is left to PyTorch, which makes them for free.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx as fx

from ..errors import GraphError
from ..graph.builder import GraphBuilder
from ..graph.ir import Graph

aten = torch.ops.aten

DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
          torch.int32: "int32", torch.bool: "bool"}
FLOATS = ("float32", "float64", "float16")

Handler = Callable[["Converter", dict[str, Any], fx.Node], str]
HANDLERS: dict[Any, Handler] = {}
CHECKS: dict[Any, Callable[[dict[str, Any], fx.Node], bool]] = {}  # extra conditions
VIEWS: set[Any] = set()  # ops PyTorch does without computing anything


def handles(*ops, check=None, view=False):
    def register(fn: Handler) -> Handler:
        for op in ops:
            HANDLERS[op] = fn
            if check is not None:
                CHECKS[op] = check
            if view:
                VIEWS.add(op)
        return fn
    return register


def bind(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by their schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(node.target._schema.arguments):
        if not a.kwarg_only and i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def _tensors(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [value] if isinstance(value, torch.Tensor) else []


def supported(node: fx.Node) -> bool:
    """Whether polyc can compute `node`: a known op whose tensors (inputs and results)
    are all on the CPU in a dtype polyc has, and whose arguments it can express."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, fx.Node) and supported(source)
    if node.target not in HANDLERS:
        return False
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    if any(v is None for v in values):
        return False
    for t in _tensors(values):
        if t.device.type != "cpu" or t.dtype not in DTYPES or t.layout != torch.strided:
            return False
    if node.target in VIEWS and not all(supported(u) for u in _consumers(node)):
        # a view that leaves the partition is free in PyTorch, and keeps the strides
        # the ops after it were traced with
        return False
    check = CHECKS.get(node.target)
    return check is None or check(bind(node), node)


def _consumers(node: fx.Node) -> list[fx.Node]:
    """The nodes reading `node`'s result(s), through the `getitem`s of a tuple."""
    out = []
    for u in node.users:
        out.extend(_consumers(u) if u.target is operator.getitem else [u])
    return out


def is_view(node: fx.Node) -> bool:
    return node.target is operator.getitem or node.target in VIEWS


class Converter:
    """Writes one partition into a `GraphBuilder`: `names` maps each FX node to its polyc
    tensor (a tuple of them for an op with several results)."""

    def __init__(self, module: fx.GraphModule, values: dict[fx.Node, Any]):
        self.b = GraphBuilder(safe_name(module.__class__.__name__))
        self.values = values
        self.names: dict[fx.Node, Any] = {}
        self.laid_out: set[str] = set()  # outputs computed transposed
        self._count = 0

    def tensor(self, arg: Any, dtype: str) -> str:
        """The polyc tensor of an argument: a node's, or a scalar as a constant."""
        if isinstance(arg, fx.Node) and arg in self.names:
            return self.names[arg]
        value = self.values[arg] if isinstance(arg, fx.Node) else arg
        if isinstance(value, torch.Tensor):
            raise GraphError(f"tensor {arg} is not an input of the partition")
        self._count += 1
        return self.b.constant(f"const__{self._count}", [], [value], dtype)

    def cast(self, name: str, have: str, want: str) -> str:
        return name if have == want else self.b.cast(name, to=want)

    def operand(self, arg: Any, dtype: str) -> str:
        """An argument in `dtype` (PyTorch's type promotion made explicit)."""
        if isinstance(arg, fx.Node) and isinstance(self.values[arg], torch.Tensor):
            return self.cast(self.tensor(arg, dtype), dtype_of(self.values[arg]), dtype)
        return self.tensor(arg, dtype)

    def out(self, node: fx.Node) -> torch.Tensor:
        return self.values[node]


def dtype_of(t: torch.Tensor) -> str:
    if t.dtype not in DTYPES:
        raise GraphError(f"dtype {t.dtype} has no polyc equivalent")
    return DTYPES[t.dtype]


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "graph"


def dense_order(t: torch.Tensor) -> list[int]:
    """The dims of `t` from the outermost in memory to the innermost, when its elements
    are a dense block in some order of its dims (a transposed result); else row-major."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    expected = 1
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride(d) != expected:
            return list(range(t.dim()))
        expected *= t.shape[d]
    return order


def to_graph(module: fx.GraphModule, values: dict[fx.Node, Any]
             ) -> tuple[Graph, list[tuple[str, list[int]]]]:
    """The partition as a polyc `Graph`, and for each of its outputs in order, the polyc
    tensor holding it and the permutation that turns that tensor back into the output.
    `values` holds every node's value for one eager call (shapes are concrete); an output
    PyTorch laid out transposed is computed transposed, so that the tensor handed back
    has the strides the ops after it were traced with."""
    cv = Converter(module, values)
    outputs: list[tuple[str, list[int]]] = []
    for node in module.graph.nodes:
        if node.op == "placeholder":
            v = values[node]
            if isinstance(v, torch.Tensor):
                cv.names[node] = cv.b.input(safe_name(node.name), list(v.shape), dtype_of(v))
        elif node.op == "call_function" and node.target is operator.getitem:
            cv.names[node] = cv.names[node.args[0]][node.args[1]]
        elif node.op == "call_function":
            handler = HANDLERS.get(node.target)
            if handler is None:
                raise GraphError(f"node {node.name!r}: op {node.target} is not supported")
            cv.names[node] = handler(cv, bind(node), node)
        elif node.op == "output":
            outputs = [_laid_out(cv, a) for a in node.args[0]]
        else:
            raise GraphError(f"node {node.name!r}: {node.op} is not supported")
    # an output listed twice is computed once; the backend hands out copies
    return cv.b.build(outputs=list(dict.fromkeys(name for name, _ in outputs))), outputs


def _laid_out(cv: Converter, node: fx.Node) -> tuple[str, list[int]]:
    order = dense_order(cv.values[node])
    if order == sorted(order):
        return cv.names[node], order
    name = f"{safe_name(node.name)}__in_memory_order"
    if name not in cv.laid_out:
        cv.laid_out.add(cv.b.transpose(cv.names[node], perm=order, out=name))
    return name, [order.index(d) for d in range(len(order))]


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
    q = a["query"].meta["val"]
    return (_only_first_result(a, node) and a["attn_mask"] is None and a["dropout_p"] == 0
            and DTYPES[q.dtype] in FLOATS)


@handles(aten._scaled_dot_product_flash_attention_for_cpu.default, check=_attention_ok)
def _attention(cv: Converter, a: dict, node: fx.Node) -> tuple[str]:
    attrs = {"causal": bool(a["is_causal"])}
    if a["scale"] is not None:
        attrs["scale"] = float(a["scale"])
    qkv = [cv.tensor(a[k], "") for k in ("query", "key", "value")]
    return (cv.b.attention(*qkv, out=safe_name(node.name), **attrs),)


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
    return cv.b.reshape(cv.tensor(a["self"], ""), shape=list(cv.out(node).shape),
                        out=safe_name(node.name))


handles(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
        aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
        aten.flatten.using_ints, view=True)(_reshape)


@handles(aten.clone.default, aten.alias.default, view=True)
def _identity(cv: Converter, a: dict, node: fx.Node) -> str:
    return cv.tensor(a["self"], "")


@handles(aten.expand.default, view=True)
def _expand(cv: Converter, a: dict, node: fx.Node) -> str:
    return cv.b.broadcast_to(cv.tensor(a["self"], ""), shape=list(cv.out(node).shape),
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
        parts.append(_slice_axis(cv, x, dim, start, start + n, out=f"{safe_name(node.name)}_{k}"))
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
