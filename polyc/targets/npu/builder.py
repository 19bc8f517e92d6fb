"""The NPU target's C builder: `scratchpad.builder` on the runtime's names, with the
copies between the levels and the cube's calls.

The runtime times every operation by what it reads and writes (a scoreboard: copies and
compute overlap whenever they touch different buffers), so the code is written in
program order and double buffering is only a matter of buffers: a promotion copied each
tile has two, `slot_<buffer>` flips at each copy in, and the copy of the next tile can
run while this one computes from the other. An input whose box is the one its buffer
holds already is not copied again: A's panel stays in L1 across the blocks of a row, one
buffer per K step (`slots`), so the next row's steps arrive as this row's are done.

Copies by the levels they join:
    GM -> UB (a box)          polyc_npu_copy_in          UB -> GM  polyc_npu_copy_out
    GM -> L1 (fractal)        polyc_npu_copy_in_nz       the rows and columns of the box
    L1 -> L0A / L0B           polyc_npu_load_l0          the tile's blocks of the L1 matrix
    L0C -> UB (rows)          polyc_npu_l0c_to_ub        C's rows for the epilogue
The `microkernel cube_16x16x16` mark is one `polyc_npu_mma` of the blocks the L0 buffers
hold (its loops are not emitted; the first K step overwrites L0C, which is the init).
After every innermost loop the vector unit is charged its ops (64 lanes a cycle) for
`simd` / `reduce` loops, the scalar unit's for the others, with the buffers the loop
reads and writes.
"""
from __future__ import annotations

import math

import cgen
import islpy as isl

from ...codegen.ast_to_c import if_, user_calls
from ...kernel.comprehension import Statement, loads
from ...microkernels.analysis import gemm_view
from ...schedule_tree import marks as mk
from ...schedule_tree.promotion import Promotion, layout_map
from ..scratchpad.builder import Runtime, ScratchpadBuilder, statement_ops
from .cube import KERNEL, VECTOR_COST
from .machine import VECTOR_LANES

RUNTIME = Runtime(core="polyc_npu_core", run="polyc_npu_run", handle="polyc_gm",
                  core_id="polyc_npu_id", core_count="polyc_npu_count", wrap="polyc_gm_wrap",
                  scratch="polyc_gm_alloc", launch="polyc_npu_launch", get="polyc_npu_copy_in",
                  put="polyc_npu_copy_out")
DTYPE = {2: "POLYC_NPU_F16", 4: "POLYC_NPU_F32"}


def grid(p: Promotion, extent: str) -> str:
    """C for the blocks of the fractal layout an extent of `p`'s last dims takes (isl's
    layout map gives the block edge)."""
    edge = layout_map(p).range().dim_max_val(len(p.box)).to_python() + 1
    return f"((({extent}) + {edge - 1}) / {edge})"


