"""Array contraction: intermediates of a fused kernel live in small buffers.

A `local` array (produced and consumed inside one kernel) need not exist in memory whole.
If every element is touched within one iteration of the kernel's outer D loops, every
array dimension that one of those loops pins (loop iterator = that index, on every
access) can be dropped: elements that share a buffer slot differ in a pinned index, so
they are touched in different iterations, and since the code runs iterations in the
schedule's lexicographic order their lifetimes never overlap. Softmax's exp[i, j] is
touched at loop i = its row only, so it becomes a row buffer exp[j]; sub's output,
produced and consumed at the same (i, j), becomes a single value.

Codegen declares the buffers once per call and makes them private to each thread of a
parallel loop. Both facts are proved with isl on the access relations and the schedule.
"""
from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from ..kernel import Array, Kernel
from .model import PolyModel, statement_names

_BAND = isl.schedule_node_type.band
_SPLIT = (isl.schedule_node_type.sequence, isl.schedule_node_type.set)
MAX_BUFFER_BYTES = 64 << 10  # a thread's private copy lives on its stack


def _path(schedule: isl.Schedule, statements: set[str]) -> list[isl.ScheduleNode]:
    """The bands on the way from the root to the deepest node above all `statements`."""
    node, bands = schedule.get_root(), []
    while True:
        kind = node.get_type()
        if kind == _BAND:
            bands.append(node)
        if kind in _SPLIT:
            holding = [i for i in range(node.n_children())
                       if statements <= statement_names(node.child(i).filter_get_filter())]
            if not holding:
                return bands
            node = node.child(holding[0])
        elif node.n_children() == 1:
            node = node.child(0)
        else:
            return bands


def _prefix(bands: list[isl.ScheduleNode], depth: int) -> isl.UnionMap:
    """Statement instance -> its first `depth` loop iterators along `bands`."""
    out, left = None, depth
    for band in bands:
        if left == 0:
            break
        n = band.band_n_member()
        sched = (band.band_split(left) if left < n else band).band_get_partial_schedule_union_map()
        out = sched if out is None else out.flat_range_product(sched)
        left -= min(left, n)
    return out


class _Prefixes:
    """`_prefix` maps of a kernel's schedule, kept between its local arrays: the arrays
    of one fused group sit under the same bands, asked about at the same depths."""

    def __init__(self):
        self._maps: list[tuple[list[isl.ScheduleNode], int, isl.UnionMap]] = []

    def of(self, bands: list[isl.ScheduleNode], depth: int) -> isl.UnionMap:
        for known, d, prefix in self._maps:
            if d == depth and len(known) == len(bands) \
                    and all(x.is_equal(y) for x, y in zip(known, bands)):
                return prefix
        prefix = _prefix(bands, depth)
        self._maps.append((bands, depth, prefix))
        return prefix


def _plan(accesses: isl.UnionMap, schedule: isl.Schedule, array: Array, prefixes: _Prefixes
          ) -> tuple[int, tuple[int, ...]]:
    """(D, dims kept) for one local array (`accesses`: the kernel's reads and writes);
    D = 0 when it cannot be contracted."""
    touching = accesses.intersect_range(
        isl.UnionSet.from_set(isl.Set.read_from_str(
            accesses.get_ctx(), f"{{ {array.c_name}[{', '.join(f'e{k}' for k in range(array.type.ndim))}] }}")))
    bands = _path(schedule, statement_names(touching.domain()))
    depth = sum(b.band_n_member() for b in bands)
    for d in range(depth, 0, -1):
        when = touching.reverse().apply_range(prefixes.of(bands, d))  # element -> iterations
        if not when.is_single_valued():
            continue
        iterations = when.range()
        if iterations.is_equal(iterations.lexmin()):
            # the outer loops run once: contracting under them saves nothing, and the
            # per-thread copies would break, since the parallel loops are then the
            # sibling nests inside, each with copies of its own
            return 0, tuple(range(array.type.ndim))
        kept = tuple(k for k in range(array.type.ndim) if array.type.shape[k] > 1
                     and not any(_pins(when, k, t) for t in range(d)))
        return d, kept
    return 0, tuple(range(array.type.ndim))


def _pins(when: isl.UnionMap, k: int, t: int) -> bool:
    """Is loop `t` always at index `k` of the element it touches?"""
    maps: list[isl.Map] = []
    when.foreach_map(maps.append)
    return all(m.order_lt(isl.dim_type.in_, k, isl.dim_type.out, t).is_empty()
               and m.order_gt(isl.dim_type.in_, k, isl.dim_type.out, t).is_empty() for m in maps)


def contract_arrays(kernel: Kernel, model: PolyModel, schedule: isl.Schedule) -> Kernel:
    """Shrink the kernel's local arrays to per-iteration buffers where isl proves it safe.

    Before: local exp: float32[4096,4096] allocated whole. After: exp kept dims (1,),
    a buffer of 4096 floats.
    """
    arrays = []
    accesses, prefixes = model.reads.union(model.writes), _Prefixes()
    for a in kernel.arrays:
        if a.role == "local" and a.block is None:  # a block buffer is one already
            depth, kept = _plan(accesses, schedule, a, prefixes)
            element = a.type.itemsize
            size = element * math.prod(a.type.shape[k] for k in kept)
            if depth > 0 and size <= MAX_BUFFER_BYTES:
                a = replace(a, kept=kept)
        arrays.append(a)
    return replace(kernel, arrays=tuple(arrays))

