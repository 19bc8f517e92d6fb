"""The cpu target: the host CPU, C with OpenMP and SIMD built by gcc, run through ctypes.

Its passes after the neutral ones:

    microkernels  contractions onto the BLIS-shaped nest of a gemm microkernel, row
                  reductions onto row kernels (`trees.py`, planned by `plan.py`)
    tile          permutable bands tiled to fit L1 (`tiling`)
    contract      intermediates into per-thread buffers
    recompute     what no buffer holds is recomputed where read
    lower-cpu     parallel / simd / reduce / stream marks (`lower.py`)

then `builder.py` turns the marked tree into C (`emit/` for the microkernel marks).
"""
from __future__ import annotations

import json

import islpy as isl

from ...codegen.runtime import Program
from ...microkernels import registry
from ...schedule_tree import marks
from ...schedule_tree.passes import CONTRACT, RECOMPUTE
from ...tiling.tile import TILE
from ..backend import Backend
from . import tuning
from .builder import CpuBuilder
from .lower import LOWER
from .machine import cpu_machine, cpu_toolchain, host_can_run, host_cpu
from .options import CpuOptions
from .plan import measured, microkernel_name, plan_view
from .prelude import PRELUDE
from .trees import MICROKERNELS


class CpuBackend(Backend):
    name = "cpu"
    options_type = CpuOptions
    tunable = True

    def machine(self):
        return cpu_machine()

    def microkernels(self, machine, options):
        return lambda kernel, min_flops: microkernel_name(kernel, machine, min_flops,
                                                          options.tail_contraction)

    def passes(self):
        return (MICROKERNELS, TILE, CONTRACT, RECOMPUTE, LOWER)

    def codegen(self, state, machine, options):
        # a gemm nest's tile origins are read off the loop iterators: isl must not scale
        # a strided loop (16*i2) down to its quotient (i2) there; elsewhere isl's default
        # (set either way: the context may be the compile's, shared by its kernels)
        gemms = state.marks(marks.Gemm)
        state.schedule.get_ctx().set_ast_build_scale_strides(0 if gemms else 1)
        # a symbolic kernel's symbols are isl parameters: the AST knows their ranges
        build = isl.AstBuild.from_context(state.model.domain.params())
        builder = CpuBuilder(state.kernel, state.promotions)
        schedule = without_tile_statements(state.schedule, state.kernel, gemms)
        for plan in state.marks(marks.Winograd):
            # the emitter computes every statement below its mark in blocks: isl builds
            # one point of the contraction there, for the mark's place
            schedule = schedule.intersect_domain(first_point(state.kernel, plan.stmt, schedule))
        ast = build.node_from_schedule(schedule)
        return str(builder.function(ast)), buffer_report(builder)

    def prelude(self, machine):
        return PRELUDE

    def toolchain(self, machine):
        return cpu_toolchain(machine)

    def program(self, graph, kernels, so_path, machine, options):
        return Program(graph, kernels, so_path)

    def key_parts(self, machine):
        # -march=native code depends on the host; `polyc tune` changes tiles
        return (host_cpu(), tuning.fingerprint())

    def prepare(self, machine):
        # the kernel calibration, measured once here: the workers read its file
        return {"calibration": json.dumps({"in cache": measured(machine),
                                           "streaming": measured(machine, True)}, sort_keys=True)}


def without_tile_statements(schedule: isl.Schedule, kernel, gemms: list[marks.Gemm]
                            ) -> isl.Schedule:
    """The schedule without the init and epilogue statements of its `gemms` marks: the
    microkernel's write-back applies them on each tile (`emit/`), no loop of the AST
    runs them, and isl's AST generation costs about as much per statement (linear+gelu:
    10 statements, 65 ms; the contraction alone, 14 ms). They are elementwise on C's
    box (`gemm_view`), so the contraction's own instances span the same tile loops.
    Below each `microkernel` mark only a tile's first row at its K block's first step
    is kept (`_tile_points`)."""
    views = {mark.stmt: (mark, plan_view(kernel, mark)) for mark in gemms}
    views |= {view.then.stmt.name: (mark, view.then) for mark, view in list(views.values())
              if view.then is not None}
    dropped = [s.name for _, view in views.values() for s in (view.init, *view.epilogue)]
    if not dropped:
        return schedule
    sets: list[isl.Set] = []
    schedule.get_domain().foreach_set(sets.append)
    keep = isl.UnionSet.empty(schedule.get_domain().get_space())
    for s in sets:
        if s.get_tuple_name() not in dropped:
            keep = keep.union(isl.UnionSet.from_set(s))
    return _tile_points(schedule.intersect_domain(keep), views)


