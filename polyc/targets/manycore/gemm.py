"""Contractions on the many-core chip: C blocks in each core's LDM, the fixed-shape
64x64x32 kernel on them, A and B panels streamed in by DMA.

A contraction (`analysis.gemm_view`) whose operands are plain row-major loads (A[.., i, k]
and B[.., k, j], broadcast batch dims allowed) gets this tree:

    mark "gemm S0 mc_sgemm_64x64x32 m=.. n=.. k=.. mc=MB nc=NB kc=KB ..."
      band [(batch * bi + floor(i/MB)) * bj + floor(j/NB)]   the C blocks, dealt to the cores
        mark "tile LDM block"     C (and what the epilogue reads) promoted per block
          sequence [ init (i, j)
                     band [KB*floor(k/KB)]
                       mark "tile LDM k"    A's MB x KB and B's KB x NB panels per step
                         mark "microkernel mc_sgemm_64x64x32 S0"  -> band [i, j, k]
                     epilogue (i, j) ... ]

The block sizes come from the cycle model: the candidates MB, NB (multiples of 64) and
KB (of 32) are ordered by the estimated cycles of the whole contraction (blocks dealt in
rounds to the cores, each K step the longer of its kernel calls and its DMA at the
core's share of the channel), and the first whose promoted buffers all fit the LDM is
taken (twice each where DMA moves them: the next step's panels arrive while this one
computes, a finished block leaves while the next one computes). Buffers are padded to whole
kernel tiles, zero past the matrix edge, so every call is a full 64x64x32; the padding's
results are never put back. C never leaves the LDM unless it is an output; the epilogue
(bias, activation) runs on it in the LDM before the put.
"""
from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from ...kernel import Kernel
from ...kernel.comprehension import Load, loads
from ...machine import Machine
from ...microkernels.analysis import GemmView, gemm_view, plain_operands
from ...schedule_tree import marks, text
from ...schedule_tree.contract import contract_arrays
from ...schedule_tree.promotion import Promotion, find, promote
from ...schedule_tree.state import KernelState, Pass
from .machine import LDM_BYTES
from ..scratchpad.tiles import promotions_at, scratch_bytes

KERNEL = "mc_sgemm_64x64x32"
MR, NR, KR = 64, 64, 32
KERNEL_CYCLES = 16384
MIN_FLOPS = 2 * MR * NR * KR  # one call's worth at least
DMA_BYTES_PER_CYCLE, DMA_LATENCY = 32, 500
MAX_PLANS = 24  # block sizes tried, fewest estimated cycles first, before giving up


def operands_fit(view: GemmView) -> bool:
    """Can the DMA bring A and B in the kernel's layout: plain float32 loads
    (`analysis.plain_operands`), no conversion?"""
    return (plain_operands(view) is not None and isinstance(view.a_expr, Load)
            and isinstance(view.b_expr, Load)
            and view.a_expr.dtype == view.b_expr.dtype == "float32")


