"""Simplification of a (primitive) graph: no-op removal, reshapes undone around
elementwise work, constant folding, common subexpression elimination and dead code
elimination, in that order.

The order matters: removing no-ops exposes constants to folding (a no-op reshape of a
large constant feeding a small reduction) and makes equal expressions look equal to CSE
(`exp(reshape(x))` vs `exp(x)`); it runs before and after undoing reshapes, whose way
back it drops; folding runs before CSE so equal folded constants merge;
DCE runs last to sweep what the others orphaned. None of the later steps creates work for
an earlier one, so one round reaches the fixed point: simplifying twice changes nothing.

Example:

    before:  r = reshape(x; shape=[4,8])      # x: float32[4,8], a no-op
             a = exp(r)
             b = exp(x)
             h = mul(c1, c2)                  # c1, c2: scalar constants
             y = add(a, b) ; z = mul(y, h)
    after:   a = exp(x)
             y = add(a, a)
             z = mul(y, h)                    # h is now a constant

Graph outputs keep their names: a no-op whose output is a graph output stays, since the
output must be materialised, though its consumers read past it; CSE never removes a graph
output. Inputs are never removed.
The pass adds no notes; it is an optimisation, not something to warn about.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

import numpy as np

from .ir import FrozenDict, Graph, Node, Tensor
from .ops import OPS
from .reference import constant_value, eval_node

FOLD_LIMIT = 4096  # elements: folding must not turn a small expression into a huge constant


def simplify_graph(graph: Graph, *, fold_limit: int = FOLD_LIMIT) -> Graph:
    """Remove no-ops, undo reshapes around elementwise work (and the no-ops that makes),
    fold constant nodes whose result has at most `fold_limit` elements, merge duplicate
    nodes and constants, drop what reaches no output."""
    graph = remove_noops(undo_reshapes(remove_noops(graph)))
    graph = fold_constants(graph, fold_limit=fold_limit)
    graph = merge_duplicates(graph)
    return drop_dead(graph)


# --- reshapes around elementwise work -----------------------------------------------------

_ELEMENTWISE = {"unary", "binary", "select"}


def undo_reshapes(graph: Graph) -> Graph:
    """Compute elementwise work between a reshape and reshapes back in the first shape.

    A reshape of x whose result only elementwise ops read (with scalars, or results of
    the same work), whose results in turn only reshapes back to x's shape read, is
    dropped: the ops read x and keep its shape, and the reshapes back become no-ops for
    `remove_noops`. PyTorch's Linear on a batch of sequences leaves these around its
    activation (`view [128, 512] -> [2, 64, 512]`, gelu, `view -> [128, 512]`): kept,
    the fused kernel indexed the second view with divisions, 15% of a transformer
    block's time."""
    outputs = set(graph.outputs)
    # equal reshapes of one tensor (CSE merges them later) make one region, undone alike
    twins: dict[tuple, set[str]] = {}
    for node in graph.nodes:
        if node.op == "reshape" and node.output not in outputs:
            twins.setdefault((node.inputs[0], graph.types[node.output]), set()).add(node.output)
    alias: dict[str, str] = {}
    types = dict(graph.types)
    for (source, _), reshaped in twins.items():
        region = _elementwise_region(source, reshaped, graph, outputs)
        if region is not None:
            alias.update((t, source) for t in reshaped)
            shape = graph.types[source].shape
            types.update((t, replace(types[t], shape=shape)) for t in region)
    if not alias:
        return graph
    rebuilt = _rebuilt(graph, graph.constants,
                       [_renamed(n, alias) for n in graph.nodes if n.output not in alias])
    return replace(rebuilt, types=FrozenDict({k: types[k] for k in rebuilt.types}))


def _elementwise_region(source: str, reshaped: set[str], graph: Graph, outputs: set[str]
                        ) -> set[str] | None:
    """The results of the elementwise work the `reshaped` tensors (equal reshapes of
    `source`) feed, when all of it is reshaped back to `source`'s shape and it reads
    nothing else but scalars; else None."""
    before, after = graph.types[source].shape, graph.types[next(iter(reshaped))].shape
    region: dict[str, Node] = {}
    todo = list(reshaped)
    while todo:
        for reader in graph.consumers(todo.pop()):
            if reader.output in region:
                continue
            if reader.op == "reshape" and graph.types[reader.output].shape == before:
                continue  # a way back
            if (reader.output in outputs or OPS[reader.op].family not in _ELEMENTWISE
                    or graph.types[reader.output].shape != after):
                return None
            region[reader.output] = reader
            todo.append(reader.output)
    rank = min(len(before), len(after))
    if not all(i in reshaped or i in region or _ones(graph.types[i].shape, rank)
               for node in region.values() for i in node.inputs):
        return None
    return set(region)


def _ones(shape, rank: int) -> bool:
    """Does a tensor of `shape` broadcast alike against any shape of `rank` dims or more?"""
    return len(shape) <= rank and all(d == 1 for d in shape)


# --- no-ops ------------------------------------------------------------------------------

# For these ops an output type equal to the input type implies the identity: reshape,
# broadcast_to and cast trivially; a slice with steps > 0 keeping every dim's length
# must start at 0 with step 1; pads are >= 0, so an unchanged shape means no padding;
# concat's inputs have dims >= 1, so an unchanged shape means a single input.
_IDENTITY_IF_SAME_TYPE = {"reshape", "broadcast_to", "cast", "slice", "pad", "concat"}


