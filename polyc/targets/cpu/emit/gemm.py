"""Codegen of the microkernel marks (`trees.py`) for the cpu builder.

`CpuBuilder.emit_mark` hands every mark this module knows to `MicrokernelEmitter`:

- `gemm ...`: declares the packing buffers and, for par=inner, opens one OpenMP
  parallel region around the whole tiled nest (its loops run in every thread; the
  `omp for` loops below split the work, their implicit barriers order packing and use);
- `b_rows`: B read in place (`analysis.BRows`): its padded copy and the offset of each
  K row, once per call; tiles then call the kernel's b_rows variant, and write back
  only the virtual columns inside the output;
- `pack_b` / `pack_a`: packs the current B block / A block into the kernel's panels,
  then emits the subtree below; a gathered operand (conv2d's padded window) is packed by
  runs, K row by K row (`_run_nest`), whole panels by fixed-length copies;
- `team_for`: the loop right below is shared by the team (`omp for schedule(static)`);
- `microkernel <gemm kernel>`: replaces the statements below by the kernel call on the
  packed panels and the write-back: partial sums go to memory, the last block applies
  the init and the epilogue statements on the tile, in registers, and stores the
  kernel's outputs (never the intermediates); edge tiles go straight into C through
  the kernel's rows x cols variant where it has one (masked stores);
- `microkernel row_*`: replaces a row loop by one call of the row kernel.

Tile origins come from the isl AST: the loops opened since the `gemm` mark are the tile
loops the plan lists, in order. Anything unexpected falls back to the plain loops below
the mark, which compute the same values.
"""
from __future__ import annotations

import math

import cgen
import islpy as isl

from ....codegen.ast_to_c import mentions
from ....codegen.cexpr import ExprPrinter, c_size
from ....errors import InternalError
from ....microkernels import registry
from ....microkernels.analysis import BRows, GemmView, loads_of
from ....schedule_tree import marks
from ..plan import plan_rows, plan_view
from .brows import BRowsMixin
from .common import up
from .pack import PackMixin
from .then import ThenMixin
from .winograd import WinogradMixin
from .writeback import WriteBackMixin

_T = isl.ast_node_type
_KINDS = (marks.Gemm, marks.BRows, marks.PackB, marks.PackA, marks.TeamFor, marks.Microkernel,
          marks.Winograd)


def handles(mark: marks.Mark) -> bool:
    return isinstance(mark, _KINDS)


def _rectangular_pair(n: isl.AstNode) -> bool:
    """Is `n` a loop right around another whose bounds do not read it (one OpenMP can
    collapse)?"""
    if n.get_type() != _T.for_ or n.for_get_body().get_type() != _T.for_:
        return False
    inner, it = n.for_get_body(), n.for_get_iterator().get_id().get_name()
    return not any(mentions(e.to_C_str(), it) for e in (inner.for_get_init(), inner.for_get_cond()))