def first_point(kernel, stmt: str, schedule: isl.Schedule) -> isl.UnionSet:
    s = next(s for s in kernel.statements if s.name == stmt)
    return isl.UnionSet.read_from_str(schedule.get_ctx(),
                                      f"{{ {stmt}[{', '.join(['0'] * len(s.extents))}] }}")


def _tile_points(schedule: isl.Schedule, views: dict) -> isl.Schedule:
    """`schedule` with a filter below each `microkernel` mark keeping the tile's first
    row at its K block's first step. The emitter reads a tile off the loops around the
    mark and calls the kernel; the loops isl would build inside it, over every point of
    the tile and every K step, were 22 of conv2d's 54 ms of codegen, and built for
    nothing. The filter keeps an instance in every tile that has one (a tile's first
    row and a block's first K step always exist), so the loops outside are the same."""
    def unfiltered(node: isl.ScheduleNode) -> isl.ScheduleNode | None:
        if (node.get_type() == isl.schedule_node_type.mark
                and marks.word(node.mark_get_id().get_name()) == marks.Microkernel.word
                and node.child(0).get_type() != isl.schedule_node_type.filter):
            return node
        for i in range(node.n_children()):
            if (found := unfiltered(node.child(i))) is not None:
                return found
        return None

    while (node := unfiltered(schedule.get_root())) is not None:
        mark, view = views[marks.parse(node.mark_get_id().get_name()).stmt]
        s0 = view.stmt
        depth = " + ".join(f"{w}*{s0.iter_name(p)}" for p, w in view.red_strides().items())
        iters = ", ".join(s0.iter_name(d) for d in range(len(s0.extents)))
        if s0.name == mark.stmt:
            rows = " + ".join(f"{w}*{view.out_name(s0, d)}"
                              for d, w in view.strides(view.rows).items())
            condition = (f"({rows}) mod {registry.by_name(mark.kernel).mr} = 0 and "
                         f"({depth or '0'}) mod {mark.tiles.kc} = 0")
        else:  # the row tail's contraction: one point per row block, which its tiles cover
            row = view.out_name(s0, view.rows[-1])  # C's row (its batch dims may be rows here)
            cols = " + ".join(view.out_name(s0, d) for d in view.cols)
            condition = f"{row} mod {mark.mc} = 0 and {cols} = 0 and {depth} = 0"
        first = isl.UnionSet.read_from_str(
            schedule.get_ctx(), f"{{ {s0.name}[{iters}] : {condition} }}")
        schedule = node.child(0).insert_filter(first).get_schedule()
    return schedule


def buffer_report(builder: CpuBuilder) -> tuple[str, ...]:
    """Where each local of the kernel lives, as the builder made it."""
    lines = []
    for a in builder.kernel.arrays:
        if a in builder.unstored and a.tensor in builder.microkernels.winograd_results:
            lines.append(f"{a.tensor} ({a.type}) is not materialised in memory: Winograd's "
                         "transforms compute it block by block, a block's output rows a "
                         "channel at a time in scratch, where its consumers read it")
        elif a in builder.unstored:
            where = ("with the partial sums of its K blocks in scratch"
                     if a.tensor in builder.microkernels.partial_sums
                     else "in registers until its consumers are applied at the write-back")
            lines.append(f"{a.tensor} ({a.type}) is not materialised in memory: the "
                         f"microkernel computes it tile by tile, {where}")
        elif a.kept is not None:
            shape = "x".join(map(str, a.buffer_shape)) or "1"
            lines.append(f"{a.tensor} ({a.type}) is not materialised in memory: a buffer of "
                         f"{shape} element(s) per thread holds it")
        elif a.block is not None:
            lines.append(f"{a.tensor} ({a.type}) is not materialised in memory: a block of "
                         f"{a.block[1]} rows at a time, in scratch (one per thread unless a "
                         "team shares the block)")
        elif a.role == "local":
            lines.append(f"{a.tensor} ({a.type}) stays inside the kernel but could not be "
                         "contracted: it is materialised whole in scratch memory")
    return tuple(lines)


__all__ = ["CpuBackend", "CpuOptions", "cpu_machine", "host_can_run"]
