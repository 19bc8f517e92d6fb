"""Binding a symbolic graph's symbols to values: from a call's inputs, or chosen.

`bind_symbols` reads every symbol's value from the inputs' shapes and refuses, naming
the inputs and the symbol, two inputs that disagree, a value outside the symbol's range,
and a value that breaks one of the relations shape inference assumed. `bind_graph`
is the static graph those values make: the reference executor runs it, and the compiler
makes its decisions on such graphs (`symbolic_compile.py`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from ..errors import GraphError, Problem
from .ir import FrozenDict, Graph, Tensor, TensorType
from .load import Limits
from .symbols import substitute, substitute_shape

MAX_ELEMENTS = Limits.max_elements  # the loader's default limit per tensor


def bind_symbols(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Each symbol's value from the shapes of the inputs (name -> shape; every input of
    `graph` present, with its rank). Raises GraphError naming what disagrees."""
    values: dict[str, int] = {}
    seen: dict[str, str] = {}  # symbol -> "input 'x' axis 0", where its value came from
    problems = []
    for t in graph.inputs:
        shape = shapes[t.name]
        for axis, d in enumerate(t.type.shape):
            if type(d) is int:
                continue
            name, where = d.name, f"input {t.name!r} axis {axis}"
            if name not in values:
                values[name], seen[name] = shape[axis], where
            elif values[name] != shape[axis]:
                problems.append(Problem(f"inputs disagree on symbol {name}: {values[name]} from "
                                        f"{seen[name]} but {shape[axis]} from {where}",
                                        field="inputs"))
    for name, (lo, hi) in graph.symbols.items():
        if name in values and not lo <= values[name] <= hi:
            problems.append(Problem(f"symbol {name} = {values[name]} (from {seen[name]}) is "
                                    f"outside its range [{lo}, {hi}]", field="inputs"))
    if not problems:
        # kernels index with C ints: the loader's per-tensor limit, now that sizes are known
        for name, t in graph.types.items():
            if not t.static and (size := substitute(t.size, values)) > MAX_ELEMENTS:
                bound = ", ".join(f"{k}={values[k]}" for k in sorted(values))
                problems.append(Problem(f"with {bound} tensor {name!r} would hold {size} "
                                        f"elements, over the limit of {MAX_ELEMENTS} per tensor",
                                        field="inputs"))
                break
        for relation, message in graph.assumptions:
            if not bool(relation.subs({s: values[s.name] for s in relation.free_symbols})):
                bound = ", ".join(f"{k}={values[k]}" for k in sorted(values))
                problems.append(Problem(f"{message} (with {bound})", field="inputs"))
    if problems:
        raise GraphError(problems)
    return values


def check_shape(graph: Graph, name: str, arr: np.ndarray) -> bool:
    """The rank, static dims and dtype of input `name` match (its symbols are bound later)."""
    t = graph.types[name]
    return (arr.ndim == t.ndim and arr.dtype == t.dtype
            and all(type(d) is not int or d == n for d, n in zip(t.shape, arr.shape)))


def bind_graph(graph: Graph, values: Mapping[str, int]) -> Graph:
    """The static graph `graph` is once its symbols take `values` (all of them)."""
    def typed(t: TensorType) -> TensorType:
        return t if t.static else TensorType(substitute_shape(t.shape, values), t.dtype)

    inputs = tuple(Tensor(t.name, typed(t.type), t.data) for t in graph.inputs)
    types = FrozenDict({k: typed(t) for k, t in graph.types.items()})
    return replace(graph, inputs=inputs, types=types, symbols=FrozenDict(), assumptions=())


def bound_shape(t: TensorType, values: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of a tensor of type `t` once the symbols take `values`."""
    return t.shape if t.static else substitute_shape(t.shape, values)


def symbol_values(graph: Graph, given: Mapping[str, int]) -> dict[str, int]:
    """A value for every symbol: `given`, else 16 moved into the symbol's range. A name
    that is not a symbol of `graph`, or a value outside its range, is a GraphError."""
    problems = [Problem(f"{k!r} is not a symbol of graph {graph.name!r} (its symbols: "
                        f"{', '.join(graph.symbols) or 'none'})", field=f"symbols.{k}")
                for k in given if k not in graph.symbols]
    problems += [Problem(f"{v!r} is outside the symbol's range [{lo}, {hi}]",
                         field=f"symbols.{k}")
                 for k, v in given.items() if k in graph.symbols
                 for lo, hi in [graph.symbols[k]]
                 if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi]
    if problems:
        raise GraphError(problems)
    return {k: given.get(k, min(max(16, lo), hi)) for k, (lo, hi) in graph.symbols.items()}
