"""float16 and bfloat16 are storage types (DESIGN.md): loaded, computed in float32,
rounded to the nearest even when stored, as PyTorch's CPU kernels do. (Below, "float16"
stands for either.)

`widen_storage` makes that explicit in the graph, before composites are opened: every
op that reads or writes float16 (but casts and data movement, which are exact on any
dtype) reads float32 copies of its float16 inputs and writes a float32 result, cast
back to float16 under the node's output name. A composite is widened whole, so a
float16 softmax rounds once, at its end, not after each of its primitives. Fusion then
sees ordinary casts: a kernel loads float16, computes in float32 and stores float16,
and a target whose units take float16 operands (the NPU's cube) finds them as casts of
loads.

    before:  y: float16 = softmax(x: float16)
    after:   x.f32 = cast(x; to='float32')
             y.wide = softmax(x.f32)           (node 'y')
             y = cast(y.wide; to='float16')    (node 'y.store')

`unshare_widening` (after simplification, before fusion) gives each reader of a widened
copy its own: a cast is cheaper to redo in each kernel than a float32 copy is to store
and load, and a contraction whose operand is a cast of a load of its own folds it into
its packing (the cpu) or takes the float16 operand directly (the cube).
"""
from __future__ import annotations

from dataclasses import replace

from .ir import FrozenDict, Graph, Node, TensorType
from .ops import OPS

# storage type -> the type it is computed in; bool's 0 and 1 are exact in float32, so an
# op on bool (select's condition, a logical op written as maximum) computes there too
STORAGE = {"float16": "float32", "bfloat16": "float32", "bool": "float32"}


def widen_storage(graph: Graph) -> Graph:
    if not any(t.dtype in STORAGE for t in graph.types.values()):
        return graph
    types = dict(graph.types)
    used = set(types) | {n.name for n in graph.nodes}
    wide: dict[str, str] = {}  # float16 tensor -> its float32 copy, made once
    nodes: list[Node] = []

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in used:
            k += 1
            name = f"{base}{k}"
        used.add(name)
        return name

    def widened(tensor: str, origin: str) -> str:
        if tensor not in wide:
            t = types[tensor]
            name = fresh(f"{tensor}.f32")
            types[name] = TensorType(t.shape, STORAGE[t.dtype])
            nodes.append(Node("cast", (tensor,), name, FrozenDict(to=STORAGE[t.dtype]), name,
                              origin))
            wide[tensor] = name
        return wide[tensor]

    for node in graph.nodes:
        out = types[node.output]
        if (node.op == "cast" or OPS[node.op].family == "move"
                or not any(types[t].dtype in STORAGE for t in (*node.inputs, node.output))):
            nodes.append(node)
            continue
        origin = node.origin or f"{node.op} '{node.name}'"
        inputs = tuple(widened(t, origin) if types[t].dtype in STORAGE else t
                       for t in node.inputs)
        if out.dtype not in STORAGE:
            nodes.append(replace(node, inputs=inputs))
            continue
        computed = fresh(f"{node.output}.wide")
        types[computed] = TensorType(out.shape, STORAGE[out.dtype])
        nodes.append(replace(node, inputs=inputs, output=computed))
        nodes.append(Node("cast", (computed,), node.output, FrozenDict(to=out.dtype),
                          fresh(f"{node.name}.store"), origin))
    return replace(graph, nodes=tuple(nodes), types=FrozenDict(types))


def unshare_widening(graph: Graph) -> Graph:
    """Every widening cast read by several nodes becomes one cast per reader."""
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for t in dict.fromkeys(node.inputs):
            readers.setdefault(t, []).append(node)
    shared = {n.output for n in graph.nodes
              if widens(n, graph) and len(readers.get(n.output, ())) > 1}
    if not shared:
        return graph
    types = dict(graph.types)
    used = set(types) | {n.name for n in graph.nodes}
    by_output = {n.output: n for n in graph.nodes}
    kept = set(graph.outputs)  # a graph output keeps its node; its readers get copies
    nodes = []
    for node in graph.nodes:
        if node.output in shared and node.output not in kept:
            del types[node.output]  # each reader makes its own, just before it
            continue
        renames = {}
        for t in dict.fromkeys(node.inputs):
            if t in shared:
                k, name = 1, t
                while name in used:
                    k += 1
                    name = f"{t}.{k}"
                used.add(name)
                types[name] = graph.types[t]
                cast = by_output[t]
                nodes.append(replace(cast, output=name, name=name))
                renames[t] = name
        nodes.append(replace(node, inputs=tuple(renames.get(t, t) for t in node.inputs))
                     if renames else node)
    return replace(graph, nodes=tuple(nodes), types=FrozenDict(types))


def widens(node: Node, graph: Graph) -> bool:
    """Is `node` a storage-type tensor read into float32 (what `widen_storage` adds)?"""
    return (node.op == "cast" and graph.types[node.inputs[0]].dtype in STORAGE
            and node.attrs["to"] == STORAGE[graph.types[node.inputs[0]].dtype])
