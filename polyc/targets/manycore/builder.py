"""The many-core target's C builder: `scratchpad.builder` on the runtime's names, with
DMA pipelined across tiles and the 64x64x32 kernel's calls.

A loop whose body begins with copies is software-pipelined when double-buffered: the
next tile's inputs are fetched asynchronously into the other buffer while this tile
computes, and each tile's outputs leave asynchronously (each such loop has its own slot
and replies). After every innermost loop the cycles it took are charged: vector ops (8
lanes a cycle) for `simd` / `reduce` loops, scalar ops for the others.
"""
from __future__ import annotations

import re

import cgen
import islpy as isl

from ...codegen.ast_to_c import atom, if_, user_calls
from ...kernel.comprehension import Statement
from ...microkernels.analysis import gemm_view
from ...schedule_tree import marks as mk
from ...schedule_tree.promotion import Promotion
from ..scratchpad.builder import Runtime, ScratchpadBuilder, statement_ops
from .gemm import KERNEL, KR, MR, NR
from .machine import LANES

KERNEL_FN = f"polyc_{KERNEL}"

_T = isl.ast_node_type
# cycles of one op, per element of a vector op or per scalar op: a transcendental is a
# short polynomial
EXPENSIVE = {"cast": 0, "exp": 8, "log": 8, "tanh": 8, "erf": 8, "sigmoid": 8, "sqrt": 4,
             "rsqrt": 4, "pow": 16, "div": 2, "reciprocal": 2}
SLOT = "polyc_slot"
RUNTIME = Runtime(core="polyc_mc_core", run="polyc_mc_run", handle="polyc_mm",
                  core_id="polyc_mc_id", core_count="polyc_mc_count", wrap="polyc_mm_wrap",
                  scratch="polyc_mm_alloc", launch="polyc_mc_launch", get="polyc_dma_get",
                  put="polyc_dma_put")


