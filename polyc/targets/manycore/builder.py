"""The many-core target's C builder: compute-core code on the LDM, DMA for every byte of
main memory, and a management-core launcher.

Each kernel becomes two functions:

    static void NAME_core(polyc_mc_core *core, const void *args)   one compute core
    void NAME(polyc_mc_run *run, T *p0, ..., T *pn)               the management core

The management core wraps each array in an opaque main-memory handle and launches the
compute cores. A compute core allocates its LDM buffers once (a promotion's buffer twice
when double-buffered) and walks its share of the tile loop (`parallel threads=P`: the
iterations dealt in turn, `id, id + P, ...`). `copy_in_<buffer>(o..)` fixes a tile's box
(its first element and extent per dimension, isl functions of the outer loop values
printed as C) and gets what the tile reads; `copy_out_<buffer>` puts what it writes. A
loop whose body begins with copies is software-pipelined when double-buffered: the next
tile's inputs are fetched asynchronously into the other buffer while this tile computes,
and each tile's outputs leave asynchronously. Statements read and write the LDM buffers
(element e of the tile at e - lo); main-memory handles cannot be dereferenced, so code
that tried would not compile. After every innermost loop the cycles it took are charged:
vector ops (8 lanes a cycle) for `simd` / `reduce` loops, scalar ops for the others.
"""
from __future__ import annotations

import math
import re

import cgen
import islpy as isl

from ...codegen.ast_to_c import CBuilder, atom, statement, user_calls
from ...codegen.cexpr import C_TYPE, ExprPrinter
from ...codegen.isl_c import c_of, c_of_set
from ...kernel import Array, Kernel, c_comment
from ...kernel.comprehension import Call, Expr, Guarded, Index, Statement, c_index
from ...schedule_tree import marks as mk
from ...schedule_tree.promotion import Promotion
from ...microkernels import registry
from ...microkernels.analysis import gemm_view
from .gemm import KERNEL, KR, MR, NR
from .lower import copy_statement

KERNEL_FN = f"polyc_{KERNEL}"

_T = isl.ast_node_type
# cycles of one op, per element of a vector op or per scalar op: a transcendental is a
# short polynomial
EXPENSIVE = {"exp": 8, "log": 8, "tanh": 8, "erf": 8, "sigmoid": 8, "sqrt": 4, "rsqrt": 4,
             "pow": 16, "div": 2, "reciprocal": 2}
SLOT = "polyc_slot"


def ops(e: Expr) -> int:
    """The arithmetic ops of an expression (what the simulator charges and counts)."""
    if isinstance(e, Call):
        own = 0 if e.fn in ("cast", "nonpositive") else EXPENSIVE.get(e.fn, 1)
        return own + sum(ops(a) for a in e.args)
    if isinstance(e, Guarded):
        return 1 + ops(e.then) + ops(e.otherwise)
    return 0


def statement_ops(s: Statement) -> int:
    return max(1, ops(s.expr) + (1 if s.reduce else 0))


class LdmPrinter(ExprPrinter):
    """Prints accesses of promoted arrays as their LDM buffers, relative to the tile."""

    def __init__(self, arrays, iters, promoted: dict[str, tuple[str, tuple[int, ...]]]):
        super().__init__(arrays, iters)
        self.promoted = promoted  # tensor -> (buffer expression, extents)

    def access(self, tensor: str, index: tuple[Index, ...]) -> str:
        if tensor not in self.promoted:
            return super().access(tensor, index)
        buf, extents = self.promoted[tensor]
        name = buf.split("[")[0]
        terms, stride = [], 1
        for d in reversed(range(len(index))):
            rel = f"({c_index(index[d], self.iters)} - {name}_lo{d})"
            terms.append(rel if stride == 1 else f"{rel} * {stride}")
            stride *= extents[d]
        return f"{buf}[{' + '.join(reversed(terms)) or '0'}]"