class MicrokernelEmitter(PackMixin, BRowsMixin, WriteBackMixin, ThenMixin, WinogradMixin):
    def __init__(self, builder):
        self.b = builder  # the CpuBuilder: node(), loops, arrays, kernel
        self.used: list[registry.Microkernel] = []
        self.plan: marks.Gemm | None = None
        self.view: GemmView | None = None
        self.rows: BRows | None = None
        self.base = 0
        self.partial_sums: set[str] = set()  # local results whose K blocks meet in scratch
        self.winograd_results: set[str] = set()  # convolutions Winograd's blocks compute

    # -- dispatch ----------------------------------------------------------------------
    def emit(self, mark: marks.Mark, child: isl.AstNode, outer: tuple) -> cgen.Generable:
        if isinstance(mark, marks.Gemm):
            return self.gemm(mark, child, outer)
        if isinstance(mark, marks.Winograd):
            return self.winograd(mark, child, outer)
        if isinstance(mark, marks.Microkernel) and mark.kernel.startswith("row_"):
            return self.row(mark, child, outer)
        if self.plan is None:  # a mark outside its gemm: plain loops
            return self.b.node(child, outer)
        if isinstance(mark, marks.TeamFor):
            # tiles over virtual columns cost unevenly (those across a row wrap take the
            # write-back by runs): handed out a few at a time, never so many that a
            # thread is left none (conv5's 7x7 image: 4 column tiles, which chunks of 4
            # gave one thread, 2 threads no faster than 1)
            share = "schedule(static)"
            if self.plan.par == "rows":  # a few row blocks, the last maybe short
                share = "schedule(dynamic, 1)"
            elif self.rows is not None:
                tiles = -(-min(self.plan.nc, self.rows.width) // self.mk.nr)
                share = f"schedule(dynamic, {max(1, min(4, tiles // 8))})"
            elif _rectangular_pair(child):
                # the row tiles shared with the column tiles: a team of 2 over 13 column
                # tiles (8 images of 7x7 folded, 392 columns) left one thread a tile
                # more; shared by tiles, 5-7% faster at 2 threads in pairs of calls
                share = "collapse(2) schedule(static)"
            return self.b.node(child, outer + (f"omp for {share}",))
        if isinstance(mark, marks.BRows):
            return self.prepare_rows(child, outer)
        if isinstance(mark, marks.PackB):
            return self.pack(child, outer, "b")
        if isinstance(mark, marks.PackA):
            return self.pack(child, outer, "a")
        if self.view.then is not None and mark.stmt == self.view.then.stmt.name:
            return self.then_tiles()
        return self.tile(child)

    def _tile_loops(self, allowed: set[str]) -> dict[str, str]:
        """Tile loop role -> its C iterator, checked against the plan."""
        opened = self.b.loops[self.base:]
        roles = self.plan.loops[:len(opened)]
        if len(opened) > len(self.plan.loops) or not set(roles) <= allowed:
            raise InternalError("codegen", f"microkernel tile loops {opened} do not match "
                                           f"the plan's {self.plan.loops}")
        return dict(zip(roles, opened))

    # -- gemm ----------------------------------------------------------------------------
    def gemm(self, plan: marks.Gemm, child, outer) -> cgen.Generable:
        view = plan_view(self.b.kernel, plan)
        if view is None or view.stmt.name != plan.stmt:
            raise InternalError("codegen", f"mark {str(plan)!r} does not fit kernel "
                                           f"{self.b.kernel.name}")
        mk = registry.by_name(plan.kernel)
        if mk not in self.used:
            self.used.append(mk)
        self.rows = (plan_rows(view, self.b.kernel, mk, bool(plan.sliced)) if plan.b == "rows"
                     else None)
        if plan.b == "rows" and (self.rows is None or not mk.b_rows_variant):
            raise InternalError("codegen", f"mark {str(plan)!r}: B cannot be read by rows")
        self.plan, self.view, self.base, self.mk = plan, view, len(self.b.loops), mk
        t = plan.tiles
        body: list[cgen.Generable] = [cgen.Comment(
            f"{plan.kernel}: C[{view.batches}x {plan.m}x{plan.n}] += A[{plan.m}x{plan.k}] "
            f"B[{plan.k}x{plan.n}]; tiles mc={t.mc} nc={t.nc} kc={t.kc}, {plan.par} threads")]
        if plan.depth != "-":  # the K steps a tile may skip, only if B is finite
            body.append(self.all_finite("mk_bfinite", view.b_expr.tensor))
        body += self.then_finite() if plan.then else []
        if self._acc_local():
            self.partial_sums.add(view.stmt.target)
            if not self._acc_per_point():
                body.append(self._acc_buffer(view.batches))
        if plan.a == "once":
            body += self.pack_once()
        body += [s for side in "ab" if getattr(plan, side) == "const"
                 for s in self.pack_const(side)]
        inner = self.b.node(child, outer)
        if plan.par in ("inner", "rows"):
            # the team's buffers; with par=rows each thread packs its own A blocks
            shared_b = self.rows is not None or self._team_packs("b")
            body += self._buffers("ab" if plan.par == "inner" else "b" if shared_b else "")
            threads = [f"num_threads({plan.threads})"] if plan.threads else []
            # the row tail's contracted buffers (a row of exp) are each thread's own; a
            # block of C (and of its epilogue) is filled by the team for the tail to read,
            # and the rows of the then's A the tail writes and what else of the tail's the
            # then's epilogue reads (the rows' 1 / sum), for the team's tiles to read
            then = view.then
            shared = frozenset({view.stmt.target} | {e.target for e in view.epilogue}
                               | ({then.a_expr.tensor} | {x.tensor for e in then.epilogue
                                                          for x in loads_of(e.expr)}
                                  if then else set()))
            takes, releases = self.b.thread_heap_buffers(shared)
            private = self.b.private_buffers(shared)
            body += [cgen.Pragma(" ".join(["omp parallel", *threads, *private])),
                     cgen.Block(takes + [inner] + releases)]
        else:
            body.append(inner)
        self.plan = self.view = self.rows = None
        return cgen.Block(body)

    def all_finite(self, name: str, tensor: str) -> cgen.Generable:
        """`name`: does `tensor` hold no inf or NaN (once per call)?"""
        a = self.b.arrays[tensor]
        return cgen.Statement(f"const int {name} = polyc_all_finite({a.c_name}, "
                              f"{c_size(math.prod(a.type.shape))})")

    def _acc_local(self) -> bool:
        """Partial sums of a result no one outside reads go to a scratch buffer, and so
        do those of a C that is no M x N matrix (`GemmView.c_matrix`)."""
        return "pc" in self.plan.loops and (not self._c_in_place() or not self.view.c_matrix)

    def _virtual_acc(self) -> bool:
        """Do the partial sums of a B read in place keep its virtual columns, rows
        padded to whole tiles (`_acc_shape`)? Every tile of a K block but the last then
        accumulates in them through the kernel itself, with nothing to write back; in the
        output's own columns, a tile across a row wrap (all of them where an output row
        is narrower than a tile: the 14x14 outputs of strided 3x3 convolutions) went
        through a scratch tile scattered by runs at every K block. Only into a padded
        copy, which has room for the last tile's columns past the width."""
        return (self.rows is not None and self.rows.copy and self._acc_local()
                and self.plan.depth == "-")

    def _sums_apart(self) -> bool:
        """Do the partial sums of a packed B hold the products alone, the init added at
        the last K block? Then every tile of a K block but the last, the first too,
        accumulates in them through the kernel itself. Else a tile whose C is no M x N
        matrix (folded images, `GemmView.c_matrix`), or of the first block where the
        init is not zero, went through a scratch tile added to the sums element by
        element. Not with a kernel that writes whole tiles only (no `rows_variant`,
        A packed): its edge tiles would spill into their neighbours' sums."""
        return (self.rows is None and self._acc_local() and self.plan.depth == "-"
                and self.plan.masked == "-" and bool(self.mk.rows_variant or self.plan.a == "rows"))

    def _acc_per_point(self) -> bool:
        """Are the partial sums one batch point's at a time, each thread's own? So where
        the threads share out the batch points and each point's K blocks run in the
        thread that took it (its batch loops outside the K loop), and B is packed block
        by block, where each thread takes its buffers (`pack`): the sums are then
        reused from point to point while in cache, where a buffer of every point's (3.2
        MB for 8x512x28x28 to 128 1x1) had each image's start cold (Sapphire Rapids, in
        pairs: 3% slower at 1 thread, 2% at 2)."""
        loops = self.plan.loops
        if not (self._acc_local() and self.plan.par == "batch" and self.rows is None
                and "pc" in loops):
            return False
        batch = [loops.index(f"b{d}") for d in self.view.batch if f"b{d}" in loops]
        return bool(batch) and max(batch) < loops.index("pc")

    def _acc_buffer(self, points: int) -> cgen.Generable:
        m, n = self._acc_shape()
        return cgen.Statement(f"float *restrict mk_acc = polyc_scratch(2, {4 * points * m * n})")

    def _acc_shape(self) -> tuple[int, int]:
        """Rows and columns of one batch point's partial sums."""
        if self._virtual_acc():
            return up(self.plan.m, self.mk.mr), up(self.rows.width, self.mk.nr)
        return self.plan.m, self.plan.n

    def _c_in_place(self) -> bool:
        """Is the contraction's result stored whole in its own array: an output, or what
        the row tail reads (uncontracted)?"""
        h = self.b.arrays[self.view.stmt.target]
        return h.role == "out" or (h.tensor in self._tail_reads() and h.kept is None)

    def _buffers(self, side: str = "ab") -> list[cgen.Generable]:
        """The packing buffers of `side` ('a', 'b' or both); with B read by rows, B's
        padded copy and row offsets instead of its panels."""
        mk, rows = self.mk, self.rows
        out = []
        if "b" in side and rows is None:
            if self.plan.b != "const":  # else packed whole on the first call (`pack_const`)
                out.append(cgen.Statement(f"float *restrict mk_pb = polyc_scratch(0, "
                                          f"{c_size(self.b.promotion('mk_pb').bytes)})"))
            if self.plan.then:
                out.append(self.then_buffer())
        elif "b" in side:
            # the copy runs `nr` floats past P: the last tile reads its rows whole
            size = math.prod(rows.shape) // math.prod(self.view.shape[d] for _, d in rows.slices)
            src = (f"polyc_scratch(4, {4 * (size + mk.nr)})" if rows.copy
                   else self.b.arrays[rows.tensor].c_name)
            out += [cgen.Statement(f"{'' if rows.copy else 'const '}float *restrict mk_P = {src}"),
                    cgen.Statement(f"long *restrict mk_off = polyc_scratch(5, "
                                   f"{8 * (self.plan.k + registry.B_ROWS_AHEAD)})")]
        if "a" in side and self.plan.a == "packed":
            out.append(cgen.Statement(f"float *restrict mk_pa = polyc_scratch(1, "
                                      f"{c_size(self.b.promotion('mk_pa').bytes)})"))
        return out

    def _batch_values(self, loops: dict[str, str]) -> dict[int, str]:
        return {d: loops.get(f"b{d}", "0") for d in self.view.batch}

    # -- B read by rows ----------------------------------------------------------------------

    def row(self, mark: marks.Microkernel, child, outer) -> cgen.Generable:
        kind, stmt_name = mark.kernel, mark.stmt
        node = child
        while node.get_type() == _T.mark:
            node = node.mark_get_node()
        s = self.b.statements.get(stmt_name)
        if s is None or node.get_type() != _T.for_ or node.for_get_body().get_type() != _T.user:
            return self.b.node(child, outer)
        it = node.for_get_iterator().get_id().get_name()
        got, iters = self.b._call(node.for_get_body().user_get_expr())
        cond = node.for_get_cond()
        axis = len(s.extents) - 1
        load = s.expr
        arr = self.b.arrays[load.tensor]
        if (got.name != s.name or iters[axis] != it or node.for_get_inc().to_C_str() != "1"
                or cond.get_op_type() not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt)
                or cond.get_op_arg(0).to_C_str() != it
                or (arr.kept is not None and arr.type.ndim - 1 not in arr.kept)):
            return self.b.node(child, outer)
        mk = registry.by_name(kind)
        if mk not in self.used:
            self.used.append(mk)
        lo = f"({node.for_get_init().to_C_str()})"
        hi = f"({cond.get_op_arg(1).to_C_str()})"
        count = f"{hi} - {lo}" + (" + 1" if cond.get_op_type() == isl.ast_expr_op_type.le else "")
        at = list(iters)
        at[axis] = lo
        p = ExprPrinter(self.b.arrays, lambda pos: at[pos])
        target = p.access(s.target, s.index)
        value = f"{mk.c_function}(&{p.access(load.tensor, load.index)}, {count})"
        return cgen.Block([cgen.Comment(f"{mk.name}: {s.name} over a row of {s.extents[axis]}"),
                           cgen.Statement(p.update(target, s.reduce, value, s.dtype).rstrip(";"))])

    def sources(self) -> str:
        return registry.unit_source(self.used) if self.used else ""


