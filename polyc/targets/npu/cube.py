"""Contractions on the NPU's cube: a C block accumulates in L0C over the whole K loop,
A and B come GM -> L1 as fractal matrices and L1 -> L0A / L0B a K step at a time, and
the epilogue runs on the vector unit over rows of the block in the unified buffer.

A contraction (`analysis.gemm_view`) whose operands are plain row-major loads, both of
float16 (under the casts `graph.storage` puts around them: the cube takes float16 at
full rate, so the casts are not computed) or both of float32 (a quarter of the rate),
gets this tree:

    mark "gemm S0 cube_16x16x16 m=.. n=.. k=.. mc=MB nc=NB kc=KB ..."
      band [(batch * bi + floor(i/MB)) * bj + floor(j/NB)]     C blocks, dealt to the cores
        mark "tile L0C block"    C in L0C
          sequence
            filter {init, S0}
              band [KB*floor(k/KB)]
                mark "tile L1 k"       A's MB x KB and B's KB x NB in L1 (A's whole
                                       panel, when it fits, one step per slot)
                  band [K0*floor(k/K0)]
                    mark "tile L0 k0"    A's MB x K0 in L0A, B's K0 x NB in L0B
                      mark "microkernel cube_16x16x16 S0"  -> [i, j, k]: one mma
            filter {epilogue}
              band [R*floor(i/R)]
                mark "tile UB rows"    C's R x NB from L0C, what the epilogue reads and
                  band [i, j]          writes, in UB
                    sequence [epilogue statements, in order at each point]

Every copy is a promotion of the tree (`promotion.py`): its footprint per tile computed
with isl from the access relations. Operands in L1 and L0 have the fractal layout of
the cube (`FRACTAL`: 16 x 16 blocks, zero-padded to whole blocks at an edge), an isl map
from the tile's box to the buffer; the copies convert, no pass over GM does. The init
statement is the first K step's mma (it overwrites L0C instead of adding); C reaches the
vector unit through the L0C -> UB copy, converted back to rows. A contraction whose
result is an output with no epilogue gets one, a copy (`with_store`): C leaves through
the unified buffer.

The sizes come from the cycle model: candidates (MB, NB, KB, K0, R, A's panel whole or
per step) that fit every level by their byte counts are ordered by estimated cycles
(`estimate`: the busiest unit per block), and the first whose promotions, sized by isl,
fit every level is taken; double buffers for everything copied each step, the panel and
L0C when they fit twice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import islpy as isl

from ...kernel import Array, Kernel
from ...kernel.comprehension import Call, Load, Statement, identity, loads
from ...machine import Machine
from ...microkernels.analysis import GemmView, gemm_view, plain_operands
from ...schedule_tree import marks, text
from ...schedule_tree.contract import contract_arrays
from ...schedule_tree.promotion import Promotion, find, promote
from ...schedule_tree.state import KernelState, Pass
from ..scratchpad.builder import body_ops
from ..scratchpad.tiles import promotions_at, scratch_bytes
from .machine import (FRACTAL, GM_BYTES_PER_CYCLE, GM_LATENCY, L1_BYTES_PER_CYCLE,
                      MMA_CYCLES, VECTOR_LANES)

KERNEL = "cube_16x16x16"
MIN_FLOPS = 2 * FRACTAL ** 3 * 8  # below a few blocks the vector unit does it
MAX_PLANS = 12  # candidates sized by isl, fewest estimated cycles first
SIZES = (16, 32, 64, 128, 192, 256, 384, 512)
STEPS = (16, 32, 64, 128, 256)
VECTOR_COST = {"tanh": 4, "sigmoid": 3, "erf": 8, "pow": 3}  # ops a vector op takes


def cube_dtype(kernel: Kernel) -> str | None:
    """The operand type the cube computes a kernel's contraction in ('float16' or
    'float32'), or None when it cannot: the cube takes plain loads (both float16, or
    both float32), a zero init, and operands no epilogue statement reads."""
    view = gemm_view(kernel)
    if view is None or view.flops < MIN_FLOPS or (found := plain_operands(view)) is None:
        return None
    a, b = found
    converted = [isinstance(e, Call) for e in (view.a_expr, view.b_expr)]
    if a.dtype == b.dtype == "float16" and all(converted):
        dtype = "float16"  # the casts to float32 are exact: the cube takes float16 as is
    elif a.dtype == b.dtype == "float32" and not any(converted):
        dtype = "float32"
    else:
        return None
    if getattr(view.init.expr, "value", None) != 0:
        return None
    if any(ld.tensor in (a.tensor, b.tensor) for e in view.epilogue for ld, _ in loads(e.expr)):
        return None
    return dtype


def microkernel_name(kernel: Kernel, min_flops: int = 0) -> str | None:
    """The fusion oracle's question: the contraction the cube would compute."""
    view = gemm_view(kernel)
    if view is None or view.flops < min_flops or cube_dtype(kernel) is None:
        return None
    return KERNEL


