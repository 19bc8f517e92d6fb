"""A stage-boundary check of the graph invariants every pass must keep."""
from __future__ import annotations

from ..errors import InternalError
from .ir import Graph
from .ops import OPS, OpError, infer


def verify_graph(graph: Graph, after: str) -> Graph:
    """Raise InternalError naming the pass `after` which a graph invariant broke:
    topological order, unique names, every recorded type equal to re-inference, every
    output produced. Returns the graph, so it chains in a pipeline."""
    def fail(message: str):
        raise InternalError(after, message)

    known = {t.name for t in graph.inputs + graph.constants}
    if len(known) != len(graph.inputs) + len(graph.constants):
        fail("an input and a constant share a name")
    if len({n.name for n in graph.nodes}) != len(graph.nodes):
        fail("two nodes share a name")
    for n in graph.nodes:
        if n.op not in OPS:
            fail(f"{n.provenance}: unknown op {n.op!r}")
        missing = [i for i in n.inputs if i not in known]
        if missing:
            fail(f"{n.provenance} reads {missing[0]!r} before it is produced")
        if n.output in known:
            fail(f"{n.provenance} produces {n.output!r} a second time")
        known.add(n.output)
        try:
            inferred = infer(OPS[n.op], n.attrs, [graph.types[i] for i in n.inputs])
        except OpError as e:
            fail(f"{n.provenance} no longer type-checks: {e}")
        if inferred != graph.types[n.output]:
            fail(f"{n.provenance} is typed {graph.types[n.output]} but infers {inferred}")
    if set(graph.types) != known:
        fail("the type table and the tensors differ")
    absent = [o for o in graph.outputs if o not in known]
    if absent:
        fail(f"graph output {absent[0]!r} is never produced")
    return graph
