"""The cpu backend's C builder: OpenMP threads, vector loops and microkernels from marks.

`parallel` marks become `omp parallel for` (a fixed team: `num_threads(N)`), `partials`
a parallel region whose threads reduce into private copies folded in thread order;
`simd` an `omp simd` loop, `reduce` one accumulator per vector lane (`omp simd
reduction`), `stream` a loop staged in L1 and copied out with non-temporal stores;
microkernel marks go to `emit.MicrokernelEmitter` (packing, kernel calls, write-back).
Contracted buffers are declared once and made private to each thread.
"""
from __future__ import annotations

import math
import re

import cgen
import islpy as isl

from ...codegen.ast_to_c import CBuilder, mentions, statement, user_calls
from ...codegen.cexpr import C_TYPE, ExprPrinter, c_literal, c_size
from ...kernel import Kernel
from ...kernel.comprehension import loads, reduce_identity
from ...schedule_tree import marks as mk
from ...schedule_tree.promotion import Promotion
from .emit import MicrokernelEmitter, handles as is_microkernel_mark
from .lower import MIN_PARALLEL_INSTANCES

_T = isl.ast_node_type


PREFETCH_CHUNK = 256  # elements of a row loop between two rounds of prefetches (each
# round ends the lanes' partial reductions: fewer, longer chunks keep that cheap)
STREAM_CHUNK = 256  # elements staged in L1 between two non-temporal copies: each copy
# pays for aligning its start, which at 64 cost softmax 4096^2 about a tenth of its time


# support.c's scratch slots, and the first of those left for whole locals
SCRATCH_SLOTS, LOCAL_SLOT = 11, 7

_OMP_REDUCTION = {"sum": "+", "prod": "*", "max": "max", "min": "min"}
_FLOATS = ("float32", "float64")


