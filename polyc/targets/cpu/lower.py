"""CPU target lowering: which loops run in parallel (OpenMP threads) and which vectorise.

Both decisions are marks inserted into the schedule tree, so they show in the printed
tree and the browser view, and codegen only has to translate them:

- `parallel` above the outermost band on each path whose first member is coincident,
  when the work below it is large enough to pay for waking the thread team. When that
  band's first member carries a dependence (a sum over rows, `s[j] += x[i, j]`) but a
  loop further in has the same value at both ends of every dependence of the nest, that
  loop is cut into one block per thread (the compile option, else the target's cores)
  and the block loop put outermost, in parallel: each thread sums its own columns over
  all rows (a column sum of 8192x8192 at 2 threads: 15 -> 20 GB/s; run on one thread,
  the two blocks cost it a fifth, so one thread asked for gets no blocks);
- `parallel` and `partials ARRAYS` above such a band whose first member carries only
  reductions into single elements (a full sum or max, `s += x[i, j]`): each thread
  reduces its rows into its own copy of those elements, combined after the loop in
  thread order (the same result on every run with the same team);
- on the last loop of an innermost band (the band is split so the mark sits on exactly
  that loop): `simd` when the loop carries no dependence, `reduce` when every dependence
  it carries is a float reduction statement's on itself, whose partial results may be
  combined in any order (sum, max, ...), so the loop vectorises with one accumulator
  per lane. Both are decided with isl on the dependences and the schedule;
- `stream` above a `simd` loop whose one statement writes an output array that fills at
  least half the last cache level, one element after the other, and that nothing in the
  kernel reads back: non-temporal stores write it without first reading every line into
  the cache (a third of a streaming kernel's memory traffic), and without evicting the
  kernel's inputs. isl proves the unit stride on the access relation and the schedule.
"""
from __future__ import annotations

import math

import islpy as isl

from ...kernel import Kernel
from ...kernel.comprehension import loads
from ...machine import Machine
from ...schedule_tree import marks
from ...schedule_tree.interchange import access_moves, step_pairs, unit_step
from ...schedule_tree.loops import carried, equal_at, inner_loop_kind
from ...schedule_tree.model import PolyModel, statement_names
from ...schedule_tree.state import KernelState, Pass

MIN_PARALLEL_INSTANCES = 1 << 15

_BAND, _LEAF = isl.schedule_node_type.band, isl.schedule_node_type.leaf


def _instances(node: isl.ScheduleNode, sizes: dict[str, int]) -> int:
    """Statement instances below `node`, counting each statement whole."""
    return sum(sizes[n] for n in statement_names(node.get_domain()))


def _runs_once(band: isl.ScheduleNode) -> bool:
    """Does the first member of `band` take a single value over its domain?"""
    upa = band.band_get_partial_schedule().get_union_pw_aff(0)
    values = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(band.get_domain()).range()
    return values.n_set() == 1 and values.as_set().count_val().to_python() == 1


def _below_mark(node: isl.ScheduleNode, *kinds: type[marks.Mark]) -> bool:
    return (node.has_parent() and node.parent().get_type() == isl.schedule_node_type.mark
            and marks.word(node.parent().mark_get_id().get_name()) in {k.word for k in kinds})


def _streams(loop: isl.ScheduleNode, kernel: Kernel, writes: isl.UnionMap,
             min_bytes: int) -> bool:
    """Should the one-member band `loop` store its output with non-temporal stores (see
    the module doc)? The other statements of the loop may only write locals."""
    sets: dict[str, isl.Set] = {}
    loop.get_domain().foreach_set(lambda d: sets.__setitem__(d.get_tuple_name(), d))
    outs = [s for s in kernel.statements
            if s.name in sets and kernel.array(s.target).role != "local"]
    if len(outs) != 1:
        return False
    s = outs[0]
    a = kernel.array(s.target)
    if s.reduce is not None or a.type.nbytes < min_bytes or any(
            load.tensor == s.target for t in kernel.statements for load, _ in loads(t.expr)):
        return False
    # consecutive iterations of the loop, all outer loops fixed, write consecutive elements
    moves = access_moves(step_pairs(loop, 0, isl.UnionSet(sets[s.name])), writes)
    return not moves.is_empty() and moves.is_equal(
        unit_step(loop.get_ctx(), a.c_name, len(a.type.shape)))

def _has_mark(node: isl.ScheduleNode) -> bool:
    return node.get_type() == isl.schedule_node_type.mark or any(
        _has_mark(node.child(i)) for i in range(node.n_children()))


