"""C for a chip whose cores reach main memory only by copies: what the simulated targets
share (`manycore`, `npu`), on the names each one's runtime gives its entry points.

Each kernel becomes two functions:

    static void NAME_core(CORE *core, const void *args)   one core
    void NAME(RUN *run, T *p0, ..., T *pn)                the host side

The host side wraps each array in an opaque main-memory handle and launches the cores.
A core allocates its scratchpad buffers once (a promotion's buffer twice when
double-buffered) and walks its share of the tile loop (`parallel threads=P`: the
iterations dealt in turn, `id, id + P, ...`). `copy_in_<buffer>(o..)` fixes a tile's box
(its first element and extent per dimension, isl functions of the outer loop values
printed as C) and gets what the tile reads; `copy_out_<buffer>` puts what it writes; how
a target schedules them (double buffers, waits) is its subclass's. Statements read and
write the buffers (element e of the tile at e - lo); main-memory handles cannot be
dereferenced, so code that tried would not compile. After every innermost loop the
subclass charges the cycles it took to the simulator.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import cgen
import islpy as isl

from ...codegen.ast_to_c import CBuilder, atom, statement, user_calls
from ...codegen.cexpr import C_TYPE, ExprPrinter, c_literal
from ...codegen.isl_c import c_of, c_of_set
from ...kernel import Array, Kernel, c_comment
from ...kernel.comprehension import (Call, Expr, Guarded, Index, Statement, c_index, loads,
                                     reduce_identity)
from ...microkernels import registry
from ...schedule_tree import marks as mk
from ...schedule_tree.promotion import Promotion
from .lower import copy_statement
from .tiles import buffers

_T = isl.ast_node_type


@dataclass(frozen=True)
class Runtime:
    """The names of a simulated chip's runtime (its header in `targets/<name>/runtime`)."""

    core: str  # a core's handle type
    run: str  # the run's type
    handle: str  # a main-memory handle
    core_id: str  # int (core): this core's number
    core_count: str  # int (core): the cores of the launch
    wrap: str  # handle (run, ptr, bytes, name): a caller's array
    scratch: str  # handle (run, bytes, name): main memory for an intermediate
    launch: str  # (run, kernel, cores, body, args)
    get: str  # (core, buffer, handle, offset, rows, run bytes, main stride, buffer stride)
    put: str  # (core, handle, offset, buffer, rows, run bytes, main stride, buffer stride)


def ops(e: Expr, cost: dict[str, int], done: set | None = None) -> int:
    """The arithmetic ops of an expression, an op of `cost` counting that many; one
    already in `done` (computed before, in the same loop body) is not counted again."""
    if isinstance(e, Call):
        if done is not None:
            if e in done:
                return 0
            done.add(e)
        own = 0 if e.fn == "nonpositive" else cost.get(e.fn, 1)
        return own + sum(ops(a, cost, done) for a in e.args)
    if isinstance(e, Guarded):
        return 1 + ops(e.then, cost, done) + ops(e.otherwise, cost, done)
    return 0


def statement_ops(s: Statement, cost: dict[str, int], done: set | None = None) -> int:
    return max(1, ops(s.expr, cost, done) + (1 if s.reduce else 0))


def body_ops(statements: list[Statement], cost: dict[str, int]) -> int:
    """The ops of one iteration of a loop body: a subexpression the statements compute
    twice is computed once (as the C compiler does), until a statement writes what it
    reads."""
    done: set = set()
    total = 0
    for s in statements:
        total += statement_ops(s, cost, done)
        done = {e for e in done if all(ld.tensor != s.target for ld, _ in loads(e))}
    return total


class LocalPrinter(ExprPrinter):
    """Prints accesses of promoted arrays as their buffers, relative to the tile."""

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


def _whole(p: Promotion, d: int, size: int) -> bool:
    """Does every tile's box of `p` span dimension `d` whole (so that it merges with the
    dimensions after it into runs)? A buffer as wide as the array is not enough: tiles of
    two statements may touch a whole row for one and a column block for the other (a
    matmul's A and an elementwise sibling reading it), each box from its own start."""
    if p.extents[d] != size:
        return False
    lo, hi = p.lo[d], p.footprint.dim_max(d)
    domain = lo.domain()
    zero = isl.PwAff.zero_on_domain(isl.LocalSpace.from_space(domain.get_space()))
    zero = zero.intersect_domain(domain)
    last = zero.add_constant_val(isl.Val.int_from_si(domain.get_ctx(), size - 1))
    return lo.eq_set(zero).is_equal(domain) and hi.eq_set(last).is_equal(domain)


