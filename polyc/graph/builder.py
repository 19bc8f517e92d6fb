"""A small Python builder for subgraphs; `build()` goes through the same validation as JSON.

    b = GraphBuilder("linear_gelu")
    x = b.input("x", [64, 32]); w = b.input("w", [32, 16])
    y = b.gelu(b.matmul(x, w), approximate="tanh")
    graph = b.build(outputs=[y])
"""
from __future__ import annotations

from typing import Callable, Sequence

from .ir import Graph
from .load import Limits, load_graph
from .ops import OPS


class GraphBuilder:
    def __init__(self, name: str = "graph"):
        self.name = name
        self._inputs: list[dict] = []
        self._constants: list[dict] = []
        self._nodes: list[dict] = []
        self._count = 0
        self.symbols: dict[str, dict] = {}  # a symbolic dim's range: {"N": {"min": 2}}

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> str:
        self._inputs.append({"name": name, "shape": list(shape), "dtype": dtype})
        return name

    def constant(self, name: str, shape: Sequence[int], data: Sequence, dtype: str = "float32") -> str:
        self._constants.append({"name": name, "shape": list(shape), "dtype": dtype,
                                "data": list(data)})
        return name

    def op(self, op: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """Add a node; returns the name of its output tensor."""
        if out is None:
            self._count += 1
            out = f"{op}_{self._count}"
        node = {"op": op, "inputs": list(inputs), "outputs": [out]}
        if attrs:
            node["attrs"] = attrs
        self._nodes.append(node)
        return out

    def __getattr__(self, op: str) -> Callable[..., str]:
        if op not in OPS:
            raise AttributeError(op)
        return lambda *inputs, **kw: self.op(op, *inputs, **kw)

    def to_json(self, outputs: Sequence[str]) -> dict:
        doc = {"name": self.name, "inputs": self._inputs, "nodes": self._nodes,
               "outputs": list(outputs)}
        if self._constants:
            doc["constants"] = self._constants
        if self.symbols:
            doc["symbols"] = self.symbols
        return doc

    def build(self, outputs: Sequence[str], *, limits: Limits = Limits()) -> Graph:
        return load_graph(self.to_json(outputs), limits=limits)