class ManycoreBuilder(CBuilder):
    def __init__(self, kernel: Kernel, promotions: tuple[Promotion, ...], double: bool):
        super().__init__(kernel)
        self.double = double
        self.copies: dict[str, tuple[str, Promotion]] = {}
        for p in promotions:
            self.copies[copy_statement("in", p.buffer)] = ("in", p)
            self.copies[copy_statement("out", p.buffer)] = ("out", p)
        self.by_c_name = {a.c_name: a for a in kernel.arrays}
        self.promotions = promotions
        self.slot = {p.buffer: "0" for p in promotions}  # the buffer each statement uses
        self.cores = 1
        self.loops: list[str] = []  # iterators of the loops around the node being built
        self.used: list[str] = []  # microkernels called

    # -- accesses ------------------------------------------------------------------------
    def printer(self, iters) -> LdmPrinter:
        promoted = {self.by_c_name[a].tensor: (f"{p.buffer}[{self.slot[p.buffer]}]", p.extents)
                    for p in self.promotions for a in (p.array, *p.also)}
        return LdmPrinter(self.arrays, iters, promoted)

    def emit_assign(self, s: Statement, iters: list[str]) -> cgen.Generable:
        p = self.printer(lambda pos: iters[pos])
        target = p.access(s.target, s.index)
        return cgen.Statement(p.update(target, s.reduce, p.value(s.expr), s.dtype).rstrip(";"))

    def emit_user(self, call: isl.AstExpr) -> cgen.Generable:
        name = call.get_op_arg(0).get_id().get_name()
        if name in self.copies:
            args = [atom(call.get_op_arg(i).to_C_str()) for i in range(1, call.get_op_n_arg())]
            direction, p = self.copies[name]
            if direction == "in":
                return cgen.Module(self.tile_box(p, args)
                                   + self.dma(p, "get", self.slot[p.buffer], None))
            return cgen.Block(self.dma(p, "put", self.slot[p.buffer], None))
        s, iters = self._call(call)
        code = self.emit_assign(s, iters)
        if not self.loops:  # a statement outside every loop: scalar ops
            return cgen.Block([code, cgen.Statement(f"polyc_mc_scalar(core, {statement_ops(s)})"),
                               cgen.Statement(f"polyc_mc_flops(core, {statement_ops(s)})")])
        return code

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

    # -- tiles and copies -----------------------------------------------------------------
    def tile_box(self, p: Promotion, args: list[str], declare: bool = True) -> list[cgen.Generable]:
        """`const long B_lo0 = ..., B_n0 = ...`: the tile's first element and extent per
        dimension, from the outer loop values `args`."""
        names = [f"{p.buffer}_o{k}" for k in range(len(args))]
        out = [cgen.Statement(f"const long {n} = {a}") for n, a in zip(names, args)]
        # a tile may touch none of the array (padding, a concat's other part): then its
        # box is empty, and the bounds are isl functions only where it is not
        some = c_of_set(p.footprint.domain(), names)
        for d, lo in enumerate(p.lo):
            hi = p.footprint.dim_max(d)
            out.append(cgen.Statement(f"const long {p.buffer}_lo{d} = ({some}) ? "
                                      f"({c_of(lo, names)}) : 0"))
            out.append(cgen.Statement(f"const long {p.buffer}_n{d} = ({some}) ? "
                                      f"({c_of(hi.sub(lo), names)}) + 1 : 0"))
        return out

    def dma(self, p: Promotion, kind: str, slot: str, reply: str | None) -> list[cgen.Generable]:
        """The transfers of one tile's box between its array and its buffer `slot`: the
        trailing dimensions the buffer holds whole merge into one run, the next one is
        the rows of one transfer, the ones before loop (a transfer each)."""
        if (kind == "get" and p.direction not in ("in", "inout")) or (
                kind == "put" and p.direction not in ("out", "inout")):
            return []
        a = self.by_c_name[p.array]
        shape, box, elem = a.type.shape, p.extents, p.element_bytes
        nd = len(shape)
        k = nd - 1
        while k > 0 and box[k] == shape[k]:
            k -= 1
        inner = math.prod(shape[k + 1:]) if nd else 1
        run = f"{p.buffer}_n{k} * {inner * elem}" if nd else str(elem)
        rows, mm_stride, ldm_stride = "1", "0", "0"
        if k >= 1:
            rows = f"{p.buffer}_n{k - 1}"
            mm_stride = str(math.prod(shape[k:]) * elem)
            ldm_stride = str(math.prod(box[k:]) * elem)
        loops = list(range(max(0, k - 1)))
        at = [f"({p.buffer}_lo{d} + {p.buffer}_t{d})" if d in loops else f"{p.buffer}_lo{d}"
              for d in range(nd)]
        offset = " + ".join(f"{x} * {math.prod(shape[d + 1:]) * elem}"
                            for d, x in enumerate(at)) or "0"
        ldm_at = " + ".join(f"{p.buffer}_t{d} * {math.prod(box[d + 1:])}" for d in loops) or "0"
        ldm = f"{p.buffer}[{slot}] + {ldm_at}"
        fn = {"get": "polyc_dma_get", "put": "polyc_dma_put"}[kind]
        if reply:
            fn = fn.replace("_get", "_iget").replace("_put", "_iput")
        tail = f", &{reply}" if reply else ""
        call = (f"{fn}(core, {ldm}, {a.c_name}, {offset}, {rows}, {run}, {mm_stride}, {ldm_stride}{tail})"
                if kind == "get" else
                f"{fn}(core, {a.c_name}, {offset}, {ldm}, {rows}, {run}, {mm_stride}, {ldm_stride}{tail})")
        code: cgen.Generable = cgen.Statement(call)
        for d in reversed(loops):
            code = cgen.For(f"long {p.buffer}_t{d} = 0", f"{p.buffer}_t{d} < {p.buffer}_n{d}",
                            f"{p.buffer}_t{d}++", code)
        if kind == "get" and p.pad:  # a kernel's tiles read the padding: zero at an edge
            partial = " || ".join(f"{p.buffer}_n{d} < {e}" for d, e in enumerate(box))
            code = cgen.Block([cgen.If(partial, cgen.Block([
                cgen.Statement(f"memset({p.buffer}[{slot}], 0, {p.bytes})"),
                cgen.Statement(f"polyc_mc_vector(core, {p.elements}, 1)")])), code])
        return [code]

    # -- loops ----------------------------------------------------------------------------
    def node(self, n: isl.AstNode, marks: tuple = ()) -> cgen.Generable:
        if n.get_type() != _T.for_:
            return super().node(n, marks)
        self.loops.append(n.for_get_iterator().get_id().get_name())
        try:
            return super().node(n, marks)
        finally:
            self.loops.pop()

    def for_loop(self, n: isl.AstNode, marks: tuple) -> cgen.Generable:
        it, init, cond, inc = self.header(n)
        par = next((m for m in marks if isinstance(m, mk.Parallel)), None)
        if par is not None:  # the compute cores take the iterations in turn
            self.cores = par.threads
            init, inc = f"{init} + polyc_mc_id(core) * {inc}", f"polyc_mc_count(core) * {inc}"
        body = n.for_get_body()
        inner = body
        while inner.get_type() == _T.mark:  # a tile's mark carries no code
            inner = inner.mark_get_node()
        copies = self._leading_copies(inner)
        # fetched a tile ahead only when no tile writes what a later one reads (a
        # reduction across the loop gets its partial results after they are put)
        if copies and self.double and all(self.copies[c.get_op_arg(0).get_id().get_name()][1]
                                           .direction != "inout" for c in copies):
            return self.pipelined(it, init, cond, inc, inner, copies)
        code = self.emit_loop(it, init, cond, inc, statement(self.node(body)), marks)
        calls = user_calls(body)
        if calls is None:
            return code
        # an innermost loop: its cycles, charged after it
        cost = sum(statement_ops(self._call(c)[0]) for c in calls
                   if c.get_op_arg(0).get_id().get_name() not in self.copies)
        trips = self._trips(it, init, cond, inc)
        vector = any(isinstance(m, (mk.Simd, mk.Reduce)) for m in marks)
        charge = (f"polyc_mc_vector(core, {trips}, {cost})" if vector
                  else f"polyc_mc_scalar(core, ({trips}) * {cost})")
        return cgen.Block([code, cgen.Statement(charge),
                           cgen.Statement(f"polyc_mc_flops(core, ({trips}) * {cost})")])

    @staticmethod
    def _trips(it: str, init: str, cond: str, inc: str) -> str:
        m = re.fullmatch(rf"{it} (<=|<) (.+)", cond)
        if m is None:
            raise ValueError(f"a loop condition isl does not write: {cond!r}")
        last = m.group(2) if m.group(1) == "<=" else f"({m.group(2)}) - 1"
        return f"(({last}) - ({init})) / ({inc}) + 1"

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
            if self.copies.get(e.get_op_arg(0).get_id().get_name(), ("",))[0] != "in":
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
        mine = [self.copies[c.get_op_arg(0).get_id().get_name()][1] for c in copies]
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
            cgen.If(then, cgen.Block([cgen.Statement(f"polyc_dma_wait(core, &{rout}[1 - {slot}])")]
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
            cgen.If(cond, cgen.Block(fetch(it, "0"))),
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
            if (c.get_type() == _T.user and self.copies.get(
                    c.user_get_expr().get_op_arg(0).get_id().get_name(), ("",))[0] == "out"):
                continue
            out.append(self.node(c))
        return out

    # -- the functions --------------------------------------------------------------------
    def declare_buffer(self, a: Array) -> cgen.Generable:
        if not a.kept:
            return cgen.Statement(f"{C_TYPE[a.type.dtype]} {a.c_name}")
        n = math.prod(a.buffer_shape) * a.type.itemsize
        return cgen.Statement(f"{C_TYPE[a.type.dtype]} *restrict {a.c_name} = "
                              f"polyc_ldm_alloc(core, \"{a.c_name}\", {n})")

    def declare_local(self, a: Array):
        raise AssertionError(f"{a.tensor} is neither promoted nor contracted")

    def function(self, ast: isl.AstNode) -> cgen.Generable:
        k = self.kernel
        # main memory holds what DMA moves; an intermediate that stays in the LDM needs none
        moved = {p.array for p in self.promotions if p.direction != "local"}
        handles = [a for a in k.arrays if a.kept is None and (a.role != "local" or a.c_name in moved)]
        core_body: list[cgen.Generable] = [
            cgen.Statement(f"const struct {k.name}_args *args = argp")]
        core_body += [cgen.Statement(f"const polyc_mm {a.c_name} = args->{a.c_name}")
                      for a in handles]
        for p in self.promotions:
            # a buffer that never moves (an intermediate of the tile) needs no second one
            copies = 2 if self.double and p.direction != "local" and p.at else 1
            ctype = C_TYPE[self.by_c_name[p.array].type.dtype]
            core_body.append(cgen.Statement(f"{ctype} *{p.buffer}[{copies}]"))
            core_body += [cgen.Statement(f"{p.buffer}[{s}] = polyc_ldm_alloc(core, "
                                         f"\"{p.buffer}\", {p.bytes})") for s in range(copies)]
        core_body += [self.declare_buffer(a) for a in self.buffers]
        core_body.append(self.node(ast))
        core = cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value("static void", f"{k.name}_core"),
                                     [cgen.Pointer(cgen.Value("polyc_mc_core", "core")),
                                      cgen.Pointer(cgen.Value("const void", "argp"))]),
            cgen.Block(core_body))
        struct = cgen.Struct(f"{k.name}_args", [cgen.Value("polyc_mm", a.c_name) for a in handles])
        params = []
        for a in k.params:
            value = cgen.RestrictPointer(cgen.Value(C_TYPE[a.type.dtype], a.c_name))
            params.append(cgen.Const(value) if a.role == "in" else value)
        mpe = [cgen.Comment(c_comment(f"{a.c_name}: {a.role} {a.type} tensor '{a.tensor}'"))
               for a in k.arrays]
        mpe.append(cgen.Statement(f"struct {k.name}_args args"))
        for a in handles:
            if a.role == "local":
                mpe.append(cgen.Assign(f"args.{a.c_name}", f"polyc_mm_alloc(run, "
                                       f"{a.type.nbytes}, \"{a.c_name}\")"))
            else:
                mpe.append(cgen.Assign(f"args.{a.c_name}", f"polyc_mm_wrap(run, (void *){a.c_name}, "
                                       f"{a.type.nbytes}, \"{a.c_name}\")"))
        mpe.append(cgen.Statement(f"polyc_mc_launch(run, \"{k.name}\", {self.cores}, "
                                  f"{k.name}_core, &args)"))
        launcher = cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value("void", k.name),
                                     [cgen.Pointer(cgen.Value("polyc_mc_run", "run"))] + params),
            cgen.Block(mpe))
        kernels = registry.c_source([registry.by_name(n) for n in self.used])
        return cgen.Module([cgen.Line(kernels), cgen.Line(str(struct) + ";"), core, launcher])