def microkernel_name(kernel: Kernel, min_flops: int = 0) -> str | None:
    """The fusion oracle's question: the contraction this target's kernel computes (its
    operands plain loads no epilogue statement reads: they live only as K panels)."""
    view = gemm_view(kernel)
    if view is None or view.flops < max(min_flops, MIN_FLOPS) or not operands_fit(view):
        return None
    operands = {view.a_expr.tensor, view.b_expr.tensor}
    if any(ld.tensor in operands for e in view.epilogue for ld, _ in loads(e.expr)):
        return None
    return KERNEL


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def estimate(view: GemmView, mb: int, nb: int, kb: int, cores: int) -> float:
    """Cycles of the contraction with MB x NB blocks and KB steps (the cycle model)."""
    blocks = view.batches * math.ceil(view.M / mb) * math.ceil(view.N / nb)
    busy = min(cores, blocks)
    share = DMA_BYTES_PER_CYCLE / busy
    calls = (mb // MR) * (nb // NR) * (kb // KR)
    dma = DMA_LATENCY + 4 * (mb * kb + kb * nb) / share
    step = max(calls * KERNEL_CYCLES, dma)
    block = math.ceil(view.K / kb) * step + DMA_LATENCY + 4 * mb * nb / share
    return math.ceil(blocks / busy) * block


def block_candidates(view: GemmView, cores: int) -> list[tuple[int, int, int]]:
    """(MB, NB, KB), fewest estimated cycles first, among the blocks whose C and panels
    alone fit the LDM twice (what else a block holds is counted when it is promoted)."""
    found = []
    m_max, n_max, k_max = _up(view.M, MR), _up(view.N, NR), _up(view.K, KR)
    for mb in range(MR, min(m_max, 512) + 1, MR):
        for nb in range(NR, min(n_max, 512) + 1, NR):
            for kb in (32, 64, 128, 256):
                if kb > max(k_max, KR) or 4 * 2 * (mb * nb + mb * kb + kb * nb) > LDM_BYTES:
                    continue
                found.append((estimate(view, mb, nb, kb, cores), -mb * nb, kb, (mb, nb, kb)))
    return [c[-1] for c in sorted(found)]


def gemm_tree(model, view: GemmView, plan: marks.Gemm) -> isl.Schedule:
    """The tree of the module docstring."""
    s0 = view.stmt
    everyone = (s0, view.init) + view.epilogue
    kb = plan.kc

    def points(stmts, red: bool) -> str:
        members = [text.member(stmts, lambda s: view.out_name(s, d))
                   for d in view.rows + view.cols]
        if red:
            members.append(text.member([s0], lambda s: s.iter_name(view.red[0])))
        # the epilogue's statements share their loops, in order at each point: what one
        # passes to the next is then a scalar
        order = None if len(stmts) == 1 else text.sequence(([s], None) for s in stmts)
        return text.band(members, order, coincident=True)

    k_band = text.band([text.member([s0], lambda s: f"{kb}*floor(({s.iter_name(view.red[0])})/{kb})")],
                       text.mark(marks.Tile("LDM", "k"),
                                 text.mark(marks.Microkernel(KERNEL, s0.name), points([s0], True))))
    parts = [([view.init], points([view.init], False)), ([s0], k_band)]
    if view.epilogue:
        parts.append((view.epilogue, points(view.epilogue, False)))
    tree = text.mark(marks.Tile("LDM", "block"), text.sequence(parts))
    # one loop over the blocks, batch dims and rows and columns of blocks flattened, so
    # that every block, not just every row of blocks, is a core's to take
    block = text.member(everyone, lambda s: view.block_number(s, plan.mc, plan.nc))
    tree = text.mark(plan, text.band([block], tree, coincident=True))
    return isl.Schedule.read_from_str(model.domain.get_ctx(),
                                      f'{{ domain: "{model.domain}", child: {tree} }}')


def microkernels_pass(state: KernelState, machine: Machine, options) -> KernelState:
    kernel = state.kernel
    if not options.uses_microkernels(kernel.name) or microkernel_name(kernel) is None:
        return state
    view = gemm_view(kernel)
    capacity = machine.tile_level.capacity
    for tried, (mb, nb, kb) in enumerate(block_candidates(view, options.cores)):
        plan = marks.Gemm(view.stmt.name, KERNEL, view.M, view.N, view.K, mb, nb, kb, "batch",
                          options.cores, ("blocks", "k"), "packed")
        schedule = gemm_tree(state.model, view, plan)
        kernel, promotions = _promotions(state, view, schedule, machine.tile_level.name)
        need = scratch_bytes(promotions, kernel, options.double_buffer,
                             machine.tile_level.alignment)
        if need <= capacity:
            break
        if tried == MAX_PLANS:
            return state  # nothing fits: the contraction's plain loops are tiled instead
    else:
        return state
    lines = (f"contraction {view.stmt.name} ({view.batches}x {view.M}x{view.N}x{view.K}) on "
             f"{KERNEL}: C blocks of {mb}x{nb}, K steps of {kb}: the fewest cycles the cycle "
             f"model estimates ({estimate(view, mb, nb, kb, options.cores):.0f}) among the "
             f"blocks whose buffers fit the LDM ({need} of {capacity} bytes)",)
    return replace(state.with_schedule(schedule), kernel=kernel,
                   promotions=promotions).note(*lines, *map(str, promotions))


def _in_place(view: GemmView, kernel: Kernel, block) -> "Promotion | None":
    """The promotion of the epilogue's output when it may take C's buffer: C stays in the
    LDM (local), the epilogue's statements run one point at a time (`gemm_tree`) and
    read C only at their own point, so each element of C is read before the output's
    element overwrites it."""
    c = kernel.array(view.stmt.target)
    outs = [e for e in view.epilogue if kernel.array(e.target).role == "out"]
    if c.role != "local" or len(outs) != 1 or any(
            ld.tensor == c.tensor and ld.index != e.index
            for e in view.epilogue for ld, _ in loads(e.expr)):
        return None
    out = kernel.array(outs[0].target)
    return next((p for p in block if p.array == out.c_name and p.direction == "out"), None)


def _promotions(state: KernelState, view: GemmView, schedule: isl.Schedule, level: str):
    """The kernel with its buffers contracted on `schedule`, C kept whole in the LDM, and
    the promotions: C and what the epilogue touches per block, A and B per K step."""
    kernel = contract_arrays(state.kernel, state.model, schedule)
    c = kernel.array(view.stmt.target)
    kernel = replace(kernel, arrays=tuple(replace(a, kept=None) if a is c else a
                                          for a in kernel.arrays))  # the kernel's C
    operands = frozenset(kernel.array(x.tensor).c_name for x in (view.a_expr, view.b_expr))
    block_at, k_at = str(marks.Tile(level, "block")), str(marks.Tile(level, "k"))
    block = promotions_at(find(schedule, block_at), kernel, state.model, level, block_at,
                          skip=operands)
    nbatch = len(view.out_iter) - 2
    pad = (1,) * nbatch + (MR, NR)
    block = tuple(replace(p, pad=pad) if p.array == c.c_name else p for p in block)
    if (owner := _in_place(view, kernel, block)) is not None:  # the epilogue writes over C
        block = tuple(replace(p, pad=pad, also=(c.c_name,)) if p is owner else p
                      for p in block if p.array != c.c_name)
    k_node = find(schedule, k_at)
    s0 = isl.UnionSet.read_from_str(state.ctx, f"{{ {text.decl(view.stmt)} }}")
    steps = []
    for side, x, pad in (("a", view.a_expr, (MR, KR)), ("b", view.b_expr, (KR, NR))):
        a = kernel.array(x.tensor)
        load = view.a_expr if side == "a" else view.b_expr
        access = text.access(view.stmt, load.index, a.c_name, state.ctx).intersect_domain(s0)
        steps.append(promote(k_node, access, buffer=f"ldmk_{side}_{a.c_name}", array=a.c_name,
                             level=level, direction="in", at=k_at,
                             pad=(1,) * (a.type.ndim - 2) + pad))
    return kernel, block + tuple(steps)


MICROKERNELS = Pass("microkernels", microkernels_pass, changes_schedule=True)