class CpuBuilder(CBuilder):
    """Marks from `lower.py` become one OpenMP pragma on the loop right below them;
    microkernel marks (`trees.py`) become packing, kernel calls and write-back
    (`emit/`), the kernels' C pasted before the function. `marks` passed down hold typed
    marks and the pragma strings a microkernel mark asked for (`omp for ...`)."""

    def __init__(self, kernel: Kernel, promotions: tuple[Promotion, ...] = ()):
        super().__init__(kernel)
        self.promotions = {p.buffer: p for p in promotions}  # the packed blocks
        self.loops: list[str] = []  # iterators of the loops around the node being built
        self.parallel: list[str] = []  # those of them that threads share out
        self.microkernels = MicrokernelEmitter(self)
        self.streamed = False  # has a loop stored with non-temporal stores
        self.guarded_scalar = False  # a loop assigns a contracted scalar under an if

    def node(self, n: isl.AstNode, marks: tuple = ()) -> cgen.Generable:
        if n.get_type() != _T.for_:
            return super().node(n, marks)
        it = n.for_get_iterator().get_id().get_name()
        parallel = any(isinstance(m, mk.Parallel) for m in marks)
        self.loops.append(it)
        if parallel:
            self.parallel.append(it)
        try:
            return super().node(n, marks)
        finally:
            self.loops.pop()
            if parallel:
                self.parallel.pop()

    def for_loop(self, n: isl.AstNode, marks: tuple) -> cgen.Generable:
        header = self.header(n)
        it, inner = header[0], n.for_get_body()
        if _has(marks, mk.Reduce, mk.Simd):
            calls = user_calls(inner)
            reused = self.reused_buffers(it, calls) if calls else None
            if reused is None:  # a buffer shared by the iterations: no vector lanes
                marks = tuple(m for m in marks if not isinstance(m, (mk.Reduce, mk.Simd)))
            elif _has(marks, mk.Reduce):
                code = self.emit_reduction_loop(*header, calls, reused)
                if code is not None:
                    return code
            if reused:
                marks += (f"private({', '.join(reused)})",)
            if reused is not None and _has(marks, mk.Stream):
                code = self.emit_streaming_loop(*header, calls, marks)
                if code is not None:
                    return code
        return self.emit_loop(*header, statement(self.node(inner)), marks)

    def reused_buffers(self, it: str, calls: list[isl.AstExpr]) -> list[str] | None:
        """Contracted scalars the loop's statements write in every iteration (each vector
        lane needs its own), or None when a larger buffer is reused across iterations
        (its slots would be shared by the lanes)."""
        scalars = []
        for call in calls:
            s, iters = self._call(call)
            a = self.arrays[s.target]
            if a.kept is None or s.reduce is not None:
                continue
            target = ExprPrinter(self.arrays, lambda pos: iters[pos]).access(s.target, s.index)
            if re.search(rf"\b{it}\b", target):
                continue
            if a.kept:
                return None
            scalars.append(a.c_name)
        return sorted(set(scalars))


    def emit_if(self, cond, then, other):
        scalars = [a.c_name for a in self.kernel.arrays if a.kept == ()]
        text = str(then)
        if self.loops and any(re.search(rf"^\s*{re.escape(c)} = ", text, re.M) for c in scalars):
            self.guarded_scalar = True
        return super().emit_if(cond, then, other)

    def promotion(self, buffer: str) -> Promotion:
        return self.promotions[buffer]

    def emit_mark(self, mark, child, marks):
        if is_microkernel_mark(mark):
            return self.microkernels.emit(mark, child, marks)
        return super().emit_mark(mark, child, marks)

    def function(self, ast: isl.AstNode) -> cgen.Generable:
        fn = super().function(ast)
        if self.streamed:
            # orders this thread's non-temporal stores before the caller reads the
            # output; each worker thread's are drained by the locked instructions of the
            # barrier that ends the parallel loop
            fn.body.contents.append(cgen.Statement("polyc_stream_fence()"))
        if self.guarded_scalar:
            # gcc 12's if-conversion for AVX-512 masked loads miscompiles a scalar set
            # under an if and read in a select after it (AKG's concat.info: the other
            # operand's first rows loaded as zeros); no other pattern of ours is known
            # to meet the bug, so only such kernels go without if-conversion
            fn.fdecl = cgen.DeclSpecifier(
                fn.fdecl, '__attribute__((optimize("no-tree-loop-if-convert")))')
        kernels = self.microkernels.sources()  # include-guarded: pasted once per kernel
        return cgen.Module([cgen.Line(kernels), fn]) if kernels else fn

    def declare_local(self, a):
        """Where the support of a gemm kernel is linked, a local stored whole lives in the
        thread's scratch (support.c's slots from LOCAL_SLOT on), kept across calls: a
        malloc of attention's 8 MiB of probabilities and 8 MiB of scores faulted in
        every page on every call (Zen 3, 1 thread: 1.8x the time of the kernel). A
        block buffer (`Array.block`) holds one block of rows."""
        whole = [x.c_name for x in self.kernel.arrays if x.role == "local" and x.kept is None]
        slot = LOCAL_SLOT + whole.index(a.c_name) if a.c_name in whole else SCRATCH_SLOTS
        if slot >= SCRATCH_SLOTS or not any(m.kind == "gemm" for m in self.microkernels.used):
            return super().declare_local(a)
        size = a.type.itemsize * math.prod(a.buffer_shape)
        # nothing to release: the slot is kept (a thread's own copies may leave the
        # function's unused)
        return (cgen.Statement(f"{C_TYPE[a.type.dtype]} *restrict {a.c_name} = polyc_scratch("
                               f"{slot}, {c_size(size)})"), cgen.Statement(f"(void){a.c_name}"))

    def declare_buffer(self, a):
        # a block buffer inside a parallel region: the thread's own (`heap_buffers`)
        return self.declare_local(a) if a.block is not None else super().declare_buffer(a)

    def emit_loop(self, it, init, cond, inc, body, marks):
        partial = next((m for m in marks if isinstance(m, mk.Partials)), None)
        if partial:
            return self.emit_partials(it, init, cond, inc, body, marks, list(partial.arrays))
        par = next((m for m in marks if isinstance(m, mk.Parallel)), None)
        simd = _has(marks, mk.Simd)
        team = []  # the clauses of the threads' team
        if par and par.threads:
            team.append(f"num_threads({par.threads})")
        if par and type(par.work) is not int:  # decided at a size: checked per call
            team.append(f"if({par.work} >= {MIN_PARALLEL_INSTANCES})")
        if par and self.buffers:  # each thread its own contracted buffers
            private = self.private_buffers(within=str(body))
        elif par or simd:
            private = [m for m in marks if isinstance(m, str) and m.startswith("private(")]
        else:
            private = []
        # pragmas a microkernel mark asked for (`omp for` of a team) pass through
        pragmas = [m for m in marks if isinstance(m, str) and m.startswith("omp ")]
        loop = super().emit_loop(it, init, cond, inc, body, marks)
        if par and self.heap_buffers():
            # each thread allocates its buffers in the team's region, then they share
            # the loop: `omp parallel for` has no place for the allocation
            takes, releases = self.thread_heap_buffers()
            shared = " ".join(["omp for", *(["simd"] if simd else []), *private])
            return cgen.Module([cgen.Pragma(p) for p in pragmas] + [
                cgen.Pragma(" ".join(["omp parallel", *team])),
                cgen.Block(takes + [cgen.Pragma(shared), loop] + releases)])
        # both marks on one loop (a one-member band) make `omp parallel for simd`
        words = (["parallel for"] if par else []) + (["simd"] if simd else [])
        if words:
            pragmas.append(" ".join(["omp", *words, *team, *private]))
        return cgen.Module([cgen.Pragma(p) for p in pragmas] + [loop]) if pragmas else loop

    def heap_buffers(self, shared: frozenset[str] = frozenset()) -> list:
        """The contracted buffers as long as a symbolic dim (`CBuilder.declare_buffer`)
        and the block buffers (each thread's block of rows in its scratch), but those of
        the tensors `shared`."""
        blocks = [a for a in self.kernel.arrays if a.block is not None]
        return [a for a in self.buffers + blocks
                if self.declare_buffer(a)[1] is not None and a.tensor not in shared]

    def private_buffers(self, shared: frozenset[str] = frozenset(),
                        within: str | None = None) -> list[str]:
        """The clause that gives each thread its own fixed-size buffers (none or one),
        but those of the tensors `shared` (a gemm's C block, which its team fills) and,
        given the loop's C (`within`), those it does not touch (a microkernel's
        write-back keeps its epilogue's values in names of its own)."""
        heap = self.heap_buffers()
        names = [a.c_name for a in self.buffers if a not in heap and a.tensor not in shared
                 and (within is None or mentions(within, a.c_name))]
        return [f"private({', '.join(names)})"] if names else []

    def thread_heap_buffers(self, shared: frozenset[str] = frozenset()) -> tuple[list, list]:
        """Each thread's own heap buffers, inside its parallel region: (takes, releases);
        they hide the function's, which serve the loops no thread shares."""
        held = [self.declare_buffer(a) for a in self.heap_buffers(shared)]
        return [take for take, _ in held], [release for _, release in held]

    def emit_partials(self, it, init, cond, inc, body, marks, names: list[str]):
        """Threads share the loop, each reducing into its own copy of the one-element
        arrays `names`: inside the loop an array's name is a pointer to the thread's copy,
        so the body is the sequential one; each thread then folds its copies into the
        arrays with the statements' own update (a NaN a thread saw stays in a max), one
        thread after the other in thread order: with a static schedule every run with
        the same team rounds alike (folding in order of arrival did not)."""
        reduce = {self.arrays[s.target].c_name: s.reduce for s in self.kernel.statements
                  if s.reduce is not None}
        by_c_name = {a.c_name: a for a in self.kernel.arrays}
        p = ExprPrinter(self.arrays, lambda pos: "0")
        decls, aliases, folds = [], [], []
        for name in names:
            dtype = by_c_name[name].type.dtype
            copy = f"polyc_part_{name}"
            identity = c_literal(reduce_identity(reduce[name], dtype), dtype)
            decls.append(cgen.Statement(f"{C_TYPE[dtype]} {copy} = {identity}"))
            aliases.append(cgen.Statement(f"{C_TYPE[dtype]} *const {name} = &{copy}"))
            folds.append(cgen.Statement(p.update(f"{name}[0]", reduce[name], copy, dtype)
                                        .rstrip(";")))
        loop = self.emit_loop(it, init, cond, inc, cgen.Block(aliases + [body]),
                              tuple(m for m in marks
                                    if not isinstance(m, (mk.Parallel, mk.Partials))))
        par = next(m for m in marks if isinstance(m, mk.Parallel))
        clauses = [f"num_threads({par.threads})"] if par.threads else []
        clauses += self.private_buffers()
        takes, releases = self.thread_heap_buffers()
        # schedule(static, 1): thread t takes turn t of the ordered loop
        fold = cgen.For("int polyc_t = 0", "polyc_t < omp_get_num_threads()", "polyc_t++",
                        cgen.Module([cgen.Pragma("omp ordered"), cgen.Block(folds)]))
        return cgen.Module([cgen.Pragma(" ".join(["omp parallel", *clauses])), cgen.Block(
            decls + takes + [cgen.Pragma("omp for schedule(static)"), loop,
                             cgen.Pragma("omp for ordered schedule(static, 1)"), fold]
            + releases)])

    def emit_reduction_loop(self, it, init, cond, inc, calls, private):
        """Each reduction whose element stays put in the loop accumulates in a scalar that
        `omp simd reduction` splits into one accumulator per vector lane; the element is
        read before the loop and written after it. OpenMP leaves open what max and min
        make of a NaN when lanes combine, so a NaN seen by any lane is kept in a flag."""
        accs: dict[str, tuple[str, str, str]] = {}  # element -> (scalar, op, C type)
        body = []
        for call in calls:
            s, iters = self._call(call)
            p = ExprPrinter(self.arrays, lambda pos: iters[pos])
            target = p.access(s.target, s.index)
            value = p.value(s.expr)
            if s.reduce is not None and not re.search(rf"\b{it}\b", target):
                if target not in accs:
                    accs[target] = (f"acc{len(accs)}", s.reduce, C_TYPE[s.dtype])
                acc = accs[target][0]
                if s.reduce in ("max", "min"):
                    # the flag keeps a NaN, so the comparison need not: gcc makes this one
                    # vmaxps, where the NaN-keeping update was a compare, an or and a blend
                    # on the accumulator's chain (attention's row max: 5 cycles a vector)
                    cmp = ">" if s.reduce == "max" else "<"
                    update = (f"{acc} = v {cmp} {acc} ? v : {acc}" if s.dtype in _FLOATS
                              else p.update(acc, s.reduce, "v", s.dtype).rstrip(";"))
                    body.append(cgen.Block([
                        cgen.Statement(f"{C_TYPE[s.dtype]} v = {value}"),
                        cgen.Statement(update),
                        cgen.Statement(f"{acc}_nan |= v != v")]))
                    continue
                target = acc
            body.append(cgen.Statement(p.update(target, s.reduce, value, s.dtype).rstrip(";")))
        if not accs:
            return None
        extrema = [acc for acc, op, _ in accs.values() if op in ("max", "min")]
        clauses = " ".join(f"reduction({_OMP_REDUCTION[op]}:{acc})" for acc, op, _ in accs.values())
        clauses += "".join(f" reduction(|:{acc}_nan)" for acc in extrema)
        if private:
            clauses += f" private({', '.join(private)})"
        body = body[0] if len(body) == 1 else cgen.Block(body)
        loop = (self.prefetching_loop(it, init, cond, inc, calls, body, f"omp simd {clauses}")
                or cgen.Module([cgen.Pragma(f"omp simd {clauses}"),
                                cgen.For(f"int {it} = {init}", cond, f"{it} += {inc}", body)]))
        before = [cgen.Statement(f"{ctype} {acc} = {element}") for element, (acc, _, ctype) in accs.items()]
        before += [cgen.Statement(f"int {acc}_nan = {acc} != {acc}") for acc in extrema]
        after = [cgen.Statement(f"{element} = {acc}_nan ? NAN : {acc}" if acc in extrema
                                else f"{element} = {acc}")
                 for element, (acc, _, _) in accs.items()]
        return cgen.Block(before + [loop] + after)

    def prefetching_loop(self, it, init, cond, inc, calls, body, pragma) -> cgen.Generable | None:
        """Hide the next row's memory latency behind a reduction loop over this one.

        A thread's share of rows is read pass after pass (max then exp-sum, mean then
        variance); the passes after the first find the row in cache and leave memory idle,
        and the hardware prefetcher, which follows demand misses, does not run a row
        ahead. Strip-mined by PREFETCH_CHUNK, each chunk first prefetches the same chunk of
        the next row of every input it reads, so the next row's first pass finds it in
        cache (layer_norm 8192x1024 at 2 threads: 14-17 GB/s without, 23-35 with; a
        burst of the whole next row at the row's start stalls a 4096-wide softmax).
        Prefetches never fault, past the last row included. None when it does not apply.
        """
        bound = re.fullmatch(rf"{it} <= (.+)", cond)
        if not self.parallel or inc != "1" or bound is None:
            return None
        if (bound.group(1).isdigit() and init.isdigit()
                and int(bound.group(1)) - int(init) < PREFETCH_CHUNK):
            return None  # a short loop (a 3-wide window of a convolution) has no next chunk
        row, chunk = self.parallel[-1], f"{it}_chunk"
        addresses: list[str] = []
        for call in calls:
            s, iters = self._call(call)
            for load, _ in loads(s.expr):
                a = self.arrays[load.tensor]
                here = ExprPrinter(self.arrays, lambda pos: iters[pos]).access(load.tensor,
                                                                                load.index)
                if a.role != "in" or not all(re.search(rf"\b{x}\b", here) for x in (row, it)):
                    continue  # only rows of inputs, which come from memory
                line = 64 // a.type.itemsize  # elements per cache line
                for k in range(0, PREFETCH_CHUNK, line):
                    moved = [re.sub(rf"\b{it}\b", f"({chunk} + {k})",
                                    re.sub(rf"\b{row}\b", f"({row} + 1)", x)) for x in iters]
                    address = ExprPrinter(self.arrays, lambda pos: moved[pos]).access(load.tensor,
                                                                                       load.index)
                    if address not in addresses:
                        addresses.append(address)
        if not addresses:
            return None
        inner = cgen.For(f"int {it} = {chunk}", f"{it} <= min({chunk} + {PREFETCH_CHUNK - 1}, "
                         f"{bound.group(1)})", f"{it} += 1", body)
        return cgen.For(f"int {chunk} = {init}", cond.replace(it, chunk, 1),
                        f"{chunk} += {PREFETCH_CHUNK}",
                        cgen.Block([cgen.Statement(f"__builtin_prefetch(&{x}, 0, 2)")
                                    for x in addresses] + [cgen.Pragma(pragma), inner]))

    def emit_streaming_loop(self, it, init, cond, inc, calls, marks):
        """Strip-mined by STREAM_CHUNK, each chunk of the output is computed into a
        stage buffer in L1 by a `simd` loop, then copied out with non-temporal stores
        (`polyc_stream`); the loop's other statements write locals and stay as they are.
        None when the loop writes no output: the AST build may have split the marked loop
        and left a copy that writes only the locals."""
        bound = re.fullmatch(rf"{it} <= (.+)", cond)
        if inc != "1" or bound is None:
            return None
        chunk, last = f"{it}_chunk", f"min({it}_chunk + {STREAM_CHUNK - 1}, {bound.group(1)})"
        body, address, ctype = [], None, None
        for call in calls:
            s, iters = self._call(call)
            if self.arrays[s.target].role == "local":
                body.append(self.emit_assign(s, iters))
                continue
            p = ExprPrinter(self.arrays, lambda pos: iters[pos])
            ctype = C_TYPE[s.dtype]
            body.append(cgen.Statement(f"polyc_stage[{it} - {chunk}] = {p.value(s.expr)}"))
            start = [re.sub(rf"\b{it}\b", chunk, x) for x in iters]
            address = ExprPrinter(self.arrays, lambda pos: start[pos]).access(s.target, s.index)
        if address is None:
            return None
        self.streamed = True
        private = [m for m in marks if isinstance(m, str) and m.startswith("private(")]
        inner = cgen.Module([
            cgen.Pragma(" ".join(["omp simd", *private])),
            cgen.For(f"int {it} = {chunk}", f"{it} <= {last}", f"{it} += 1",
                     body[0] if len(body) == 1 else cgen.Block(body))])
        stage = cgen.Block([
            cgen.Statement(f"{ctype} polyc_stage[{STREAM_CHUNK}]"), inner,
            cgen.Statement(f"polyc_stream(&{address}, polyc_stage, "
                           f"({last} - {chunk} + 1) * sizeof(polyc_stage[0]))")])
        outer = tuple(m for m in marks if not isinstance(m, (mk.Simd, mk.Stream))
                      and m not in private)
        return self.emit_loop(chunk, init, cond.replace(it, chunk, 1), str(STREAM_CHUNK),
                              stage, outer)


def _has(marks: tuple, *kinds: type[mk.Mark]) -> bool:
    return any(isinstance(m, kinds) for m in marks)
