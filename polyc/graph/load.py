"""Loading and validating subgraphs in the format of DESIGN.md.

`load_graph` accepts a path, a JSON string or an already-parsed dict and returns a
validated `Graph`: nodes topologically sorted, attributes normalised (defaults filled in),
every tensor typed, nodes that reach no output dropped with a note. Every problem found
is reported at once in one `GraphError`, each naming its node and field.
"""
from __future__ import annotations

import difflib
import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GraphError, Problem
from .ir import DTYPES, INT_BITS, FrozenDict, Graph, Node, Tensor, TensorType, int_range
from .ops import OPS, OpError, check_attrs, infer
from .symbols import (DEFAULT_MAX, DEFAULT_MIN, Scope, close_scope, free_names, is_identifier,
                      is_static_shape, open_scope, substitute, symbol)


@dataclass(frozen=True)
class Limits:
    """Refuse graphs too large to compile before anything is allocated."""

    max_elements: int = 1 << 28  # per tensor (1 GiB of float32)
    max_total_elements: int = 1 << 30  # over all tensors of the graph
    max_nodes: int = 10_000
    # inputs of one node (a concat): each becomes a case of one statement, and isl's
    # model of a statement with thousands of cases takes minutes
    max_node_inputs: int = 256
    max_rank: int = 8
    max_name_length: int = 256


TOP_KEYS = {"name", "inputs", "nodes", "outputs", "constants", "symbols"}
SYMBOL_KEYS = {"min", "max"}
NODE_KEYS = {"op", "inputs", "outputs", "attrs", "name"}
INPUT_KEYS = {"name", "shape", "dtype"}
CONST_KEYS = INPUT_KEYS | {"data"}


def _reject_constant(token: str):
    raise GraphError(f"{token} is not valid JSON (NaN and Infinity are refused)")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise GraphError(f"the number {token} is too large for a float (infinity is refused)")
    return value


def parse_json(text: str | bytes) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise GraphError(f"invalid JSON: {e}") from None
    except UnicodeDecodeError:  # bytes that are not UTF-8 (or -16/-32) text
        raise GraphError("invalid JSON: not UTF-8 text") from None
    except RecursionError:
        raise GraphError("invalid JSON: nested too deeply") from None


def _looks_like_json(src: str | bytes) -> bool:
    # A path never starts with '{' or '['; a subgraph (or a mistaken array) always does.
    return src.lstrip()[:1] in ("{", "[", b"{", b"[")


def load_graph(src: str | os.PathLike | dict, *, limits: Limits = Limits()) -> Graph:
    """Load and validate a subgraph from a path, a JSON string or a dict."""
    return _Loader(limits).load(read_document(src))