def _is_noop(node: Node, graph: Graph) -> bool:
    src, dst = graph.types[node.inputs[0]], graph.types[node.output]
    if src != dst:
        return False
    if node.op == "transpose":
        perm = node.attrs.get("perm", tuple(reversed(range(src.ndim))))
        return tuple(perm) == tuple(range(src.ndim))
    return node.op in _IDENTITY_IF_SAME_TYPE


def remove_noops(graph: Graph) -> Graph:
    """Make consumers of a node that copies its input unchanged read that input instead;
    drop the copy unless it produces a graph output, which must be materialised. A
    reshape of a reshape reads the first one's input (row-major, it is the same data):
    fused, each reshape was a statement and a buffer of its own (PyTorch's head merge
    `view [2, 64, 4, 32] -> [2, 64, 128] -> [128, 128]`)."""
    outputs = set(graph.outputs)
    alias: dict[str, str] = {}
    reshaped: dict[str, str] = {}  # a reshape's output -> its input
    nodes = []
    for node in graph.nodes:
        node = _renamed(node, alias)
        if node.op == "reshape" and node.inputs[0] in reshaped:
            node = replace(node, inputs=(reshaped[node.inputs[0]],) + node.inputs[1:])
        if node.op == "reshape":
            reshaped[node.output] = node.inputs[0]
        if _is_noop(node, graph):
            alias[node.output] = node.inputs[0]
            if node.output not in outputs:
                continue
        nodes.append(node)
    return _rebuilt(graph, graph.constants, nodes)


# --- constant folding ----------------------------------------------------------------------

def fold_constants(graph: Graph, *, fold_limit: int = FOLD_LIMIT) -> Graph:
    """Replace each node whose inputs are all constants by a constant of the same name,
    when its result has at most `fold_limit` elements."""
    constants = {c.name: c for c in graph.constants}
    arrays: dict[str, np.ndarray] = {}  # made on first use: most constants are never read here

    def array(name: str) -> np.ndarray:
        if name not in arrays:
            arrays[name] = constant_value(constants[name])
        return arrays[name]

    nodes = []
    for node in graph.nodes:
        out_type = graph.types[node.output]
        if out_type.size <= fold_limit and all(i in constants for i in node.inputs):
            value = eval_node(node, [array(i) for i in node.inputs], out_type)
            arrays[node.output] = value
            # tolist() gives Python floats / ints: constant data is plain, hashable values.
            data = tuple(value.reshape(-1).tolist())
            constants[node.output] = Tensor(node.output, out_type, data)
        else:
            nodes.append(node)
    return _rebuilt(graph, constants.values(), nodes)


# --- common subexpressions ---------------------------------------------------------------

def merge_duplicates(graph: Graph) -> Graph:
    """Merge constants of equal type and data, and nodes of equal op, attributes and
    (merged) inputs.

    Each class of equal tensors is known by one name, its primary: a graph output if the
    class holds one (so the output keeps its name), else its first member. The primary's
    node is placed where the class's first member was, the earliest point where all its
    inputs exist. Further graph outputs in a class stay, computed again: an output name
    must be produced by a node of its own.
    """
    outputs = set(graph.outputs)
    first: dict[str, str] = {}  # tensor -> first member of its class
    members: dict[str, list[str]] = {}  # first member -> the class, in graph order

    def join(name: str, key_to_first: dict, key) -> None:
        first[name] = key_to_first.setdefault(key, name)
        members.setdefault(first[name], []).append(name)

    const_keys: dict = {}
    for c in graph.constants:
        # Compare the bytes, not the floats: 0.0 == -0.0 but they differ under 1/x,
        # and NaN != NaN though two NaN constants are interchangeable.
        join(c.name, const_keys, (c.type, c.array.tobytes()))
    node_keys: dict = {}
    for node in graph.nodes:
        join(node.output, node_keys, (node.op, tuple(first.get(i, i) for i in node.inputs),
                                      node.attrs))

    primary: dict[str, str] = {}
    for head, names in members.items():
        chosen = next((m for m in names if m in outputs), head)
        primary.update((m, chosen) for m in names)

    constants = [c for c in graph.constants if primary[c.name] == c.name or c.name in outputs]
    producer = {node.output: node for node in graph.nodes}
    nodes = []
    for node in graph.nodes:
        if first[node.output] == node.output:
            nodes.append(_renamed(producer[primary[node.output]], primary))
        elif node.output in outputs and primary[node.output] != node.output:
            nodes.append(_renamed(node, primary))
    return _rebuilt(graph, constants, nodes)


# --- dead code -------------------------------------------------------------------------------

def drop_dead(graph: Graph) -> Graph:
    """Drop nodes and constants that reach no graph output (inputs always stay: they are
    the kernel's interface)."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if node.output in live:
            live.update(node.inputs)
            kept.append(node)
    constants = [c for c in graph.constants if c.name in live]
    return _rebuilt(graph, constants, kept[::-1])


# --- helpers ---------------------------------------------------------------------------------

def _renamed(node: Node, names: dict[str, str]) -> Node:
    inputs = tuple(names.get(i, i) for i in node.inputs)
    return node if inputs == node.inputs else replace(node, inputs=inputs)


def _rebuilt(graph: Graph, constants: Iterable[Tensor], nodes: Iterable[Node]) -> Graph:
    """`graph` with new constants and nodes, its types restricted to the tensors left."""
    constants, nodes = tuple(constants), tuple(nodes)
    names = ([t.name for t in graph.inputs] + [c.name for c in constants]
             + [n.output for n in nodes])
    return replace(graph, constants=constants, nodes=nodes,
                   types=FrozenDict({k: graph.types[k] for k in names}))
