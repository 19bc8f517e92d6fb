"""The graph IR: tensors, nodes and graphs, as immutable values.

Every field is a tuple, a string, a number or a `FrozenDict`, so a graph can be hashed,
cached and shared between passes, which change it only through `dataclasses.replace`.
A `Graph` always carries the inferred type of every tensor it names (`types`), so passes
never re-run shape inference to learn a shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator, Mapping

import ml_dtypes  # noqa: F401  registers numpy's "bfloat16" dtype, which numpy lacks
import numpy as np

DTYPES = ("float32", "float64", "int32", "int64", "float16", "bfloat16", "bool")
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8,
            "bool": 1}
# the integer compute types: exact arithmetic that wraps as C's does on overflow
INT_BITS = {"int32": 32, "int64": 64}


def int_range(dtype: str) -> tuple[int, int]:
    """The least and greatest value of integer `dtype`."""
    bits = INT_BITS[dtype]
    return -2 ** (bits - 1), 2 ** (bits - 1) - 1


class FrozenDict(Mapping):
    """A hashable read-only mapping; lists among its values are stored as tuples."""

    __slots__ = ("_d", "_h")

    def __init__(self, items: Mapping | None = None, **kw):
        d = dict(items or {}, **kw)
        self._d = {k: _freeze(v) for k, v in sorted(d.items())}
        self._h = None

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self) -> Iterator:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(tuple(self._d.items()))
        return self._h

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._d.items()) + "}"


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return FrozenDict(v)
    return v


def thaw(v: Any) -> Any:
    """The JSON-ready form of a frozen value (tuples become lists)."""
    if isinstance(v, tuple):
        return [thaw(x) for x in v]
    if isinstance(v, Mapping):
        return {k: thaw(x) for k, x in v.items()}
    return v


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        """The element count: an int, or a sympy expression when a dim is symbolic."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def static(self) -> bool:
        return all(type(d) is int for d in self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Tensor:
    """A graph input, or a constant when `data` is not None (flat, row-major)."""

    name: str
    type: TensorType
    data: tuple | None = None

    @classmethod
    def constant(cls, name: str, type: TensorType, data: tuple,
                 array: np.ndarray | None = None) -> "Tensor":
        """A constant, with its data's `array` where it is already made (the loader
        checks data in numpy: made again from the tuple, 4M floats took 0.14 s)."""
        t = cls(name, type, data)
        if array is not None:
            array.flags.writeable = False
            t.__dict__["array"] = array  # what `array` would compute: its cached value
        return t

    @cached_property
    def array(self) -> np.ndarray:
        """A constant's data (a tuple) as a flat read-only array, made once: a compile
        reads it in several passes (merged duplicates, digests, the program's arguments),
        and 590K floats of ResNet weights took 16 ms each time, a fifth of a conv2d's
        compile."""
        array = np.array(self.data, dtype=self.type.dtype)
        array.flags.writeable = False
        return array


@dataclass(frozen=True)
class Node:
    """One op application with exactly one output.

    `origin` is the provenance: empty for a node the user wrote, else the user's node
    (and composite op) it was opened from, e.g. "softmax 'y'"; carried through fusion
    into comments of the generated C.
    """

    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: FrozenDict = field(default_factory=FrozenDict)
    name: str = ""
    origin: str = ""

    @property
    def provenance(self) -> str:
        return self.origin or f"{self.op} '{self.name}'"

    def __str__(self) -> str:
        attrs = ", ".join(f"{k}={_fmt(v)}" for k, v in self.attrs.items())
        args = ", ".join(self.inputs) + ("; " + attrs if attrs else "")
        where = f"  # from {self.origin}" if self.origin else ""
        return f"{self.output} = {self.op}({args}){where}"


def _fmt(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return repr(v) if isinstance(v, str) else str(v)


@dataclass(frozen=True)
class Graph:
    """A validated subgraph: nodes in topological order, every tensor typed."""

    name: str
    inputs: tuple[Tensor, ...]
    constants: tuple[Tensor, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    types: FrozenDict  # tensor name -> TensorType, for inputs, constants and node outputs
    notes: tuple[str, ...] = ()  # warnings for the report (e.g. dropped nodes)
    # symbolic dims (graph/symbols.py): name -> (min, max), and the relations between
    # them shape inference assumed, each (sympy relation, message), checked per call
    symbols: FrozenDict = field(default_factory=FrozenDict)
    assumptions: tuple = ()

    def type_of(self, tensor: str) -> TensorType:
        return self.types[tensor]

    def producer(self, tensor: str) -> Node | None:
        return self._producers.get(tensor)

    def consumers(self, tensor: str) -> tuple[Node, ...]:
        return self._consumers.get(tensor, ())

    def node(self, name: str) -> Node:
        """The node named `name` (KeyError if there is none)."""
        return self._by_name[name]

    # indexes built on first use (the graph never changes): passes ask for producers and
    # consumers per node, which scanning the nodes would make quadratic in graph size
    @cached_property
    def _producers(self) -> dict[str, Node]:
        out: dict[str, Node] = {}
        for n in self.nodes:
            out.setdefault(n.output, n)
        return out

    @cached_property
    def _by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def _consumers(self) -> dict[str, tuple[Node, ...]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for t in dict.fromkeys(n.inputs):
                out.setdefault(t, []).append(n)
        return {t: tuple(ns) for t, ns in out.items()}

    @cached_property
    def derived(self) -> dict[str, Any]:
        """What other modules compute from the graph, kept with it (it never changes):
        the fusion oracle builds kernels of it once a proposal (`graph/ranges.py`)."""
        return {}

    @property
    def constant_map(self) -> dict[str, Tensor]:
        return {c.name: c for c in self.constants}

    def __str__(self) -> str:
        lines = [f"graph {self.name}"]
        for t in self.inputs:
            lines.append(f"  input {t.name}: {t.type}")
        for c in self.constants:
            lines.append(f"  const {c.name}: {c.type}")
        for n in self.nodes:
            lines.append(f"  {n.output}: {self.types[n.output]} = {str(n).split(' = ', 1)[1]}")
        lines.append("  outputs " + ", ".join(self.outputs))
        for name, (lo, hi) in self.symbols.items():
            lines.append(f"  symbol {name} in [{lo}, {hi}]")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The subgraph format of DESIGN.md (canonical: defaults filled in; `symbols` only
        in a symbolic graph, so a static graph's form, and cache key, are unchanged)."""
        doc = {
            "name": self.name,
            "inputs": [{"name": t.name, "shape": [d if type(d) is int else str(d)
                                                  for d in t.type.shape],
                        "dtype": t.type.dtype} for t in self.inputs],
            "nodes": [{"op": n.op, "inputs": list(n.inputs), "outputs": [n.output],
                       "attrs": thaw(n.attrs), "name": n.name} for n in self.nodes],
            "outputs": list(self.outputs),
            "constants": [{"name": c.name, "shape": list(c.type.shape), "dtype": c.type.dtype,
                           "data": list(c.data)} for c in self.constants],
        }
        if self.symbols:
            doc["symbols"] = {k: {"min": lo, "max": hi} for k, (lo, hi) in self.symbols.items()}
        return doc