def read_document(src: str | bytes | os.PathLike | dict, what: str = "graph") -> Any:
    """The parsed JSON of a path, a JSON string or a dict (returned as is); every
    failure to read or parse is a GraphError. `what` names the document in messages."""
    if isinstance(src, dict):
        doc = src
    elif isinstance(src, (str, bytes)) and _looks_like_json(src):
        doc = parse_json(src)
    elif isinstance(src, (str, os.PathLike)):
        # Read first, parse after: parse errors are GraphErrors, themselves ValueErrors.
        try:
            text = Path(src).read_text(encoding="utf-8")
        except OSError as e:
            raise GraphError(f"cannot read {what} file {str(src)!r}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise GraphError(f"{what} file {str(src)!r} is not UTF-8 text") from None
        except ValueError as e:  # e.g. a NUL byte in the path
            raise GraphError(f"cannot read {what} file {str(src)!r}: {e}") from None
        doc = parse_json(text)
    else:
        raise GraphError(f"expected a path, a JSON string or a dict, got {type(src).__name__}")
    return doc


class _Loader:
    def __init__(self, limits: Limits):
        self.limits = limits
        self.problems: list[Problem] = []
        self.total_elements = 0
        self.declared: dict[str, tuple[int, int]] = {}  # symbol ranges the graph declares
        # Each suggestion scans every known name; a hostile graph with thousands of typos
        # would otherwise take minutes. A user fixes the first few and reloads anyway.
        self.hints_left = 8

    def error(self, message: str, node: str | None = None, op: str | None = None,
              field: str | None = None) -> None:
        self.problems.append(Problem(message, node, op, field))

    def did_you_mean(self, word: str, known) -> str:
        if self.hints_left <= 0:
            return ""
        self.hints_left -= 1
        close = difflib.get_close_matches(word, sorted(known), n=1)
        return f" (did you mean {close[0]!r}?)" if close else ""

    def fail_if_any(self) -> None:
        if self.problems:
            raise GraphError(self.problems)

    # -- top level ------------------------------------------------------------------
    def load(self, doc: Any) -> Graph:
        if not isinstance(doc, dict):
            raise GraphError(f"a subgraph must be a JSON object, got {type(doc).__name__}")
        for key in sorted(set(doc) - TOP_KEYS):
            self.error(f"unknown field (allowed: {', '.join(sorted(TOP_KEYS))})", field=key)
        name = doc.get("name", "graph")
        if not self._is_name(name):
            self.error(f"must be a non-empty string, got {name!r}", field="name")
            name = "graph"
        for key in ("inputs", "nodes", "outputs"):
            if key not in doc:
                self.error("missing required field", field=key)
            elif not isinstance(doc[key], list):
                self.error(f"must be a list, got {type(doc[key]).__name__}", field=key)
        if "constants" in doc and not isinstance(doc["constants"], list):
            self.error("must be a list", field="constants")
        self.fail_if_any()
        if len(doc["nodes"]) > self.limits.max_nodes:
            raise GraphError(Problem(f"{len(doc['nodes'])} nodes exceed the limit of "
                                     f"{self.limits.max_nodes}", field="nodes"))

        types: dict[str, TensorType] = {}
        declared = self.declared = self._symbols(doc.get("symbols", {}))
        inputs = tuple(t for i, d in enumerate(doc["inputs"])
                       if (t := self._tensor(d, f"inputs[{i}]", INPUT_KEYS, types)))
        constants = tuple(t for i, d in enumerate(doc.get("constants", []))
                          if (t := self._tensor(d, f"constants[{i}]", CONST_KEYS, types)))
        raw_nodes = [n for i, d in enumerate(doc["nodes"]) if (n := self._node(d, i))]
        outputs = self._outputs(doc["outputs"])
        used = free_names(d for t in inputs for d in t.type.shape)
        for name in sorted(set(declared) - used):
            self.error("is declared but no input's shape uses it", field=f"symbols.{name}")
        self.fail_if_any()
        ranges = FrozenDict({k: declared.get(k, (DEFAULT_MIN, DEFAULT_MAX)) for k in used})

        nodes = self._sort(raw_nodes, set(types))
        self.fail_if_any()
        scope = Scope(ranges)
        token = open_scope(scope)
        try:
            typed = self._infer(nodes, types, scope)
        finally:
            close_scope(token)
        self.fail_if_any()
        for o in outputs:
            if o not in types:
                self.error(f"graph output {o!r} is never produced", field="outputs")
        self.fail_if_any()
        kept, notes = _drop_dead(typed, outputs)
        named = {t.name for t in inputs + constants} | {n.output for n in kept}
        return Graph(name, inputs, constants, tuple(kept), tuple(outputs),
                     FrozenDict({k: v for k, v in types.items() if k in named}), tuple(notes),
                     ranges, tuple(dict.fromkeys(scope.assumptions)))

    # -- pieces -----------------------------------------------------------------------
    def _is_name(self, v: Any) -> bool:
        return isinstance(v, str) and 0 < len(v) <= self.limits.max_name_length

    def _symbols(self, doc: Any) -> dict[str, tuple[int, int]]:
        """The `symbols` field: name -> (min, max), each checked."""
        if not isinstance(doc, dict):
            self.error(f"must be an object of symbol ranges, got {doc!r}", field="symbols")
            return {}
        out = {}
        for name, r in doc.items():
            where = f"symbols.{name}"
            if not is_identifier(name):
                self.error(f"{name!r} is not an identifier (a letter or _, then letters, "
                           "digits or _)", field=where)
                continue
            if not isinstance(r, dict):
                self.error(f"must be an object {{\"min\": .., \"max\": ..}}, got {r!r}",
                           field=where)
                continue
            for key in sorted(set(r) - SYMBOL_KEYS):
                self.error("unknown field (allowed: max, min)", field=f"{where}.{key}")
            lo, hi = r.get("min", DEFAULT_MIN), r.get("max", DEFAULT_MAX)
            bad = [k for k, v in (("min", lo), ("max", hi))
                   if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= DEFAULT_MAX]
            for k in bad:
                self.error(f"must be an integer from 1 to {DEFAULT_MAX}, got {r[k]!r}",
                           field=f"{where}.{k}")
            if not bad and lo > hi:
                self.error(f"min {lo} is greater than max {hi}", field=where)
            elif not bad:
                out[name] = (lo, hi)
        return out

    def _shape(self, shape: Any, where: str, symbols_ok: bool = True) -> tuple[int, ...] | None:
        if not isinstance(shape, list):
            self.error(f"shape must be a list of integers, got {shape!r}", where, field="shape")
            return None
        if len(shape) > self.limits.max_rank:
            self.error(f"rank {len(shape)} exceeds the limit of {self.limits.max_rank}", where,
                       field="shape")
            return None
        for d in shape:
            if symbols_ok and is_identifier(d):
                continue
            if isinstance(d, bool) or not isinstance(d, int) or d < 1:
                what = ("an integer >= 1" if not symbols_ok else
                        "an integer >= 1 or a symbol (an identifier such as N)")
                self.error(f"every dim must be {what}, got {d!r} in {shape!r}", where,
                           field="shape")
                return None
        if is_static_shape(shape):
            return tuple(shape)
        return tuple(d if isinstance(d, int) else symbol(d) for d in shape)

    def _count(self, t: TensorType, where: str, op: str | None = None) -> bool:
        # Inputs were checked by _shape already; this catches reshape / broadcast_to.
        if t.ndim > self.limits.max_rank:
            self.error(f"rank {t.ndim} exceeds the limit of {self.limits.max_rank}", where, op,
                       "shape")
            return False
        # a symbolic shape counts at its symbols' lowest values: what every call needs
        size = t.size if t.static else substitute(t.size, {
            k: self.declared.get(k, (DEFAULT_MIN,))[0] for k in free_names(t.shape)})
        if size > self.limits.max_elements:
            self.error(f"{list(t.shape)} has {size} elements, over the limit of "
                       f"{self.limits.max_elements} per tensor", where, op, "shape")
            return False
        self.total_elements += size
        if self.total_elements > self.limits.max_total_elements:
            self.error(f"the graph's tensors hold more than {self.limits.max_total_elements} "
                       "elements in total", where, op, "shape")
            return False
        return True

    def _tensor(self, d: Any, where: str, keys: set, types: dict) -> Tensor | None:
        if not isinstance(d, dict):
            self.error(f"must be an object, got {d!r}", field=where)
            return None
        label = d.get("name") if self._is_name(d.get("name")) else where
        for key in sorted(set(d) - keys):
            self.error(f"unknown field (allowed: {', '.join(sorted(keys))})", label, field=key)
        missing = sorted(keys - set(d) - {"dtype"})
        for key in missing:
            self.error("missing required field", label, field=key)
        if missing:
            return None
        if not self._is_name(d.get("name")):
            self.error(f"name must be a non-empty string, got {d.get('name')!r}", where,
                       field="name")
            return None
        name = d["name"]
        if name in types:
            self.error(f"duplicate tensor name {name!r}", name, field="name")
            return None
        dtype = d.get("dtype", "float32")
        if dtype not in DTYPES:
            self.error(f"unknown dtype {dtype!r} (allowed: {', '.join(DTYPES)})", name,
                       field="dtype")
            return None
        # a constant's data is written out: its shape is static
        shape = self._shape(d.get("shape"), name, symbols_ok="data" not in keys)
        if shape is None:
            return None
        t = TensorType(shape, dtype)
        if not self._count(t, name):
            return None
        if "data" not in keys:
            types[name] = t
            return Tensor(name, t)
        checked = self._data(d.get("data"), t, name)
        if checked is None:
            return None
        types[name] = t
        return Tensor.constant(name, t, *checked)

    def _data(self, data: Any, t: TensorType, name: str
              ) -> tuple[tuple, np.ndarray | None] | None:
        """The data as a tuple, and as an array where numpy checked it; None after an
        error."""
        if not isinstance(data, list):
            self.error("data must be a flat list of numbers", name, field="data")
            return None
        if len(data) != t.size:
            self.error(f"data has {len(data)} values but shape {list(t.shape)} needs {t.size}",
                       name, field="data")
            return None
        array = _plain_numbers(data, t.dtype)
        if array is not None:
            return tuple(data), array
        for v in data:
            if t.dtype == "bool":
                ok = v in (0, 1)  # true, false, 0 or 1
            else:
                ok = (not isinstance(v, bool) and isinstance(v, (int, float))
                      and _finite(v) and (t.dtype not in INT_BITS or isinstance(v, int)))
            if not ok:
                kind = ("an integer" if t.dtype in INT_BITS else
                        "true, false, 0 or 1" if t.dtype == "bool" else "a finite number")
                self.error(f"every value must be {kind}, got {v!r}", name, field="data")
                return None
        if t.dtype in INT_BITS:
            lo, hi = int_range(t.dtype)
            if any(not lo <= v <= hi for v in data):
                self.error(f"a value does not fit in {t.dtype}", name, field="data")
                return None
        elif t.dtype != "bool":
            wide = np.array(data, dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(_narrow(wide, t.dtype)))
            if bad.size:
                self.error(f"a value does not fit in {t.dtype} (it would be infinite): "
                           f"{data[bad[0]]!r}", name, field="data")
                return None
        return tuple(data), None

    def _node(self, d: Any, index: int) -> Node | None:
        where = f"nodes[{index}]"
        if not isinstance(d, dict):
            self.error(f"must be an object, got {d!r}", field=where)
            return None
        outs = d.get("outputs")
        label = d.get("name")
        if not self._is_name(label):
            label = outs[0] if isinstance(outs, list) and outs and self._is_name(outs[0]) else where
        # Only a string can be looked up in OPS: a list or dict here is unhashable.
        op = d.get("op") if isinstance(d.get("op"), str) else None
        before = len(self.problems)
        for key in sorted(set(d) - NODE_KEYS):
            self.error(f"unknown field (allowed: {', '.join(sorted(NODE_KEYS))})", label, op,
                       key)
        for key in ("op", "inputs", "outputs"):
            if key not in d:
                self.error("missing required field", label, op, key)
        if "name" in d and not self._is_name(d["name"]):
            self.error(f"must be a non-empty string, got {d['name']!r}", label, op, "name")
        if "op" in d and op not in OPS:
            hint = self.did_you_mean(op, OPS) if op else ""
            self.error(f"unknown op {d['op']!r}{hint}", label, op, "op")
        ins = d.get("inputs")
        if "inputs" in d and (not isinstance(ins, list)
                              or not all(self._is_name(x) for x in ins)):
            self.error(f"must be a list of tensor names, got {ins!r}", label, op, "inputs")
        elif isinstance(ins, list) and len(ins) > self.limits.max_node_inputs:
            self.error(f"{len(ins)} inputs exceed the limit of {self.limits.max_node_inputs} "
                       "per node (concatenate in steps: a concat of concats)", label, op,
                       "inputs")
        if "outputs" in d and (not isinstance(outs, list) or len(outs) != 1
                               or not self._is_name(outs[0])):
            self.error(f"every op has exactly one output: expected a list of one tensor name, "
                       f"got {outs!r}", label, op, "outputs")
        attrs = FrozenDict()
        if op in OPS:
            # `"attrs": null` means none; any other non-object (even [] or 0) is an error.
            raw = d.get("attrs")
            try:
                attrs = check_attrs(OPS[op], {} if raw is None else raw)
            except OpError as e:
                self.error(str(e), label, op, f"attrs.{e.field}" if e.field != "attrs" else "attrs")
        if len(self.problems) > before:
            return None
        return Node(op, tuple(ins), outs[0], attrs, d.get("name", outs[0]))

    def _outputs(self, outs: list) -> list[str]:
        if not outs:
            self.error("a graph needs at least one output", field="outputs")
        for o in outs:
            if not self._is_name(o):
                self.error(f"must be tensor names, got {o!r}", field="outputs")
        names = [o for o in outs if isinstance(o, str)]
        for o, count in sorted(Counter(names).items()):
            if count > 1:
                self.error(f"output {o!r} is listed {count} times", field="outputs")
        return names

    def _sort(self, nodes: list[Node], sources: set[str]) -> list[Node]:
        """Topological order; reports cycles and tensors that nothing produces.

        Kahn's algorithm by levels: first every node that needs only sources, then every
        node that needs only those, and so on, each level in the order of its output
        names: the order (so the compile, and the service's cache key) does not depend on
        the order the file lists its nodes in. Counting unmet inputs keeps it linear, so
        a 10,000-node chain does not take a minute."""
        producer: dict[str, Node] = {}
        names: set[str] = set()
        for n in nodes:
            if n.output in sources:
                self.error(f"output {n.output!r} is already the name of a graph input or "
                           "constant", n.name, n.op, "outputs")
            elif n.output in producer:
                self.error(f"tensor {n.output!r} is already produced by node "
                           f"{producer[n.output].name!r}", n.name, n.op, "outputs")
            else:
                producer[n.output] = n
            if n.name in names:
                self.error(f"duplicate node name {n.name!r}", n.name, n.op, "name")
            names.add(n.name)
        known = sources | set(producer)
        for n in nodes:
            for i in n.inputs:
                if i not in known:
                    hint = self.did_you_mean(i, known)
                    self.error(f"input {i!r} is not a graph input, a constant or the output "
                               f"of any node{hint}", n.name, n.op, "inputs")
        if self.problems:
            return []
        unmet = [len(set(n.inputs) - sources) for n in nodes]
        consumers: dict[str, list[int]] = {}
        for k, n in enumerate(nodes):
            for i in set(n.inputs) - sources:
                consumers.setdefault(i, []).append(k)
        by_output = lambda k: nodes[k].output  # noqa: E731
        level = sorted((k for k, c in enumerate(unmet) if c == 0), key=by_output)
        order: list[int] = []
        while level:
            order += level
            freed = []
            for k in level:
                for c in consumers.get(nodes[k].output, ()):
                    unmet[c] -= 1
                    if unmet[c] == 0:
                        freed.append(c)
            level = sorted(freed, key=by_output)
        if len(order) < len(nodes):
            done = sources | {nodes[k].output for k in order}
            start = next(n for n in nodes if n.output not in done)
            cycle = _find_cycle(start, producer, done)
            names = [repr(n.name) for n in cycle]
            if len(names) > 8:  # the message must stay readable
                names = names[:6] + [f"... {len(names) - 6} more ..."]
            path = " -> ".join(names + names[:1])
            self.error(f"the graph has a cycle: {path}", cycle[0].name, cycle[0].op, "inputs")
            return []
        return [nodes[k] for k in order]

    def _infer(self, nodes: list[Node], types: dict[str, TensorType], scope: Scope) -> list[Node]:
        out = []
        for n in nodes:
            if any(i not in types for i in n.inputs):
                continue  # an earlier node failed; its problem is already reported
            scope.where = f"node {n.name!r} ({n.op})"
            try:
                t = infer(OPS[n.op], n.attrs, [types[i] for i in n.inputs])
            except OpError as e:
                field = e.field if e.field == "inputs" or e.field is None else f"attrs.{e.field}"
                self.error(str(e), n.name, n.op, field)
                continue
            if self._count(t, n.name, n.op):
                types[n.output] = t
                out.append(n)
        return out


def _find_cycle(start: Node, producer: dict[str, Node], done: set[str]) -> list[Node]:
    """The nodes of one cycle, in data-flow order, found from a node that can never run.

    Every such node waits on an input whose producer can never run either, so walking
    back along unfinished inputs must come round to a node already seen."""
    seen: list[Node] = []
    position: dict[str, int] = {}  # output -> index in `seen`; outputs are unique
    n = start
    while n.output not in position:
        position[n.output] = len(seen)
        seen.append(n)
        n = producer[next(i for i in n.inputs if i not in done)]
    cycle = seen[position[n.output]:][::-1]  # walked against the data flow
    return cycle[-1:] + cycle[:-1]  # start where the walk closed (`start` if on the cycle)


def _drop_dead(nodes: list[Node], outputs: list[str]) -> tuple[list[Node], list[str]]:
    live = set(outputs)
    kept = []
    for n in reversed(nodes):
        if n.output in live:
            live.update(n.inputs)
            kept.append(n)
    notes = [f"node {n.name!r} ({n.op}) reaches no output and was dropped"
             for n in nodes if n.output not in live]
    return kept[::-1], notes


def _finite(v: int | float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past float's range
        return False


def _plain_numbers(data: list, dtype: str) -> np.ndarray | None:
    """A constant's data as an array of `dtype`, where numpy finds every value valid for
    it; else None. Only for data of Python ints and floats (bools, subclasses and the
    rest take the loop that names the bad value): a loop over ResNet's 590K weights took
    0.58 s, 80% of the compile."""
    if dtype == "bool":
        return None
    kinds = set(map(type, data))
    if dtype in INT_BITS:
        lo, hi = int_range(dtype)
        if not kinds <= {int} or not lo <= min(data) or not max(data) <= hi:
            return None
        return np.array(data, dtype=dtype)
    if not kinds <= {int, float}:
        return None
    try:
        wide = np.array(data, dtype=np.float64)
    except OverflowError:
        return None
    narrow = _narrow(wide, dtype)
    return narrow if np.isfinite(narrow).all() else None


def _narrow(wide: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values in `dtype`, infinite where they do not fit (1e39 in float32, 70000
    in float16: a constant JSON could not have written)."""
    with np.errstate(over="ignore"):
        return wide.astype(dtype)
