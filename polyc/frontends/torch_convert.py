"""ATen graphs -> polyc's subgraph format, for the torch.compile backend (`polyc/torch_compile.py`).

`torch.compile` hands the backend an FX graph that AOTAutograd has lowered to ATen ops
(`aten.addmm`, `aten.native_layer_norm`, `aten.view` ...). `supported(node)` answers for
one node, from the shapes and dtypes Dynamo traced (`node.meta["val"]`), whether polyc can
compute it; `to_graph(module, values)` writes a partition (an `fx.GraphModule` of
supported nodes) as a polyc `Graph`, given the concrete value of every node of one call,
so every shape is an integer and a view's target shape is read from its result, never
from its (possibly symbolic) arguments. With `dynamic`, the shapes are those Dynamo
traced instead, and each dynamic dim of an input (a SymInt `s0`) is a polyc symbol: the
graph compiles once for every size. What polyc cannot write with a symbol is then a
GraphError naming the node: a scalar computed from a size, a slice along a dynamic dim,
a view's target with two dynamic dims (one is written -1).

View ops (`view`, `transpose`, `expand` ...) are copies in polyc, so a partition made
only of them is left to PyTorch, which makes them for free. The ops themselves are
registered with `handles` by `torch_ops.py`.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx as fx

from ..errors import GraphError
from ..graph.builder import GraphBuilder
from ..graph.ir import Graph

DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
          torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64",
          torch.bool: "bool"}
FLOATS = ("float32", "float64", "float16", "bfloat16")

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


class _Builder(GraphBuilder):
    """Names the tensors it makes up with a '#', which FX names (identifiers) never
    contain: an FX node `mul_1` and a multiplication the converter adds never clash."""

    def op(self, op: str, *inputs: str, out: str | None = None, **attrs) -> str:
        if out is None:
            out = self.fresh(op)
        return super().op(op, *inputs, out=out, **attrs)

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}#{self._count}"


class Converter:
    """Writes one partition into a `GraphBuilder`: `names` maps each FX node to its polyc
    tensor (a tuple of them for an op with several results)."""

    def __init__(self, module: fx.GraphModule, values: dict[fx.Node, Any],
                 dynamic: bool = False):
        self.b = _Builder(safe_name(module.__class__.__name__))
        # handlers read shapes from `values`: the traced ones (SymInt dims) when dynamic;
        # one call's values tell how results are laid out in memory
        self.concrete = values
        self.values = ({n: n.meta["val"] for n in module.graph.nodes if "val" in n.meta}
                       if dynamic else values)
        self.names: dict[fx.Node, Any] = {}
        self.laid_out: set[str] = set()  # outputs computed transposed

    def tensor(self, arg: Any, dtype: str) -> str:
        """The polyc tensor of an argument: a node's, or a scalar as a constant."""
        if isinstance(arg, fx.Node) and arg in self.names:
            return self.names[arg]
        value = self.values[arg] if isinstance(arg, fx.Node) else arg
        if isinstance(value, torch.Tensor):
            raise GraphError(f"tensor {arg} is not an input of the partition")
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise GraphError(f"node {arg}: the value {value} depends on a dynamic size")
        return self.b.constant(self.b.fresh("const"), [], [value], dtype)

    def cast(self, name: str, have: str, want: str) -> str:
        return name if have == want else self.b.cast(name, to=want)

    def operand(self, arg: Any, dtype: str) -> str:
        """An argument in `dtype` (PyTorch's type promotion made explicit)."""
        if isinstance(arg, fx.Node) and isinstance(self.values[arg], torch.Tensor):
            return self.cast(self.tensor(arg, dtype), dtype_of(self.values[arg]), dtype)
        return self.tensor(arg, dtype)

    def out(self, node: fx.Node) -> torch.Tensor:
        return self.values[node]

    def input_dim(self, d: Any) -> int | str:
        """An input's dim: an int, or a dynamic one's symbol (its range Dynamo's)."""
        if isinstance(d, int):
            return d
        expr = d.node.expr
        if expr.is_Integer:
            return int(expr)
        if not expr.is_Symbol:
            raise GraphError(f"an input's dim {expr} is not one symbol (polyc's inputs "
                             "take symbols, not expressions)")
        bounds = d.node.shape_env.var_to_range.get(expr)
        lo, hi = (bounds.lower, bounds.upper) if bounds is not None else (1, None)
        self.b.symbols[str(expr)] = {"min": max(1, int(lo)),
                                     **({"max": int(hi)} if _finite(hi) else {})}
        return str(expr)

    def target_shape(self, node: fx.Node, *, free: bool = False) -> list[int]:
        """The shape of `node`'s result for an attribute (a view's target): ints, and
        with `free` one dynamic dim written -1 (the others fix it)."""
        shape = list(self.out(node).shape)
        dynamic = [k for k, d in enumerate(shape) if not isinstance(d, int)]
        if dynamic and not (free and len(dynamic) == 1):
            raise GraphError(f"node {node.name!r}: its shape {shape} has dynamic dims an "
                             "attribute cannot hold")
        return [-1 if k in dynamic else d for k, d in enumerate(shape)]


def _finite(v: Any) -> bool:
    """A bound below 2^31 (not sympy's or torch's infinity, nor None)."""
    return getattr(v, "is_Integer", False) is True and int(v) < 2**31


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


def to_graph(module: fx.GraphModule, values: dict[fx.Node, Any], *, dynamic: bool = False
             ) -> tuple[Graph, list[tuple[str, list[int]]]]:
    """The partition as a polyc `Graph`, and for each of its outputs in order, the polyc
    tensor holding it and the permutation that turns that tensor back into the output.
    `values` holds every node's value for one eager call (shapes are concrete); an output
    PyTorch laid out transposed is computed transposed, so that the tensor handed back
    has the strides the ops after it were traced with. `dynamic`: see the module's doc."""
    cv = Converter(module, values, dynamic)
    outputs: list[tuple[str, list[int]]] = []
    for node in module.graph.nodes:
        if node.op == "placeholder":
            v = cv.values[node]
            if isinstance(v, torch.Tensor):
                cv.names[node] = cv.b.input(safe_name(node.name),
                                            [cv.input_dim(d) for d in v.shape], dtype_of(v))
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
    order = dense_order(cv.concrete[node])
    if order == sorted(order):
        return cv.names[node], order
    name = f"{safe_name(node.name)}#in_memory_order"
    if name not in cv.laid_out:
        cv.laid_out.add(cv.b.transpose(cv.names[node], perm=order, out=name))
    return name, [order.index(d) for d in range(len(order))]