@dataclass(frozen=True)
class Plan:
    mb: int  # C block rows (L0C)
    nb: int  # C block columns
    kb: int  # K step of the L1 copies
    k0: int  # K step of the L0 copies (one mma)
    rows: int  # epilogue rows per UB tile
    whole: bool  # A's MB x K panel stays in L1 across the blocks of a row
    l0c_double: bool  # two C blocks in L0C

    def __str__(self) -> str:
        panel = "A's panel whole in L1" if self.whole else "A in L1 per K step"
        blocks = "two C blocks" if self.l0c_double else "C blocks"
        return (f"{blocks} of {self.mb}x{self.nb} in L0C, K steps of {self.kb} in L1 and "
                f"{self.k0} in L0, {panel}, epilogue rows of {self.rows} in UB")


def _up(n: int, m: int = FRACTAL) -> int:
    return -(-n // m) * m


def epilogue_ops(view: GemmView) -> int:
    return body_ops(list(view.epilogue), VECTOR_COST)


def estimate(view: GemmView, plan: Plan, dtype: str, cores: int, out_bytes: int) -> float:
    """Cycles of the contraction by the cycle model, as the busiest unit's work (the
    others overlap it: every copy is double-buffered).
    A's panel, when whole, is copied once per row of blocks and core; else A is copied
    for every block, and B for every row of blocks."""
    e = 2 if dtype == "float16" else 4
    bi, bj = math.ceil(view.M / plan.mb), math.ceil(view.N / plan.nb)
    cores = min(cores, view.batches * bi * bj)
    m, n, k = (_up(x) for x in (view.M, view.N, view.K))
    b = view.batches
    cube = b * (m // FRACTAL) * (n // FRACTAL) * (k // FRACTAL) * MMA_CYCLES[dtype] / cores
    a_bytes = b * view.M * view.K * e * (min(bj, cores) if plan.whole else bj)
    gm = (a_bytes + b * view.K * view.N * e * bi + b * view.M * view.N * out_bytes) \
        / GM_BYTES_PER_CYCLE
    mte1 = b * (m * k * bj + k * n * bi) * e / L1_BYTES_PER_CYCLE / cores
    vector = epilogue_ops(view) * b * m * n / VECTOR_LANES / cores
    fix = b * m * n * 4 / L1_BYTES_PER_CYCLE / cores
    # one C block in L0C: the cube waits for each block's last two rows of epilogue
    # (UB holds two) before it starts the next
    blocks = math.ceil(b * bi * bj / cores)
    drain = 0 if plan.l0c_double else (vector + fix) / blocks * min(1, 2 * plan.rows / plan.mb)
    # A's whole panel: a row starts when its first K step's part has arrived (the step
    # before, of the row before, is read to the end first)
    exposed = 0.0
    if plan.whole:
        rows = math.ceil(b * bi / cores)
        exposed = rows * (plan.mb * min(plan.kb, view.K) * e / GM_BYTES_PER_CYCLE + GM_LATENCY)
    # a K step's copies take the latency, their transfer and the copies to L0 (before
    # its buffer is free for the step after next): two steps are in flight at once
    step_bytes = (plan.kb * plan.nb + (0 if plan.whole else plan.mb * plan.kb)) * e
    steps = blocks * math.ceil(view.K / plan.kb)
    to_l0 = (plan.mb + plan.nb) * plan.kb * e / L1_BYTES_PER_CYCLE
    latency = steps * (GM_LATENCY + step_bytes / GM_BYTES_PER_CYCLE + to_l0) / 2
    return max(cube + blocks * drain + exposed, gm, mte1, vector, fix, latency)


def candidates(view: GemmView, dtype: str, cores: int, out_bytes: int,
               capacity: dict[str, int]) -> list[Plan]:
    """Plans whose buffers fit every level by their byte counts (double buffers
    counted; per element of C, UB holds C's float32 copy and the outputs' `out_bytes`),
    fewest estimated cycles first."""
    e = 2 if dtype == "float16" else 4
    mp, np_, kp = _up(view.M), _up(view.N), _up(view.K)
    found = []
    for mb in sorted({min(s, mp) for s in SIZES}):
        for nb in sorted({min(s, np_) for s in SIZES}):
            if mb * nb * 4 > capacity["L0C"]:
                continue
            double = 2 * mb * nb * 4 <= capacity["L0C"]
            for k0 in (s for s in STEPS if s <= max(kp, FRACTAL)):
                if mb * k0 * e * 2 > capacity["L0A"] or k0 * nb * e * 2 > capacity["L0B"]:
                    continue
                for kb in sorted({min(k0 << j, _up(kp, k0)) for j in range(6)}):
                    for whole in (True, False):
                        a_l1 = mb * (_up(kp, kb) if whole else 2 * kb) * e
                        if a_l1 + kb * nb * e * 2 > capacity["L1"]:
                            continue
                        for rows in (r for r in SIZES if r <= mb and mb % r == 0):
                            if rows * nb * (4 + out_bytes) * 2 > capacity["UB"]:
                                continue
                            plan = Plan(mb, nb, kb, k0, rows, whole, double)
                            found.append((estimate(view, plan, dtype, cores, out_bytes),
                                          plan))
    # the model leaves out what chains of small copies and calls cost: among estimates
    # within 3% of each other, the larger products per call and the longer K steps
    def key(c):
        cycles, p = c
        return (round(math.log(max(cycles, 1)) / math.log(1.03)), -p.mb * p.nb * p.k0,
                -p.kb, -p.rows, not p.l0c_double)
    return [c[-1] for c in sorted(found, key=key)]


def cube_tree(model, view: GemmView, mark: marks.Gemm, plan: Plan) -> isl.Schedule:
    """The tree of the module docstring."""
    s0, init, epi = view.stmt, view.init, view.epilogue
    red = s0.iter_name(view.red[0])
    row, col = view.rows[0], view.cols[0]
    both = (init, s0)

    def k_of(s):
        return red if s is s0 else "0"

    def out(d):
        return lambda s: view.out_name(s, d)

    def tile(level: str, name: str, child: str) -> str:
        return text.mark(marks.Tile(level, name), child)

    def each(stmts) -> str:
        return text.sequence(([s], None) for s in stmts)

    points = text.band([text.member(both, out(row)), text.member(both, out(col)),
                        text.member(both, k_of)], each(both), coincident=True)
    inner = text.mark(marks.Microkernel(KERNEL, s0.name), points)
    k0_band = text.band([text.member(both, lambda s: f"{plan.k0}*floor(({k_of(s)})/{plan.k0})")],
                        tile("L0", "k0", inner))
    k_band = text.band([text.member(both, lambda s: f"{plan.kb}*floor(({k_of(s)})/{plan.kb})")],
                       tile("L1", "k", k0_band))
    rows = text.band([text.member(epi, lambda s: f"{plan.rows}*floor(({view.out_name(s, row)})"
                                                 f"/{plan.rows})")],
                     tile("UB", "rows", text.band([text.member(epi, out(row)),
                                                   text.member(epi, out(col))],
                                                  each(epi), coincident=True)), coincident=True)
    tree = tile("L0C", "block", text.sequence([(both, k_band), (epi, rows)]))
    block = text.member((s0, init) + epi, lambda s: view.block_number(s, plan.mb, plan.nb))
    tree = text.mark(mark, text.band([block], tree, coincident=True))
    return isl.Schedule.read_from_str(model.domain.get_ctx(),
                                      f'{{ domain: "{model.domain}", child: {tree} }}')


def _promotions(state: KernelState, view: GemmView, schedule: isl.Schedule, plan: Plan):
    """The kernel with its buffers contracted on `schedule` and C kept whole, and the
    promotions of the module docstring."""
    kernel = contract_arrays(state.kernel, state.model, schedule)
    c = kernel.array(view.stmt.target)
    kernel = replace(kernel, arrays=tuple(replace(a, kept=None) if a is c else a
                                          for a in kernel.arrays))
    a_load, b_load = plain_operands(view)
    ctx = state.ctx
    block_at, k_at = str(marks.Tile("L0C", "block")), str(marks.Tile("L1", "k"))
    k0_at, rows_at = str(marks.Tile("L0", "k0")), str(marks.Tile("UB", "rows"))
    s0 = isl.UnionSet.read_from_str(ctx, f"{{ {text.decl(view.stmt)} }}")
    c_writes = text.access(view.stmt, view.stmt.index, c.c_name, ctx)
    block_node = find(schedule, block_at)
    # two C blocks in L0C: the cube starts the next while the last one drains to UB
    out = [replace(promote(block_node, c_writes, buffer=f"l0c_{c.c_name}", array=c.c_name,
                           level="L0C", direction="local", layout=f"fractal {FRACTAL}",
                           at=block_at), slots=2 if plan.l0c_double else 1)]
    steps = math.ceil(view.K / plan.kb)
    for side, load in (("a", a_load), ("b", b_load)):
        arr = kernel.array(load.tensor)
        access = text.access(view.stmt, load.index, arr.c_name, ctx).intersect_domain(s0)
        for level, node_at in (("L1", k_at), ("L0" + side.upper(), k0_at)):
            p = promote(find(schedule, node_at), access,
                        buffer=f"{level.lower()}_{side}_{arr.c_name}", array=arr.c_name,
                        level=level, direction="in", layout=f"fractal {FRACTAL}",
                        element_bytes=arr.type.itemsize, at=node_at)
            # A's whole panel: every K step in a buffer of its own, kept for the row
            out.append(replace(p, slots=steps, stepped=steps > 1)
                       if side == "a" and level == "L1" and plan.whole else p)
    rows = promotions_at(find(schedule, rows_at), kernel, state.model, "UB", rows_at,
                         written_before=frozenset({c.c_name}))
    return kernel, tuple(out) + rows


def level_bytes(promotions: tuple[Promotion, ...], kernel: Kernel, machine: Machine,
                double: bool) -> dict[str, int]:
    """Bytes each level's buffers take (contracted intermediates live in UB)."""
    out = {}
    for level in ("L1", "L0A", "L0B", "L0C", "UB"):
        mine = tuple(p for p in promotions if p.level == level)
        held = kernel if level == "UB" else replace(kernel, arrays=())
        out[level] = scratch_bytes(mine, held, double and level != "L0C",
                                   machine.level(level).alignment)
    return out


def with_store(kernel: Kernel, view: GemmView) -> Kernel:
    """`kernel` with its contraction into a local accumulator, copied to the output by
    an epilogue statement (C leaves the cube through the unified buffer)."""
    c = kernel.array(view.stmt.target)
    acc = Array(f"{c.tensor}.acc", f"{c.c_name}_acc", c.type, "local")
    s0 = view.stmt
    renamed = [replace(s, target=acc.tensor) if s in (view.init, s0) else s
               for s in kernel.statements]
    n = len(c.type.shape)
    store = Statement(f"{s0.name}_store", c.type.shape, c.tensor, identity(n),
                      Load(acc.tensor, identity(n), c.type.dtype), c.type.dtype, None, s0.origin)
    # right after the contraction: an epilogue that reads the output reads the store's
    at = kernel.statements.index(s0) + 1
    return replace(kernel, statements=(*renamed[:at], store, *renamed[at:]),
                   arrays=kernel.arrays + (acc,))


def cube_pass(state: KernelState, machine: Machine, options) -> KernelState:
    kernel = state.kernel
    if not options.uses_microkernels(kernel.name) or (dtype := cube_dtype(kernel)) is None:
        return state
    view = gemm_view(kernel)
    if not view.epilogue or kernel.array(view.stmt.target).role == "out":
        # an output read by an epilogue too: without the copy, the epilogue's rows in UB
        # were all that left the chip, and the output itself was never written
        return state.rewritten(with_store(kernel, view),
                               f"{view.stmt.target} is an output: the cube's result leaves "
                               "through the unified buffer, copied by an epilogue statement")
    capacity = {lv: machine.level(lv).capacity for lv in ("L1", "L0A", "L0B", "L0C", "UB")}
    out_bytes = sum(kernel.array(e.target).type.itemsize for e in view.epilogue
                    if kernel.array(e.target).role == "out")
    for plan in candidates(view, dtype, options.cores, out_bytes, capacity)[:MAX_PLANS]:
        mark = marks.Gemm(view.stmt.name, KERNEL, view.M, view.N, view.K, plan.mb, plan.nb,
                          plan.kb, "batch", options.cores, ("blocks", "k", "k0", "rows"),
                          "packed")
        schedule = cube_tree(state.model, view, mark, plan)
        kernel, promotions = _promotions(state, view, schedule, plan)
        need = level_bytes(promotions, kernel, machine, options.double_buffer)
        if all(need[lv] <= capacity[lv] for lv in capacity):
            break
    else:
        return state.note(f"contraction {view.stmt.name}: no plan fits the cube's buffers; "
                          "its loops run on the vector unit")
    used = ", ".join(f"{lv} {need[lv]} of {capacity[lv]}" for lv in capacity)
    lines = (f"contraction {view.stmt.name} ({view.batches}x {view.M}x{view.N}x{view.K}, "
             f"{dtype} operands) on the cube: {plan}; the fewest cycles the cycle model "
             f"estimates ({estimate(view, plan, dtype, options.cores, out_bytes):.0f}) "
             f"among the plans that fit (bytes: {used})",)
    return replace(state.with_schedule(schedule), kernel=kernel,
                   promotions=promotions).note(*lines, *map(str, promotions))


CUBE = Pass("cube", cube_pass, changes_schedule=True)
