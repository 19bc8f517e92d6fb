"""Dependences of a kernel with isl's dataflow analysis (compute_flow).

Flow (read after write) uses the writes as must-sources, so it is exact: only the last
write before each read is a source. Anti (write after read) and output (write after
write) are what any reordering must also respect. All are computed against the
original order, the one semantics a schedule must reproduce.
"""
from __future__ import annotations

from dataclasses import replace

import islpy as isl

from .model import PolyModel, statement_names


def _flow(sink: isl.UnionMap, order: isl.UnionMap, *, must: isl.UnionMap | None = None,
          may: isl.UnionMap | None = None) -> isl.UnionMap:
    info = isl.UnionAccessInfo.from_sink(sink)
    if must is not None:
        info = info.set_must_source(must)
    if may is not None:
        info = info.set_may_source(may)
    return info.set_schedule_map(order).compute_flow().get_may_dependence()


def compute_dependences(model: PolyModel, *, siblings_only: bool = False) -> PolyModel:
    """Fill in `flow`, `anti`, `output` and `input` (read after read: no constraint,
    but reuse the scheduler should bring close, e.g. siblings reading one tensor).

    Before: a model with domain and accesses. After: the same model whose `dependences`
    is, e.g. for a row sum, `{ S_init[i] -> S[i, 0]; S[i, k] -> S[i, k + 1] }` (plus the
    anti dependences of its read-modify-write).

    `siblings_only`: `input` only between different statements (a fused kernel's: only
    fusion's sibling test reads it, `fusion_tree.shared_depth`; isl's scheduler, which
    takes a statement's reuse of its own reads as proximity, never schedules such a
    kernel), from the arrays two or more statements read. A convolution's reuse of its
    input window was 23 of the conv2d example's 58 ms of dataflow.
    """
    flow = _flow(model.reads, model.order, must=model.writes)
    anti = _flow(model.writes, model.order, may=model.reads)
    output = _flow(model.writes, model.order, must=model.writes)
    if siblings_only:
        reads = _shared_reads(model.reads)
        reuse = between_statements(_flow(reads, model.order, may=reads))
    else:
        reuse = _flow(model.reads, model.order, may=model.reads)
    return replace(model, flow=flow, anti=anti, output=output, input=reuse)


def between_statements(deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences of `deps` whose source and sink are different statements."""
    return deps.remove_map_if(
        lambda m: m.get_tuple_name(isl.dim_type.in_) == m.get_tuple_name(isl.dim_type.out))


def _shared_reads(reads: isl.UnionMap) -> isl.UnionMap:
    """The reads of the arrays that more than one statement reads."""
    maps: list[isl.Map] = []
    reads.foreach_map(maps.append)
    readers: dict[str, set[str]] = {}
    for m in maps:
        readers.setdefault(m.get_tuple_name(isl.dim_type.out), set()).add(
            m.get_tuple_name(isl.dim_type.in_))
    return reads.remove_map_if(lambda m: len(readers[m.get_tuple_name(isl.dim_type.out)]) < 2)


def cross_dependences(model: PolyModel, a: PolyModel, b: PolyModel) -> PolyModel:
    """`model` (of a kernel merging the statements of `a` and `b`, each with its
    dependences, its statements named as in `model`) with the dependences
    `compute_dependences(siblings_only=True)` would find: those of `a` and `b`, and those
    between them.

    Exact when each array is written by the statements of one side only (every tensor
    has one producing node): no write of one side then kills a source of the other's,
    so each cross dependence has its sink on one side and its source on the other, and
    dataflow with just those as sinks and sources finds them (`group_models.py`)."""
    sides = [(model.reads.intersect_domain(p.domain), model.writes.intersect_domain(p.domain))
             for p in (a, b)]
    flow, anti, output, reuse = a.flow.union(b.flow), a.anti.union(b.anti), \
        a.output.union(b.output), a.input.union(b.input)
    position = _positions(model.order)
    ranks = [[position[name] for name in statement_names(p.domain)] for p in (a, b)]
    for (reads, writes), (src_reads, src_writes), (mine, theirs) in (
            (sides[0], sides[1], ranks), (sides[1], sides[0], ranks[::-1])):
        if max(mine) < min(theirs):
            # every sink runs before every source: nothing flows this way (a producer's
            # side, with its reads and writes of the consumer's inputs: attention's
            # row tail grown node by node spent a third of its dataflow on them)
            continue
        flow = flow.union(_crossing(reads, src_writes, model.order, must=True))
        anti = anti.union(_crossing(writes, src_reads, model.order, must=False))
        output = output.union(_crossing(writes, src_writes, model.order, must=True))
        reuse = reuse.union(_crossing(reads, src_reads, model.order, must=False))
    # a fused kernel's, as `compute_dependences(siblings_only=True)` finds it
    return replace(model, flow=flow, anti=anti, output=output, input=between_statements(reuse))


def _positions(order: isl.UnionMap) -> dict[str, int]:
    """Each statement's place in the original order (`original_order`: its first
    coordinate, a constant)."""
    maps: list[isl.Map] = []
    order.foreach_map(maps.append)
    return {m.get_tuple_name(isl.dim_type.in_):
            m.plain_get_val_if_fixed(isl.dim_type.out, 0).to_python() for m in maps}


def _crossing(sink: isl.UnionMap, source: isl.UnionMap, order: isl.UnionMap, *,
              must: bool) -> isl.UnionMap:
    """Dataflow from `source` to `sink` accesses of one side each, over the elements
    both touch only: most pairs of sides share an array or two, and isl's dataflow
    costs what its sinks and sources hold."""
    sink = sink.intersect_range(source.range())
    if sink.is_empty():
        return isl.UnionMap.empty(sink.get_space())
    source = source.intersect_range(sink.range())
    order = order.intersect_domain(sink.domain().union(source.domain()))
    return _flow(sink, order, must=source) if must else _flow(sink, order, may=source)


def respects_dependences(model: PolyModel, schedule: isl.Schedule | isl.UnionMap
                         ) -> isl.UnionMap:
    """The dependences `schedule` violates (empty when it is legal); the schedule may be
    given as its map (`schedule.get_map()`), all the check reads of it.

    Independent of whoever built the schedule: every dependence source must run strictly
    before its sink in the schedule's flattened lexicographic order.
    """
    order = schedule if isinstance(schedule, isl.UnionMap) else schedule.get_map()
    order = order.intersect_domain(model.domain)
    if _ascending(model.dependences, order):
        return isl.UnionMap.empty(model.dependences.get_space())
    before = order.lex_lt_union_map(order)
    return model.dependences.subtract(before)


def _ascending(deps: isl.UnionMap, order: isl.UnionMap) -> bool:
    """Whether every dependence maps to an ascending pair of schedule points: the same
    question as above, asked in the schedule's space. That is a few times cheaper than
    ordering all pairs of statement instances (100 -> 22 ms for a tiled gemm), and only
    a violation needs the instances named."""
    pairs: list[isl.Map] = []
    deps.apply_domain(order).apply_range(order).foreach_map(pairs.append)
    for m in pairs:
        space = m.get_space()
        if not space.domain().is_equal(space.range()):
            return False  # schedules of different depths: let the exact check answer
        if not m.is_subset(isl.Map.lex_lt(space.domain())):
            return False
    return True