class ManycoreBuilder(ScratchpadBuilder):
    runtime = RUNTIME
    cost = EXPENSIVE
    lanes = LANES

    def alloc(self, p: Promotion | None, name: str, nbytes: int) -> str:
        return f"polyc_ldm_alloc(core, \"{name}\", {nbytes})"

    def copy(self, direction: str, p: Promotion, args: list[str]) -> cgen.Generable:
        if direction == "in":
            return cgen.Module(self.tile_box(p, args)
                               + self.dma(p, "get", self.slot[p.buffer], None))
        return cgen.Block(self.dma(p, "put", self.slot[p.buffer], None))

    def charge_statement(self, s: Statement) -> list[cgen.Generable]:
        n = statement_ops(s, self.cost)
        return [cgen.Statement(f"polyc_mc_scalar(core, {n})"),
                cgen.Statement(f"polyc_mc_flops(core, {n})")]

    def emit_mark(self, mark: mk.Mark, child: isl.AstNode, marks: tuple) -> cgen.Generable:
        if isinstance(mark, mk.Microkernel) and mark.kernel == KERNEL:
            return self.kernel_calls()
        return super().emit_mark(mark, child, marks)

    def kernel_calls(self) -> cgen.Generable:
        """The K step of a C block as full 64x64x32 calls on the padded LDM panels (the
        loops below the mark compute the same values, and are not emitted)."""
        view = gemm_view(self.kernel)
        target = self.arrays[view.stmt.target].c_name
        c = next(p for p in self.promotions if p.buffer.startswith("ldm_")
                 and target in (p.array, *p.also))
        a, b = (next(p for p in self.promotions if p.buffer.startswith(f"ldmk_{side}_"))
                for side in ("a", "b"))
        row = len(c.box) - 2
        buf = {p.buffer: f"{p.buffer}[{self.slot[p.buffer]}]" for p in (a, b, c)}
        lda, ldb, ldc = a.extents[-1], b.extents[-1], c.extents[-1]
        call = (f"{KERNEL_FN}(core, {buf[a.buffer]} + polyc_ii * {lda} + polyc_kk, {lda}, "
                f"{buf[b.buffer]} + polyc_kk * {ldb} + polyc_jj, {ldb}, "
                f"{buf[c.buffer]} + polyc_ii * {ldc} + polyc_jj, {ldc})")
        k_valid = f"{a.buffer}_n{len(a.box) - 1}"
        if KERNEL not in self.used:
            self.used.append(KERNEL)
        return cgen.For("long polyc_ii = 0", f"polyc_ii < {c.buffer}_n{row}", f"polyc_ii += {MR}",
                        cgen.For("long polyc_jj = 0", f"polyc_jj < {c.buffer}_n{row + 1}",
                                 f"polyc_jj += {NR}",
                                 cgen.For("long polyc_kk = 0", f"polyc_kk < {k_valid}",
                                          f"polyc_kk += {KR}", cgen.Statement(call))))

    def dma(self, p: Promotion, kind: str, slot: str, reply: str | None) -> list[cgen.Generable]:
        """The transfers of one tile's box (`transfer`), asynchronous with `reply`; a
        get of a padded buffer zeroes it first at a partial tile."""
        if (kind == "get" and p.direction not in ("in", "inout")) or (
                kind == "put" and p.direction not in ("out", "inout")):
            return []
        fn = self.runtime.get if kind == "get" else self.runtime.put
        if reply:
            fn = fn.replace("_get", "_iget").replace("_put", "_iput")
        code = self.transfer(p, kind, slot, fn, f", &{reply}" if reply else "")
        if kind == "get" and p.pad:  # a kernel's tiles read the padding: zero at an edge
            # against the buffer's padded extents, not the box: a K of 28 is one box of
            # 28 columns, full, but the kernel reads 32 (garbage there made every output NaN)
            partial = " || ".join(f"{p.buffer}_n{d} < {e}" for d, e in enumerate(p.extents))
            code = cgen.Block([if_(partial, cgen.Block([
                cgen.Statement(f"memset({p.buffer}[{slot}], 0, {p.bytes})"),
                cgen.Statement(f"polyc_mc_vector(core, {p.elements}, 1)")])), code])
        return [code]

    def loop(self, n: isl.AstNode, it: str, init: str, cond: str, inc: str,
             marks: tuple) -> cgen.Generable:
        body = n.for_get_body()
        inner = body
        while inner.get_type() == _T.mark:  # a tile's mark carries no code
            inner = inner.mark_get_node()
        copies = self._leading_copies(inner)
        # fetched a tile ahead only when no tile writes what a later one reads (a
        # reduction across the loop gets its partial results after they are put), into
        # the second buffer of each moved one (the plan may have had room for one only)
        moved = [p for p in (self.copy_call(c)[1] for c in copies) if p.direction != "local"]
        if copies and all(p.direction != "inout" and self.buffers_of(p) > 1 for p in moved):
            return self.pipelined(it, init, cond, inc, inner, copies)
        code = self.inner_loop(n, it, init, cond, inc, marks)
        calls = user_calls(body)
        if calls is None:
            return code
        # an innermost loop: its cycles, charged after it
        cost = self.loop_cost(body, calls)
        trips = self.trips(it, init, cond, inc)
        vector = any(isinstance(m, (mk.Simd, mk.Reduce)) for m in marks)
        charge = (f"polyc_mc_vector(core, {trips}, {cost})" if vector
                  else f"polyc_mc_scalar(core, ({trips}) * {cost})")
        return cgen.Block([code, cgen.Statement(charge),
                           cgen.Statement(f"polyc_mc_flops(core, ({trips}) * {cost})")])

    def _leading_copies(self, body: isl.AstNode) -> list[isl.AstExpr]:
        if body.get_type() != _T.block:
            return []
        children = body.block_get_children()
        found = []
        for i in range(children.n_ast_node()):
            c = children.get_at(i)
            if c.get_type() != _T.user:
                break
            e = c.user_get_expr()
            if (self.copy_call(e) or ("",))[0] != "in":
                break
            found.append(e)
        return found

    def pipelined(self, it, init, cond, inc, body, copies) -> cgen.Generable:
        """The tile loop with its inputs fetched one tile ahead into the other buffer and
        its outputs put asynchronously (see the module docstring)."""
        def args(call, shift: str | None) -> list[str]:
            out = [atom(call.get_op_arg(i).to_C_str()) for i in range(1, call.get_op_n_arg())]
            return [re.sub(rf"\b{it}\b", f"({shift})", a) for a in out] if shift else out

        nxt = f"{it} + {inc}"
        then = re.sub(rf"\b{it}\b", f"({nxt})", cond)
        # this loop's own slot and replies: a pipelined loop may hold another one
        slot, rin, rout = f"{SLOT}_{it}", f"polyc_in_{it}", f"polyc_out_{it}"
        mine = [self.copy_call(c)[1] for c in copies]
        saved = dict(self.slot)
        self.slot.update({p.buffer: slot for p in mine if p.direction != "local"})
        current = []
        for call, p in zip(copies, mine):
            current += self.tile_box(p, args(call, None))
        rest = self._rest(body, len(copies))
        puts = []
        for p in mine:
            puts += self.dma(p, "put", slot, f"{rout}[{slot}]")
        self.slot = saved

        def fetch(at: str, into: str) -> list[cgen.Generable]:
            return [cgen.Block(self.tile_box(p, args(call, at))
                               + self.dma(p, "get", into, f"{rin}[{into}]"))
                    for call, p in zip(copies, mine)]

        loop_body = cgen.Block([
            if_(then, cgen.Block([cgen.Statement(f"polyc_dma_wait(core, &{rout}[1 - {slot}])")]
                                 + fetch(nxt, f"1 - {slot}"))),
            cgen.Statement(f"polyc_dma_wait(core, &{rin}[{slot}])"),
            cgen.Statement(f"polyc_dma_wait(core, &{rout}[{slot}])"),
            *current, *rest, *puts,
            cgen.Statement(f"{slot} = 1 - {slot}")])
        return cgen.Block([
            cgen.Statement(f"int {slot} = 0"),
            cgen.Statement(f"polyc_reply {rin}[2] = {{{{0, 0}}, {{0, 0}}}}, "
                           f"{rout}[2] = {{{{0, 0}}, {{0, 0}}}}"),
            cgen.Statement(f"long {it} = {init}"),
            if_(cond, cgen.Block(fetch(it, "0"))),
            cgen.For("", cond, f"{it} += {inc}", loop_body),
            cgen.Statement(f"polyc_dma_wait(core, &{rout}[0])"),
            cgen.Statement(f"polyc_dma_wait(core, &{rout}[1])")])

    def _rest(self, body: isl.AstNode, skip: int) -> list[cgen.Generable]:
        """The loop body after its leading copies, without the copy-outs (the pipeline
        issues those itself)."""
        children = body.block_get_children()
        out = []
        for i in range(skip, children.n_ast_node()):
            c = children.get_at(i)
            if c.get_type() == _T.user and (self.copy_call(c.user_get_expr()) or ("",))[0] == "out":
                continue
            out.append(self.node(c))
        return out

