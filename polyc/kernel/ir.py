"""Kernels: a group of primitive nodes that becomes one C function.

`build_kernels` lowers every node of each group to its statements and names every tensor
the kernel touches with a C identifier derived from, but never equal to, the user's name
(`t3_my_tensor`), so a user string can reach generated C only through `c_ident` and
`c_comment`.

A kernel's arrays have roles: `in` (read, produced elsewhere), `out` (written, needed
elsewhere) and `local` (produced and consumed inside the kernel only).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..graph.ir import Graph, TensorType
from ..graph.ranges import (constant_digests, iota_constants, masked_exponentials,
                            nonpositive_tensors, triangle_constants)
from .comprehension import Statement, loads, lower_node
from .prologue import fold_epilogues, fold_prologues, recompute, widening_loads

_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def c_ident(name: str, prefix: str) -> str:
    """A C identifier for a user-supplied name: only [A-Za-z0-9_], never a keyword or a
    reserved name, because it always starts with the compiler-chosen `prefix`."""
    return f"{prefix}_{_UNSAFE.sub('_', name)[:32]}".rstrip("_")


def c_comment(text: str) -> str:
    """Text safe inside a C block comment: printable ASCII, no comment terminator."""
    text = "".join(ch if " " <= ch <= "~" else "?" for ch in text[:200])
    return text.replace("*/", "*?").replace("/*", "?*")


@dataclass(frozen=True)
class Array:
    tensor: str  # the graph's tensor name
    c_name: str
    type: TensorType
    role: str  # 'in' | 'out' | 'local'
    kept: tuple[int, ...] | None = None  # a contracted local: the dims its buffer keeps
    nonpositive: bool = False  # every element <= 0 or NaN (graph/ranges.py)
    iota: int | None = None  # a constant whose elements are their index along this dim
    # a constant nonzero exactly where index[col] > index[row] + d: (row, col, d)
    triangle: tuple[int, int, int] | None = None
    # (row, col, d): 0 where index[col] > index[row] + d, unless its row is NaN where
    # it is not (a softmax of masked scores, graph/ranges.py)
    masked: tuple[int, int, int] | None = None
    # a static constant's data, as sha256 hex: C that keeps something made from the data
    # (a contraction's operand packed on the first call) names it, so that the unit, and
    # the object cached for it, are this data's alone
    constant: str = ""
    # (dim, rows): a local a row tail's nest touches one block of rows at a time (a gemm's
    # C and the probabilities a second contraction reads, `trees.block_buffers`): its
    # buffer holds one block, the dims before `dim` dropped, `dim` taken modulo `rows`
    block: tuple[int, int] | None = None

    @property
    def buffer_shape(self) -> tuple[int, ...]:
        if self.block is not None:
            dim, rows = self.block
            return (rows,) + self.type.shape[dim + 1:]
        if self.kept is None:
            return self.type.shape
        return tuple(self.type.shape[k] for k in self.kept)


@dataclass(frozen=True)
class Kernel:
    name: str  # the C function name
    nodes: tuple[str, ...]  # graph node names it covers, in order
    statements: tuple[Statement, ...]
    arrays: tuple[Array, ...]  # the C ABI: 'in' and 'out' arrays in this order are the parameters
    symbols: tuple[str, ...] = ()  # a symbolic kernel's: C names of its int64_t parameters, after the arrays

    @property
    def params(self) -> tuple[Array, ...]:
        return tuple(a for a in self.arrays if a.role != "local")

    def array(self, tensor: str) -> Array:
        return next(a for a in self.arrays if a.tensor == tensor)

    def __str__(self) -> str:
        lines = [f"kernel {self.name} covers {', '.join(self.nodes)}"]
        for a in self.arrays:
            buf = (f" as buffer [{','.join(map(str, a.buffer_shape))}]"
                   if a.kept is not None or a.block is not None else "")
            const = f" constant {a.constant[:12]}" if a.constant else ""
            lines.append(f"  {a.role:5} {a.c_name}: {a.type}{buf}{const}  ({a.tensor!r})")
        lines += [f"  {s}" for s in self.statements]
        return "\n".join(lines)


def build_kernels(graph: Graph, groups: tuple[tuple[str, ...], ...]) -> tuple[Kernel, ...]:
    """One `Kernel` per group of node names (groups in a valid execution order)."""
    c_names = _tensor_c_names(graph)
    nonpositive = nonpositive_tensors(graph)
    iotas, triangles = iota_constants(graph), triangle_constants(graph)
    digests = constant_digests(graph)
    masked = masked_exponentials(graph)
    by_name = {n.name: n for n in graph.nodes}
    constants = graph.constant_map
    kernels = []
    for k, group in enumerate(groups):
        nodes = [by_name[name] for name in group]
        statements: list[Statement] = []
        for j, node in enumerate(nodes):
            statements += lower_node(node, f"S{j}", graph.types, constants)
        produced = [n.output for n in nodes]
        needed_outside = set(graph.outputs) | {
            t for other in graph.nodes if other.name not in group for t in other.inputs}
        local = set(produced) - needed_outside
        widened = widening_loads(statements, local)
        statements = recompute(statements, widened)
        statements, folded = fold_prologues(statements, local - set(widened))
        statements, into_epilogue = fold_epilogues(statements, local - set(widened))
        folded += into_epilogue + widened
        produced = [t for t in produced if t not in folded]
        loaded = {ld.tensor for s in statements for ld, _ in loads(s.expr)}
        read = []
        for n in nodes:  # in the nodes' order: the kernel's parameters are stable
            for t in n.inputs:
                if t not in produced and t in loaded and t not in read:
                    read.append(t)
        arrays = [Array(t, c_names[t], graph.types[t], "in", nonpositive=t in nonpositive,
                        iota=iotas.get(t), triangle=triangles.get(t), masked=masked.get(t),
                        constant=digests.get(t, ""))
                  for t in read]
        arrays += [Array(t, c_names[t], graph.types[t], "out" if t in needed_outside else "local",
                         nonpositive=t in nonpositive, masked=masked.get(t)) for t in produced]
        # named after its first node that left a statement (not a folded cast or prologue)
        first = next((n.name for n in nodes if n.output not in folded), group[0])
        name = c_ident(first, f"polyc_k{k}")
        kernels.append(Kernel(name, tuple(group), tuple(statements), tuple(arrays)))
    return tuple(kernels)


def _tensor_c_names(graph: Graph) -> dict[str, str]:
    names = [t.name for t in graph.inputs + graph.constants] + [n.output for n in graph.nodes]
    return {t: c_ident(t, f"t{k}") for k, t in enumerate(names)}


def recompute_locals(kernel: Kernel, tensors: tuple[str, ...]) -> Kernel:
    """`kernel` with the local `tensors` computed again wherever they are read instead
    of stored (`prologue.recompute`); the other arrays lose their buffer plans, which
    the next schedule decides again."""
    nonpositive = frozenset(a.tensor for a in kernel.arrays if a.nonpositive)
    statements = recompute(kernel.statements, tensors, nonpositive)
    arrays = tuple(replace(a, kept=None) for a in kernel.arrays if a.tensor not in tensors)
    return replace(kernel, statements=statements, arrays=arrays)