class ScratchpadBuilder(CBuilder):
    runtime: Runtime
    cost: dict[str, int]  # cycles per element of an op, beyond 1 (`ops`)
    lanes: int  # of a vector op: the partial results a `reduce` loop keeps

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

    # -- hooks of a target ------------------------------------------------------------------
    def alloc(self, p: Promotion | None, name: str, nbytes: int) -> str:
        """C allocating `nbytes` of scratchpad for buffer `name` (of promotion `p`, or a
        contracted intermediate when None)."""
        raise NotImplementedError

    def copy(self, direction: str, p: Promotion, args: list[str]) -> cgen.Generable:
        """The code of `copy_<direction>_<buffer>(args)`."""
        raise NotImplementedError

    def charge_statement(self, s: Statement) -> list[cgen.Generable]:
        """The charge of one statement instance outside every loop."""
        raise NotImplementedError

    def loop(self, n: isl.AstNode, it: str, init: str, cond: str, inc: str,
             marks: tuple) -> cgen.Generable:
        """A loop of the core's (its iterations already this core's share)."""
        raise NotImplementedError

    def core_state(self) -> list[cgen.Generable]:
        """Variables the core's code keeps across tiles, declared before it."""
        return []

    def inner_loop(self, n: isl.AstNode, it: str, init: str, cond: str, inc: str,
                   marks: tuple) -> cgen.Generable:
        """The loop as C; a `reduce` loop keeps one partial result per vector lane, as
        the vector unit does, folded pairwise after it: one running sum of 16 million
        floats was 4% off (each addend rounded to the sum's ulp)."""
        body = n.for_get_body()
        calls = user_calls(body)
        if not any(isinstance(m, mk.Reduce) for m in marks) or not calls or any(
                self.copy_call(c) is not None for c in calls):
            return self.emit_loop(it, init, cond, inc, statement(self.node(body)), marks)
        lanes: dict[str, tuple[str, str, str]] = {}  # element -> (partials, op, dtype)
        code = []
        for call in calls:
            s, iters = self._call(call)
            p = self.printer(lambda pos: iters[pos], s.name)
            target = p.access(s.target, s.index)
            if s.reduce is None or re.search(rf"\b{it}\b", target):
                code.append(self.emit_assign(s, iters))
                continue
            part = lanes.setdefault(target, (f"polyc_part{len(lanes)}", s.reduce, s.dtype))[0]
            code.append(cgen.Statement(p.update(f"{part}[polyc_lane]", s.reduce,
                                                p.value(s.expr), s.dtype).rstrip(";")))
        if not lanes:
            return self.emit_loop(it, init, cond, inc, cgen.Block(code), marks)
        n_lanes, p = self.lanes, self.printer(lambda pos: "0")
        before = [cgen.Statement("int polyc_lane = 0")]
        fold = []
        for target, (part, op, dtype) in lanes.items():
            identity = c_literal(reduce_identity(op, dtype), dtype)
            before += [cgen.Statement(f"{C_TYPE[dtype]} {part}[{n_lanes}]"),
                       cgen.For("int l = 0", f"l < {n_lanes}", "l++",
                                cgen.Statement(f"{part}[l] = {identity}"))]
            fold += [cgen.For(f"int w = {n_lanes // 2}", "w > 0", "w /= 2", cgen.For(
                         "int l = 0", "l < w", "l++", cgen.Statement(
                             p.update(f"{part}[l]", op, f"{part}[l + w]", dtype).rstrip(";")))),
                     cgen.Statement(p.update(target, op, f"{part}[0]", dtype).rstrip(";"))]
        code.append(cgen.Statement(f"polyc_lane = polyc_lane + 1 == {n_lanes} ? 0 : polyc_lane + 1"))
        return cgen.Block(before + [self.emit_loop(it, init, cond, inc, cgen.Block(code), marks)]
                          + fold)

    # -- accesses ------------------------------------------------------------------------
    def holds(self, p: Promotion) -> bool:
        """Do statements read and write `p`'s arrays in its buffer (not one a copy
        passes through on its way to another level)?"""
        return True

    def promoted_for(self, statement: str) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Tensor -> (buffer expression, extents) of the buffers `statement` uses
        (`Promotion.statements`)."""
        return {self.by_c_name[a].tensor: (f"{p.buffer}[{self.slot[p.buffer]}]", p.extents)
                for p in self.promotions if self.holds(p)
                and (not p.statements or statement in p.statements) for a in (p.array, *p.also)}

    def printer(self, iters, statement: str = "") -> LocalPrinter:
        return LocalPrinter(self.arrays, iters, self.promoted_for(statement))

    def emit_assign(self, s: Statement, iters: list[str]) -> cgen.Generable:
        p = self.printer(lambda pos: iters[pos], s.name)
        target = p.access(s.target, s.index)
        return cgen.Statement(p.update(target, s.reduce, p.value(s.expr), s.dtype).rstrip(";"))

    def copy_call(self, call: isl.AstExpr) -> tuple[str, Promotion] | None:
        return self.copies.get(call.get_op_arg(0).get_id().get_name())

    def emit_user(self, call: isl.AstExpr) -> cgen.Generable:
        if (found := self.copy_call(call)) is not None:
            args = [atom(call.get_op_arg(i).to_C_str()) for i in range(1, call.get_op_n_arg())]
            return self.copy(*found, args)
        s, iters = self._call(call)
        code = self.emit_assign(s, iters)
        if not self.loops:  # a statement outside every loop
            return cgen.Block([code, *self.charge_statement(s)])
        return code

    def loop_cost(self, body: isl.AstNode, calls: list[isl.AstExpr]) -> int:
        """The ops of one iteration of an innermost loop (its copies are not compute)."""
        return body_ops([self._call(c)[0] for c in calls if self.copy_call(c) is None],
                        self.cost)

    # -- tiles and copies -----------------------------------------------------------------
    def tile_box(self, p: Promotion, args: list[str]) -> list[cgen.Generable]:
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

    def transfer(self, p: Promotion, kind: str, slot: str, fn: str, tail: str = ""
                 ) -> cgen.Generable:
        """The copies of one tile's box between its array and its buffer `slot` (`fn`:
        the runtime's get or put, `tail` its extra arguments): the trailing dimensions
        the buffer holds whole merge into one run, the next one is the rows of one
        transfer, the ones before loop (a transfer each)."""
        a = self.by_c_name[p.array]
        shape, box, elem = a.type.shape, p.extents, p.element_bytes
        nd = len(shape)
        k = nd - 1
        while k > 0 and _whole(p, k, shape[k]):
            k -= 1
        inner = math.prod(shape[k + 1:]) if nd else 1
        run = f"{p.buffer}_n{k} * {inner * elem}" if nd else str(elem)
        rows, main_stride, local_stride = "1", "0", "0"
        if k >= 1:
            rows = f"{p.buffer}_n{k - 1}"
            main_stride = str(math.prod(shape[k:]) * elem)
            local_stride = str(math.prod(box[k:]) * elem)
        loops = list(range(max(0, k - 1)))
        at = [f"({p.buffer}_lo{d} + {p.buffer}_t{d})" if d in loops else f"{p.buffer}_lo{d}"
              for d in range(nd)]
        offset = " + ".join(f"{x} * {math.prod(shape[d + 1:]) * elem}"
                            for d, x in enumerate(at)) or "0"
        local_at = " + ".join(f"{p.buffer}_t{d} * {math.prod(box[d + 1:])}" for d in loops) or "0"
        local = f"{p.buffer}[{slot}] + {local_at}"
        ends = (f"{local}, {a.c_name}, {offset}" if kind == "get"
                else f"{a.c_name}, {offset}, {local}")
        code: cgen.Generable = cgen.Statement(
            f"{fn}(core, {ends}, {rows}, {run}, {main_stride}, {local_stride}{tail})")
        for d in reversed(loops):
            code = cgen.For(f"long {p.buffer}_t{d} = 0", f"{p.buffer}_t{d} < {p.buffer}_n{d}",
                            f"{p.buffer}_t{d}++", code)
        return code

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
        if par is not None:  # the cores take the iterations in turn
            self.cores = par.threads
            init = f"{init} + {self.runtime.core_id}(core) * {inc}"
            inc = f"{self.runtime.core_count}(core) * {inc}"
        return self.loop(n, it, init, cond, inc, marks)

    @staticmethod
    def trips(it: str, init: str, cond: str, inc: str) -> str:
        m = re.fullmatch(rf"{it} (<=|<) (.+)", cond)
        if m is None:
            raise ValueError(f"a loop condition isl does not write: {cond!r}")
        last = m.group(2) if m.group(1) == "<=" else f"({m.group(2)}) - 1"
        return f"(({last}) - ({init})) / ({inc}) + 1"

    # -- the functions --------------------------------------------------------------------
    def declare_buffer(self, a: Array) -> tuple[cgen.Generable, None]:
        if not a.kept:
            return cgen.Statement(f"{C_TYPE[a.type.dtype]} {a.c_name}"), None
        n = math.prod(a.buffer_shape) * a.type.itemsize
        return cgen.Statement(f"{C_TYPE[a.type.dtype]} *restrict {a.c_name} = "
                              f"{self.alloc(None, a.c_name, n)}"), None

    def declare_local(self, a: Array):
        raise AssertionError(f"{a.tensor} is neither promoted nor contracted")

    def buffers_of(self, p: Promotion) -> int:
        return buffers(p, self.double)

    def function(self, ast: isl.AstNode) -> cgen.Generable:
        k, rt = self.kernel, self.runtime
        # main memory holds what is copied; an intermediate that stays on chip needs none
        moved = {p.array for p in self.promotions if p.direction != "local"}
        handles = [a for a in k.arrays if a.kept is None and (a.role != "local" or a.c_name in moved)]
        core_body: list[cgen.Generable] = [
            cgen.Statement(f"const struct {k.name}_args *args = argp")]
        core_body += [cgen.Statement(f"const {rt.handle} {a.c_name} = args->{a.c_name}")
                      for a in handles]
        for p in self.promotions:
            copies = self.buffers_of(p)
            ctype = C_TYPE[self.by_c_name[p.array].type.dtype]
            core_body.append(cgen.Statement(f"{ctype} *{p.buffer}[{copies}]"))
            core_body += [cgen.Statement(f"{p.buffer}[{s}] = {self.alloc(p, p.buffer, p.bytes)}")
                          for s in range(copies)]
        core_body += [self.declare_buffer(a)[0] for a in self.buffers]
        body = self.node(ast)
        core_body += self.core_state() + [body]
        core = cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value("static void", f"{k.name}_core"),
                                     [cgen.Pointer(cgen.Value(rt.core, "core")),
                                      cgen.Pointer(cgen.Value("const void", "argp"))]),
            cgen.Block(core_body))
        struct = cgen.Struct(f"{k.name}_args", [cgen.Value(rt.handle, a.c_name) for a in handles])
        params = []
        for a in k.params:
            value = cgen.RestrictPointer(cgen.Value(C_TYPE[a.type.dtype], a.c_name))
            params.append(cgen.Const(value) if a.role == "in" else value)
        host = [cgen.Comment(c_comment(f"{a.c_name}: {a.role} {a.type} tensor '{a.tensor}'"))
                for a in k.arrays]
        host.append(cgen.Statement(f"struct {k.name}_args args"))
        for a in handles:
            if a.role == "local":
                host.append(cgen.Assign(f"args.{a.c_name}", f"{rt.scratch}(run, "
                                        f"{a.type.nbytes}, \"{a.c_name}\")"))
            else:
                host.append(cgen.Assign(f"args.{a.c_name}", f"{rt.wrap}(run, (void *){a.c_name}, "
                                        f"{a.type.nbytes}, \"{a.c_name}\")"))
        host.append(cgen.Statement(f"{rt.launch}(run, \"{k.name}\", {self.cores}, "
                                   f"{k.name}_core, &args)"))
        launcher = cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value("void", k.name),
                                     [cgen.Pointer(cgen.Value(rt.run, "run"))] + params),
            cgen.Block(host))
        kernels = registry.c_source([registry.by_name(n) for n in self.used])
        return cgen.Module([cgen.Line(kernels), cgen.Line(str(struct) + ";"), core, launcher])