def _blocks_outside(band: isl.ScheduleNode, deps: isl.UnionMap,
                    threads: int) -> isl.MultiUnionPwAff | None:
    """The block loop to put above `band` (see the module doc), or None: the first
    member, in the chain of single-child bands from `band` in, that every dependence
    among their statements keeps equal, cut into `threads` blocks of whole vectors."""
    if _has_mark(band):
        return None  # a microkernel's nest has its own loops and threads
    domain = band.get_domain()
    deps = deps.intersect_domain(domain).intersect_range(domain)
    node = band
    while node.get_type() == _BAND and node.n_children() == 1:
        partial = node.band_get_partial_schedule()
        for m in range(node.band_n_member()):
            upa = partial.get_union_pw_aff(m)
            if not equal_at(deps, isl.MultiUnionPwAff.from_union_pw_aff(upa)).is_equal(deps):
                continue
            u = isl.UnionMap.from_union_pw_aff(upa)
            values = u.intersect_domain(domain).range()
            if values.n_set() != 1:
                continue
            n = values.as_set().count_val().to_python()
            width = (-(-n // threads) + 15) // 16 * 16
            if n < 2 * 16 or width >= n:
                return None
            return isl.MultiUnionPwAff.from_union_pw_aff(
                upa.scale_down_val(isl.Val.int_from_si(band.get_ctx(), width)).floor())
        node = node.child(0)
    return None


def _reductions_across(band: isl.ScheduleNode, deps: isl.UnionMap, kernel: Kernel) -> list[str]:
    """The arrays of one element each that every dependence the first member of `band`
    carries reduces into (a reduction statement's on itself), or [] if it carries others."""
    first = isl.MultiUnionPwAff.from_union_pw_aff(
        band.band_get_partial_schedule().get_union_pw_aff(0))
    across = carried(band, first, deps)
    by_name = {s.name: s for s in kernel.statements}
    targets: list[str] = []
    maps = across.get_map_list()
    for m in (maps.get_at(i) for i in range(maps.n_map())):
        src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        s = by_name[src]
        a = kernel.array(s.target)
        if src != dst or s.reduce is None or a.type.size != 1:
            return []
        if a.c_name not in targets:
            targets.append(a.c_name)
    return targets


def mark_cpu_loops(schedule: isl.Schedule, kernel: Kernel, model: PolyModel, machine: Machine,
                   *, parallel: bool = True, threads: int = 0) -> isl.Schedule:
    """Insert `parallel`, `simd`, `reduce` and `stream` marks (see the module docstring);
    `threads` is the team the code will run with (0: OMP_NUM_THREADS, blocked for one
    thread per core); a team asked for is fixed on every parallel loop
    (`parallel threads=N`)."""
    team = threads
    parallel = parallel and threads != 1  # a team of one: no team
    threads = threads or machine.cores
    statements, dependences = kernel.statements, model.dependences
    sizes = {s.name: math.prod(s.extents) for s in statements}
    by_name = {s.name: s for s in statements}
    stream_bytes = machine.role("block").capacity // 2

    def loop_marks(loop: isl.ScheduleNode, kind: marks.Mark) -> list[marks.Mark]:
        stream = isinstance(kind, marks.Simd) and _streams(loop, kernel, model.writes,
                                                          stream_bytes)
        return [kind] + [marks.Stream()] * stream

    def insert(node: isl.ScheduleNode, found: list[marks.Mark]) -> isl.ScheduleNode:
        for mark in found:
            node = node.insert_mark(isl.Id(str(mark))).child(0)
        return node

    def visit(node: isl.ScheduleNode, in_band: bool) -> isl.ScheduleNode:
        if _below_mark(node, marks.Gemm, marks.Winograd):
            in_band = True  # a gemm's nest has its own threads (`Gemm.par`)
        if node.get_type() == _BAND and _runs_once(node):
            # a loop of one iteration (a dim of size 1) is dropped by the AST build, and
            # the marks above it would land on the loops below it, which may carry
            # dependences it did not (a parallel reduction): it gets none, the band
            # below it is marked as if it came first
            if node.band_n_member() > 1:
                node = node.band_split(1)
            return visit(node.child(0), in_band).parent()
        inserted = 0
        if (parallel and threads > 1 and not in_band and node.get_type() == _BAND
                and not node.band_member_get_coincident(0)
                and _instances(node, sizes) >= MIN_PARALLEL_INSTANCES):
            blocks = _blocks_outside(node, dependences, threads)
            if blocks is not None:
                node = node.insert_partial_schedule(blocks).band_member_set_coincident(0, True)
        if node.get_type() == _BAND and not _below_mark(node, marks.Simd, marks.Reduce,
                                                        marks.Stream):
            n = node.band_n_member()
            inner = inner_loop_kind(node, dependences, by_name)
            if inner and n > 1:
                node = node.band_split(n - 1)
                last = node.child(0)
                found = loop_marks(last, inner)
                node = insert(last, found)
                for _ in range(len(found) + 1):
                    node = node.parent()
                inner = None
            found = loop_marks(node, inner) if inner else []
            if (parallel and not in_band and _instances(node, sizes) >= MIN_PARALLEL_INSTANCES):
                if node.band_member_get_coincident(0):
                    found += [marks.Parallel(team)]
                elif threads > 1 and (partial := _reductions_across(node, dependences, kernel)):
                    found += [marks.Parallel(team), marks.Partials(tuple(partial))]
            node = insert(node, found)
            inserted = len(found)
            in_band = True
        for i in range(node.n_children()):
            node = visit(node.child(i), in_band).parent()
        for _ in range(inserted):
            node = node.parent()
        return node

    return visit(schedule.get_root(), False).get_schedule()


def lower_pass(state: KernelState, machine: Machine, options) -> KernelState:
    return state.with_schedule(mark_cpu_loops(state.schedule, state.kernel, state.model, machine,
                                              parallel=options.parallel, threads=options.threads))


LOWER = Pass("lower-cpu", lower_pass, changes_schedule=True)