class NpuBuilder(ScratchpadBuilder):
    runtime = RUNTIME
    cost = VECTOR_COST
    lanes = VECTOR_LANES

    def __init__(self, kernel, promotions, double: bool):
        super().__init__(kernel, promotions, double)
        for p in promotions:
            if self.buffers_of(p) > 1:
                self.slot[p.buffer] = f"slot_{p.buffer}"
        view = gemm_view(kernel) if any(p.level == "L0C" for p in promotions) else None
        self.c_array = kernel.array(view.stmt.target).c_name if view else None

    def alloc(self, p: Promotion | None, name: str, nbytes: int) -> str:
        return f"polyc_npu_alloc(core, POLYC_{p.level if p else 'UB'}, \"{name}\", {nbytes})"

    def core_state(self) -> list[cgen.Generable]:
        out = [cgen.Statement(f"int slot_{p.buffer} = 1") for p in self.promotions
               if self.buffers_of(p) > 1]
        for p in self.promotions:
            if self._reused(p):  # the box each slot holds (a stepped panel: one per slot)
                held = f"[{p.slots}] = {{{', '.join(['-1'] * p.slots)}}}" if p.stepped else " = -1"
                out.append(cgen.Statement("long " + ", ".join(
                    f"last_{p.buffer}_{v}{d}{held}" for d in range(len(p.box)) for v in ("lo", "n"))))
        return out

    def _reused(self, p: Promotion) -> bool:
        """May a copy of `p` be skipped when its box is the one its buffer holds? For
        what the kernel only reads, with its box known per tile."""
        return (p.direction == "in" and bool(p.box)
                and self.by_c_name[p.array].role == "in")

    # -- the vector unit sees the unified buffer ---------------------------------------------
    def holds(self, p: Promotion) -> bool:
        return p.level == "UB"  # the vector unit's; L1 and L0 feed the cube

    def touched(self, statements: list[Statement]) -> tuple[list[str], list[str]]:
        """The buffers `statements` read and write (a scalar is in no buffer)."""
        kept = {a.tensor: a.c_name for a in self.kernel.arrays if a.kept}
        reads, writes = [], []
        for s in statements:
            where = {t: buf for t, (buf, _) in self.promoted_for(s.name).items()}
            where.update(kept)
            reads += [where[ld.tensor] for ld, _ in loads(s.expr) if ld.tensor in where]
            writes += [where[s.target]] if s.target in where else []
        return list(dict.fromkeys(reads)), list(dict.fromkeys(writes))

    def charge(self, fn: str, amount: str, statements: list[Statement]) -> cgen.Generable:
        reads, writes = self.touched(statements)
        decl, args = [], []
        for name, kind, bufs in (("polyc_r", "const void *", reads), ("polyc_w", "void *", writes)):
            if bufs:
                decl.append(cgen.Statement(f"{kind}{name}[] = {{{', '.join(bufs)}}}"))
                args.append(f"{name}, {len(bufs)}")
            else:
                args.append("NULL, 0")
        return cgen.Block(decl + [cgen.Statement(f"{fn}(core, {amount}, {', '.join(args)})")])

    def charge_statement(self, s: Statement) -> list[cgen.Generable]:
        n = statement_ops(s, self.cost)
        return [self.charge("polyc_npu_scalar", str(n), [s]),
                cgen.Statement(f"polyc_npu_flops(core, {n})")]

    def loop(self, n: isl.AstNode, it: str, init: str, cond: str, inc: str,
             marks: tuple) -> cgen.Generable:
        body = n.for_get_body()
        code = self.inner_loop(n, it, init, cond, inc, marks)
        calls = user_calls(body)
        if calls is None:
            return code
        statements = [self._call(c)[0] for c in calls if self.copy_call(c) is None]
        if not statements:
            return code
        cost = self.loop_cost(body, calls)
        trips = self.trips(it, init, cond, inc)
        if any(isinstance(m, (mk.Simd, mk.Reduce)) for m in marks):
            charge = self.charge("polyc_npu_vector", f"{trips}, {cost}", statements)
        else:
            charge = self.charge("polyc_npu_scalar", f"({trips}) * {cost}", statements)
        return cgen.Block([code, charge, cgen.Statement(f"polyc_npu_flops(core, ({trips}) * {cost})")])

    # -- copies ---------------------------------------------------------------------------
    def _source(self, p: Promotion, level: str) -> Promotion:
        return next(q for q in self.promotions if q.array == p.array and q.level == level)

    def copy(self, direction: str, p: Promotion, args: list[str]) -> cgen.Generable:
        b, slot = p.buffer, self.slot[p.buffer]
        if direction == "out":
            if p.direction not in ("out", "inout"):
                return cgen.Module([])
            return self.transfer(p, "put", slot, self.runtime.put)
        code: list[cgen.Generable] = self.tile_box(p, args)
        if p.level == "UB" and p.array == self.c_array:
            moves = [self._from_l0c(p)]
        elif p.direction not in ("in", "inout"):
            moves = []
        elif p.level == "L1":
            moves = [self._to_l1(p)]
        elif p.level in ("L0A", "L0B"):
            moves = [self._to_l0(p)]
        else:
            moves = [self.transfer(p, "get", slot, self.runtime.get)]
        if p.stepped:  # the slot of the tile's step: (lo / extent) mod slots
            last = len(p.box) - 1
            code.append(cgen.Statement(f"{slot} = {b}_lo{last} / {p.box[last]} % {p.slots}"))
            flip, held = [], f"[{slot}]"
        elif slot != "0":  # the tiles take the slots in turn
            flip, held = [cgen.Statement(f"{slot} = ({slot} + 1) % {self.buffers_of(p)}")], ""
        else:
            flip, held = [], ""
        if not self._reused(p):
            return cgen.Module(code + flip + moves)
        dims = range(len(p.box))
        same = " && ".join(f"last_{b}_{v}{d}{held} == {b}_{v}{d}" for d in dims
                           for v in ("lo", "n"))
        remember = [cgen.Statement(f"last_{b}_{v}{d}{held} = {b}_{v}{d}") for d in dims
                    for v in ("lo", "n")]
        return cgen.Module(code + [if_(f"!({same})", cgen.Block(flip + remember + moves))])

    def _to_l1(self, p: Promotion) -> cgen.Generable:
        """GM -> L1, the box's last two dims as a fractal matrix (its leading dims one)."""
        a = self.by_c_name[p.array]
        shape, b, elem = a.type.shape, p.buffer, p.element_bytes
        offset = " + ".join(f"{b}_lo{d} * {math.prod(shape[d + 1:]) * elem}"
                            for d in range(len(shape)))
        r, c = len(shape) - 2, len(shape) - 1
        return cgen.Statement(
            f"polyc_npu_copy_in_nz(core, {b}[{self.slot[b]}], {a.c_name}, {offset}, {b}_n{r}, "
            f"{b}_n{c}, {elem}, {shape[-1] * elem}, {p.extents[-4]}, {p.extents[-3]})")

    def _to_l0(self, p: Promotion) -> cgen.Generable:
        """L1 -> L0A/L0B: the tile's blocks of the L1 matrix its array is in."""
        src, b = self._source(p, "L1"), p.buffer
        r, c = len(p.box) - 2, len(p.box) - 1
        return cgen.Statement(
            f"polyc_npu_load_l0(core, {b}[{self.slot[b]}], {src.buffer}[{self.slot[src.buffer]}], "
            f"{src.extents[-3]}, ({b}_lo{r} - {src.buffer}_lo{r}) / 16, "
            f"({b}_lo{c} - {src.buffer}_lo{c}) / 16, {grid(p, f'{b}_n{r}')}, "
            f"{grid(p, f'{b}_n{c}')}, {p.element_bytes})")

    def _from_l0c(self, p: Promotion) -> cgen.Generable:
        """L0C -> UB: the tile's rows of the C block, as rows of float32."""
        src, b = self._source(p, "L0C"), p.buffer
        r, c = len(p.box) - 2, len(p.box) - 1
        gc = grid(src, f"{src.buffer}_n{c}")  # the mma wrote a grid as wide as the block
        at = (f"(({b}_lo{r} - {src.buffer}_lo{r}) / 16 * {gc} + "
              f"({b}_lo{c} - {src.buffer}_lo{c}) / 16) * 256")
        return cgen.Statement(
            f"polyc_npu_l0c_to_ub(core, {b}[{self.slot[b]}], {src.buffer}[{self.slot[src.buffer]}]"
            f" + {at}, {gc}, {b}_n{r}, {b}_n{c}, {p.extents[-1]}, POLYC_NPU_F32)")

    # -- the cube -------------------------------------------------------------------------
    def emit_mark(self, mark: mk.Mark, child: isl.AstNode, marks: tuple) -> cgen.Generable:
        if isinstance(mark, mk.Microkernel) and mark.kernel == KERNEL:
            return self.mma()
        return super().emit_mark(mark, child, marks)

    def mma(self) -> cgen.Generable:
        """One product of the blocks L0A and L0B hold into the C block in L0C."""
        c = next(p for p in self.promotions if p.level == "L0C")
        a = next(p for p in self.promotions if p.level == "L0A")
        b = next(p for p in self.promotions if p.level == "L0B")
        r, k = len(c.box) - 2, len(a.box) - 1
        bufs = [f"{p.buffer}[{self.slot[p.buffer]}]" for p in (c, a, b)]
        return cgen.Statement(
            f"polyc_npu_mma(core, {', '.join(bufs)}, {grid(c, f'{c.buffer}_n{r}')}, "
            f"{grid(c, f'{c.buffer}_n{r + 1}')}, {grid(a, f'{a.buffer}_n{k}')}, "
            f"{DTYPE[a.element_bytes]}, {a.buffer}_lo{k} > 0)")
