"""Codegen of the microkernel marks (`match.py`) for the CPU builder.

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

from ..errors import InternalError
from ..schedule_tree.comprehension import Aff, Const, Expr, Guarded, Load
from ..codegen.cexpr import C_TYPE, ExprPrinter
from . import registry
from .analysis import BRows, GemmView, b_rows, gemm_view, iterators, loads_of
from .match import GemmPlan

_T = isl.ast_node_type
_WORDS = ("gemm", "b_rows", "pack_b", "pack_a", "team_for", "microkernel")


def handles(mark: str) -> bool:
    return mark.split(" ", 1)[0] in _WORDS


class _Scalars(ExprPrinter):
    """Prints loads of tensors the write-back holds in C scalars as those scalars."""

    def __init__(self, arrays, iters, scalars: dict[str, str]):
        super().__init__(arrays, iters)
        self.scalars = scalars

    def value(self, e: Expr) -> str:
        if isinstance(e, Load) and e.tensor in self.scalars:
            return self.scalars[e.tensor]
        return super().value(e)


def _decompose(names: list[str], extents: list[int], flat: str) -> list[cgen.Generable]:
    """`const long name = ...` for each dim of a row-major flattened index."""
    out, w = [], 1
    weights = []
    for n in reversed(extents):
        weights.append(w)
        w *= n
    weights.reverse()
    for k, (name, n, w) in enumerate(zip(names, extents, weights)):
        e = flat if w == 1 else f"({flat}) / {w}"
        if k > 0:
            e = f"({e}) % {n}"
        out.append(cgen.Statement(f"const long {name} = {e}"))
    return out


def _virtual(names: list[str], weights: tuple[int, ...], flat: str) -> list[cgen.Generable]:
    """`const long name = ...` for each column dim of a virtual column (`BRows`): the
    dims are its digits in the mixed radix of the weights (weight 0: extent 1)."""
    out, outer = [], None
    for name, w in zip(names, weights):
        if w == 0:
            out.append(cgen.Statement(f"const long {name} = 0"))
            continue
        e = flat if outer is None else f"({flat}) % {outer}"
        out.append(cgen.Statement(f"const long {name} = {e if w == 1 else f'({e}) / {w}'}"))
        outer = w
    return out


class MicrokernelEmitter:
    def __init__(self, builder):
        self.b = builder  # the CpuBuilder: node(), loops, arrays, kernel
        self.used: list[registry.Microkernel] = []
        self.plan: GemmPlan | None = None
        self.view: GemmView | None = None
        self.rows: BRows | None = None
        self.base = 0
        self.partial_sums: set[str] = set()  # local results whose K blocks meet in scratch

    # -- dispatch ----------------------------------------------------------------------
    def emit(self, name: str, child: isl.AstNode, marks: tuple[str, ...]) -> cgen.Generable:
        word = name.split(" ", 1)[0]
        if word == "gemm":
            return self.gemm(name, child, marks)
        if word == "microkernel" and name.split()[1].startswith("row_"):
            return self.row(name, child, marks)
        if self.plan is None:  # a mark outside its gemm: plain loops
            return self.b.node(child, marks)
        if word == "team_for":
            # tiles over virtual columns cost unevenly (those across a row wrap take the
            # write-back by runs): handed out a few at a time
            share = "schedule(static)" if self.rows is None else "schedule(dynamic, 4)"
            return self.b.node(child, marks + (f"omp for {share}",))
        if word == "b_rows":
            return self.prepare_rows(child, marks)
        if word == "pack_b":
            return self.pack(child, marks, "b")
        if word == "pack_a":
            return self.pack(child, marks, "a")
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
    def gemm(self, name: str, child, marks) -> cgen.Generable:
        plan = GemmPlan.parse(name)
        view = gemm_view(self.b.kernel)
        if view is None or view.stmt.name != plan.stmt:
            raise InternalError("codegen", f"mark {name!r} does not fit kernel {self.b.kernel.name}")
        mk = registry.by_name(plan.kernel)
        if mk not in self.used:
            self.used.append(mk)
        self.rows = b_rows(view, self.b.kernel) if plan.b == "rows" else None
        if plan.b == "rows" and (self.rows is None or not mk.b_rows_variant):
            raise InternalError("codegen", f"mark {name!r}: B cannot be read by rows")
        self.plan, self.view, self.base, self.mk = plan, view, len(self.b.loops), mk
        t = plan.tiles
        body: list[cgen.Generable] = [cgen.Comment(
            f"{plan.kernel}: C[{view.batches}x {plan.m}x{plan.n}] += A[{plan.m}x{plan.k}] "
            f"B[{plan.k}x{plan.n}]; tiles mc={t.mc} nc={t.nc} kc={t.kc}, {plan.par} threads")]
        if self._acc_local():
            self.partial_sums.add(view.stmt.target)
            body.append(cgen.Statement(
                f"float *restrict mk_acc = polyc_scratch(2, {4 * view.batches * plan.m * plan.n})"))
        inner = self.b.node(child, marks)
        if plan.par == "inner":
            body += self._buffers()
            threads = f" num_threads({plan.threads})" if plan.threads else ""
            body += [cgen.Pragma(f"omp parallel{threads}"), cgen.Block([inner])]
        else:
            body.append(inner)
        self.plan = self.view = self.rows = None
        return cgen.Block(body)

    def _acc_local(self) -> bool:
        """Partial sums of a result no one outside reads go to a scratch buffer."""
        role = self.b.arrays[self.view.stmt.target].role
        return role != "out" and "pc" in self.plan.loops

    def _buffers(self, side: str = "ab") -> list[cgen.Generable]:
        """The packing buffers of `side` ('a', 'b' or both); with B read by rows, B's
        padded copy and row offsets instead of its panels."""
        t, mk, rows = self.plan.tiles, self.mk, self.rows
        kc, nc, mc = min(t.kc, self.plan.k), min(t.nc, _up(self.plan.n, mk.nr)), min(t.mc, _up(self.plan.m, mk.mr))
        out = []
        if "b" in side and rows is None:
            out.append(cgen.Statement(f"float *restrict mk_pb = polyc_scratch(0, {4 * kc * _up(nc, mk.nr)})"))
        elif "b" in side:
            # the copy runs `nr` floats past P: the last tile reads its rows whole
            src = (f"polyc_scratch(4, {4 * (math.prod(rows.shape) + mk.nr)})" if rows.copy
                   else self.b.arrays[rows.tensor].c_name)
            out += [cgen.Statement(f"{'' if rows.copy else 'const '}float *restrict mk_P = {src}"),
                    cgen.Statement(f"long *restrict mk_off = polyc_scratch(5, {8 * self.plan.k})")]
        if "a" in side:
            out.append(cgen.Statement(f"float *restrict mk_pa = polyc_scratch(1, {4 * kc * _up(mc, mk.mr)})"))
        return out

    def _batch_values(self, loops: dict[str, str]) -> dict[int, str]:
        return {d: loops.get(f"b{d}", "0") for d in self.view.batch}

    # -- B read by rows ----------------------------------------------------------------------
    def prepare_rows(self, child, marks) -> cgen.Generable:
        """B read in place (`analysis.BRows`): its padded copy, once per call, and the
        offset of each K row in it. The team shares both loops (par=inner; each `omp for`
        ends in a barrier, so both are complete before any tile reads them)."""
        rows, plan, view = self.rows, self.plan, self.view
        arr = self.b.arrays[rows.tensor]
        code: list[cgen.Generable] = [cgen.Comment(
            f"B read in place, K row by K row, from {arr.c_name}"
            + (f" padded to [{','.join(map(str, rows.shape))}]" if rows.copy else "")
            + f"; {rows.width} virtual columns for {plan.n}")]
        if plan.par != "inner":
            code += self._buffers("b")
        share = {"inner": "omp for schedule(static)",
                 "batch": "omp parallel for schedule(static)"
                          + (f" num_threads({plan.threads})" if plan.threads else "")}.get(plan.par)
        if rows.copy:
            code += self._pad_copy(share)
        k_names = [f"mk_r{p}" for p in view.red]
        weights = dict(rows.red_weights)
        off = " + ".join([str(rows.const)] + [f"{weights[p]} * mk_r{p}" for p in view.red
                                               if weights[p]])
        loop = cgen.For("long mk_k = 0", f"mk_k < {plan.k}", "mk_k++", cgen.Block(
            _decompose(k_names, [view.stmt.extents[p] for p in view.red], "mk_k")
            + [cgen.Assign("mk_off[mk_k]", off)]))
        code += ([cgen.Pragma(share)] if plan.par == "inner" else []) + [loop]
        code.append(self.b.node(child, marks))
        return cgen.Block(code)

    def _pad_copy(self, share: str | None) -> list[cgen.Generable]:
        """P row by row (its last dim): the pad value where an outer index is out of the
        valid range, else pad, a copy of the valid middle, pad."""
        rows = self.rows
        arr = self.b.arrays[rows.tensor]
        shape, lo, valid = rows.shape, rows.lo, rows.valid
        n, W = len(shape), shape[-1]
        names = [f"mk_u{d}" for d in range(n - 1)]
        outer = math.prod(shape[:-1])
        src_strides = [_stride(arr.type.shape, d) for d in range(n)]
        inside = " && ".join(f"{valid[d][0]} <= {names[d]} + {lo[d]} && {names[d]} + {lo[d]} < {valid[d][1]}"
                             for d in range(n - 1)
                             if lo[d] < valid[d][0] or lo[d] + shape[d] > valid[d][1]) or "1"
        src = " + ".join(f"({names[d]} + {lo[d]}) * {src_strides[d]}" for d in range(n - 1)) or "0"
        pad = ExprPrinter(self.b.arrays, lambda pos: "0").value(Const(rows.pad, "float32"))
        body = _decompose(names, list(shape[:-1]), "mk_u") + [
            cgen.Statement(f"float *restrict mk_d = mk_P + mk_u * {W}"),
            cgen.Statement("long mk_lo = 0, mk_hi = 0"),
            cgen.If(inside, cgen.Block([
                cgen.Assign("mk_lo", f"max(0, {valid[-1][0] - lo[-1]})"),
                cgen.Assign("mk_hi", f"max(mk_lo, min({W}, {valid[-1][1] - lo[-1]}))")])),
            cgen.For("long mk_t = 0", "mk_t < mk_lo", "mk_t++", cgen.Assign("mk_d[mk_t]", pad)),
            cgen.If("mk_hi > mk_lo", cgen.Statement(
                f"memcpy(mk_d + mk_lo, {arr.c_name} + {src} + mk_lo + {lo[-1]}, 4 * (mk_hi - mk_lo))")),
            cgen.For("long mk_t = mk_hi", f"mk_t < {W} + (mk_u == {outer - 1} ? {self.mk.nr} : 0)",
                     "mk_t++", cgen.Assign("mk_d[mk_t]", pad))]
        loop = cgen.For("long mk_u = 0", f"mk_u < {outer}", "mk_u++", cgen.Block(body))
        return ([cgen.Pragma(share)] if share else []) + [loop]

    # -- packing ---------------------------------------------------------------------------
    def pack(self, child, marks, side: str) -> cgen.Generable:
        plan, view, mk, t = self.plan, self.view, self.mk, self.plan.tiles
        s0 = view.stmt
        if side == "b":
            loops = self._tile_loops({f"b{d}" for d in view.batch} | {"jc", "pc"})
            head = [cgen.Statement(f"const long mk_k0 = {loops.get('pc', '0')}"),
                    cgen.Statement(f"const long mk_kc = min({t.kc}, {plan.k} - mk_k0)"),
                    cgen.Statement(f"const long mk_j0 = {loops.get('jc', '0')}"),
                    cgen.Statement(f"const long mk_nc = min({t.nc}, {plan.n} - mk_j0)")]
            tile, total, own = mk.nr, plan.n, view.cols
            expr, start, size, buf = view.b_expr, "mk_j0", "mk_nc", "mk_pb"
        else:
            loops = self._tile_loops({f"b{d}" for d in view.batch} | {"jc", "pc", "ic"})
            head = [] if self.rows is None else [  # no pack_b above to set the K block
                cgen.Statement(f"const long mk_k0 = {loops.get('pc', '0')}"),
                cgen.Statement(f"const long mk_kc = min({t.kc}, {plan.k} - mk_k0)")]
            head += [cgen.Statement(f"const long mk_i0 = {loops.get('ic', '0')}"),
                    cgen.Statement(f"const long mk_mc = min({t.mc}, {plan.m} - mk_i0)")]
            tile, total, own = mk.mr, plan.m, view.rows
            expr, start, size, buf = view.a_expr, "mk_i0", "mk_mc", "mk_pa"
        if plan.par != "inner":
            head += self._buffers(side)
        # iterator values: batch dims from their loops, own dims and K from the element
        p = ExprPrinter(self.b.arrays, lambda pos: f"mk_s{pos}")
        batch = [cgen.Statement(f"const long mk_s{view.out_iter[d]} = {v}")
                 for d, v in self._batch_values(loops).items()
                 if view.out_iter[d] in iterators(expr)]
        own_names = [f"mk_s{view.out_iter[d]}" for d in own]
        own_ext = [view.shape[d] for d in own]
        red_names = [f"mk_s{q}" for q in view.red]
        red_ext = [s0.extents[q] for q in view.red]
        value = p.value(expr)
        inner_is_own = self._contiguous_along(expr, {view.out_iter[d] for d in own})
        dst = f"mk_dst[mk_p * {tile} + mk_x]"
        k_vars = _decompose(red_names, red_ext, "mk_k0 + mk_p")
        x_vars = _decompose(own_names, own_ext, f"{start} + mk_xp + mk_x")
        valid = "mk_nv"
        runs = self._run_nest(expr, own_names, own_ext, [view.out_iter[d] for d in own], tile,
                              start, size, buf, k_vars,
                              _up(min(t.nc if side == "b" else t.mc, total), tile)
                              ) if inner_is_own else None
        if runs is not None:
            code: list[cgen.Generable] = head + batch
            if plan.par == "inner":
                code.append(cgen.Pragma("omp for schedule(static)"))
            code += [runs, self.b.node(child, marks)]
            return cgen.Block(code)
        if inner_is_own and len(own) > 1:
            # several dims flattened (conv2d's output pixels): decompose the panel's start
            # once, then step the dims with carries, no division per element
            base = _decompose([f"mk_b{n}" for n in own_names], own_ext, f"{start} + mk_xp")
            def carry(k: int) -> cgen.Generable:  # dim k one up, overflowing into k - 1
                if k == 0:
                    return cgen.Statement(f"++{own_names[0]}")
                return cgen.If(f"++{own_names[k]} == {own_ext[k]}",
                               cgen.Block([cgen.Assign(own_names[k], "0"), carry(k - 1)]))
            step = carry(len(own_names) - 1)
            nest = cgen.Block(base + [cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Block(
                k_vars + [cgen.Statement(f"long {n} = mk_b{n}") for n in own_names] + [
                    cgen.Statement("long mk_x = 0"),
                    cgen.For("", f"mk_x < {valid}", "mk_x++",
                             cgen.Block([cgen.Assign(dst, value), step])),
                    cgen.For("", f"mk_x < {tile}", "mk_x++", cgen.Assign(dst, "0.0f"))]))])
        elif inner_is_own:
            # a whole panel copies `tile` elements per K row: a fixed trip count, two 8-wide
            # moves for a plain load. `omp simd`: left to itself gcc sometimes unrolls it
            # into scalar moves, unsure the panel does not alias the operand (batched
            # 16x(256x64 @ 64x256): the pack took as long as the multiplies)
            row = cgen.For("long mk_x = 0", f"mk_x < {tile}", "mk_x++",
                           cgen.Block(x_vars + [cgen.Assign(dst, value)]))
            full = cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Block(
                k_vars + [cgen.Pragma("omp simd"), row]))
            edge = cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Block(k_vars + [
                cgen.Statement("long mk_x = 0"),
                cgen.For("", f"mk_x < {valid}", "mk_x++", cgen.Block(x_vars + [cgen.Assign(dst, value)])),
                cgen.For("", f"mk_x < {tile}", "mk_x++", cgen.Assign(dst, "0.0f"))]))
            nest = cgen.If(f"{valid} == {tile}", full, edge)
        else:
            if len(red_names) > 1:
                # K flattens several dims (conv2d's channels x window): decompose the
                # block's start once per element row, then step them with carries
                def kcarry(k: int) -> cgen.Generable:
                    if k == 0:
                        return cgen.Statement(f"++{red_names[0]}")
                    return cgen.If(f"++{red_names[k]} == {red_ext[k]}",
                                   cgen.Block([cgen.Assign(red_names[k], "0"), kcarry(k - 1)]))
                k_head = _decompose([f"mk_b{n}" for n in red_names], red_ext, "mk_k0")
                k_head += [cgen.Statement(f"long {n} = mk_b{n}") for n in red_names]
                p_body = [cgen.Assign(dst, value), kcarry(len(red_names) - 1)]
            else:
                k_head, p_body = [], k_vars + [cgen.Assign(dst, value)]
            nest = cgen.Block([
                cgen.For("long mk_x = 0", f"mk_x < {valid}", "mk_x++", cgen.Block(x_vars + k_head + [
                    cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Block(p_body))])),
                cgen.For(f"long mk_x = {valid}", f"mk_x < {tile}", "mk_x++", cgen.For(
                    "long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Assign(dst, "0.0f")))])
            if len(own_names) == 1:
                # a whole panel K row by K row: `tile` streams read side by side, the
                # panel written in order
                row = cgen.For("long mk_x = 0", f"mk_x < {tile}", "mk_x++",
                               cgen.Block(x_vars + [cgen.Assign(dst, value)]))
                if len(red_names) > 1:
                    full = cgen.Block(k_head + [cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++",
                                                         cgen.Block([row, kcarry(len(red_names) - 1)]))])
                else:
                    full = cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Block(k_vars + [row]))
                nest = cgen.If(f"{valid} == {tile}", full, nest)
                if len(red_names) == 1:
                    nest = self._transposed_rows(expr, view.out_iter[own[0]], view.red[0], tile,
                                                 start, valid) or nest
        panel = cgen.Block([
            cgen.Statement(f"float *restrict mk_dst = {buf} + mk_xp * mk_kc"),
            cgen.Statement(f"const long {valid} = min({tile}, {total} - ({start} + mk_xp))"),
            nest])
        loop = cgen.For("long mk_xp = 0", f"mk_xp < {size}", f"mk_xp += {tile}", panel)
        code: list[cgen.Generable] = head + batch
        if plan.par == "inner":
            code.append(cgen.Pragma("omp for schedule(static)"))
        code.append(loop)
        code.append(self.b.node(child, marks))
        return cgen.Block(code)

    def _run_nest(self, expr: Expr, own_names: list[str], own_ext: list[int],
                  own_pos: list[int], tile: int, start: str, size: str, buf: str, k_vars,
                  cap: int) -> cgen.Generable | None:
        """Packing by runs, one K row at a time (the loop over K rows is what the team
        shares): the row's elements over the block's own range are gathered into a
        thread-private row, split where the innermost own dim wraps; within a run every
        guard is an interval of that dim and the load walks memory with a fixed stride,
        so each run is a zero fill, a bounds-free (unit stride: vectorised) copy and a zero
        fill. The row is then copied into the panels `tile` floats at a time. conv2d's
        padded gather takes this path. None when the operand is not a (guarded) load
        affine in the iterators, or is a plain load along one dim (already vectorised)."""
        if isinstance(expr, Guarded):
            bounds, load, other = expr.bounds, expr.then, expr.otherwise
            if not isinstance(other, Const):
                return None
        else:
            bounds, load, other = (), expr, None
        if not isinstance(load, Load) or not load.index or not all(
                isinstance(e, Aff) for e in load.index):
            return None
        arr = self.b.arrays[load.tensor]
        if arr.kept == () or load.dtype != "float32":
            return None
        if not bounds and len(own_names) == 1:
            return None  # a plain contiguous load: the element loop vectorises as it is
        q, qname, E = own_pos[-1], own_names[-1], own_ext[-1]
        # the load's address stride along q
        dims = range(arr.type.ndim) if arr.kept is None else arr.kept
        cq, stride = 0, 1
        for d in reversed(dims):
            cq += dict(load.index[d].terms).get(q, 0) * stride
            stride *= arr.type.shape[d]
        if cq < 0:
            return None
        names = lambda pos: f"mk_s{pos}"
        outer, lo_terms, hi_terms = [], [], []
        for b in bounds:
            a = dict(b.aff.terms).get(q, 0)
            if a == 0:
                r = b.aff.render(names)
                outer.append(f"{b.lo} <= ({r}) && ({r}) < {b.hi}")
            elif a == 1:
                rest = Aff(tuple((p_, c) for p_, c in b.aff.terms if p_ != q), b.aff.const)
                r = rest.render(names)
                lo_terms.append(f"{b.lo} - ({r}) - {qname}")
                hi_terms.append(f"{b.hi} - ({r}) - {qname}")
            else:
                return None
        zero = ExprPrinter(self.b.arrays, names).value(other) if other is not None else "0.0f"
        src = ExprPrinter(self.b.arrays, lambda pos: "mk_q" if pos == q else f"mk_s{pos}"
                          ).access(load.tensor, load.index)

        def carry(k: int) -> cgen.Generable:  # dim k one up, overflowing into k - 1
            if k == 0:
                return cgen.Statement(f"++{own_names[0]}")
            return cgen.If(f"++{own_names[k]} == {own_ext[k]}",
                           cgen.Block([cgen.Assign(own_names[k], "0"), carry(k - 1)]))

        step: list[cgen.Generable] = [cgen.Statement(f"{qname} += mk_run")]
        if len(own_names) > 1:
            step.append(cgen.If(f"{qname} == {E}",
                                cgen.Block([cgen.Assign(qname, "0"), carry(len(own_names) - 2)])))
        limits = [cgen.Statement(f"mk_lo = max(mk_lo, {t})") for t in lo_terms]
        limits += [cgen.Statement(f"mk_hi = min(mk_hi, {t})") for t in hi_terms]
        limits += [cgen.Statement("mk_lo = min(mk_lo, mk_run)"),
                   cgen.Statement("mk_hi = max(mk_hi, mk_lo)")]
        if outer:
            limits = [cgen.If(" && ".join(outer), cgen.Block(limits),
                              cgen.Block([cgen.Statement("mk_hi = 0")]))]
        load_at = "mk_src[mk_t]" if cq == 1 else f"mk_src[mk_t * {cq}]"
        copy: cgen.Generable = cgen.For("long mk_t = 0", "mk_t < mk_hi - mk_lo", "mk_t++",
                                        cgen.Assign("mk_o[mk_t]", load_at))
        run = cgen.Block([
            cgen.Statement(f"const long mk_run = min({size} - mk_x, {E} - {qname})"),
            cgen.Statement("long mk_lo = 0, mk_hi = mk_run"),
            *limits,
            cgen.For("long mk_t = 0", "mk_t < mk_lo", "mk_t++", cgen.Assign("mk_d[mk_x + mk_t]", zero)),
            cgen.If("mk_lo < mk_hi", cgen.Block([
                cgen.Statement(f"const long mk_q = {qname} + mk_lo"),
                cgen.Statement(f"const float *restrict mk_src = &{src}"),
                cgen.Statement("float *restrict mk_o = mk_d + mk_x + mk_lo"),
                copy])),
            cgen.For("long mk_t = mk_hi", "mk_t < mk_run", "mk_t++",
                     cgen.Assign("mk_d[mk_x + mk_t]", zero)),
            cgen.Statement("mk_x += mk_run"),
            *step])
        base = _decompose([f"mk_b{n}" for n in own_names], own_ext, start)
        base += [cgen.Statement(f"long {n} = mk_b{n}") for n in own_names]
        G, row = _ROWS, cap + tile  # rows gathered per pass; each panel then gets G rows at once
        return cgen.For("long mk_pg = 0", "mk_pg < mk_kc", f"mk_pg += {G}", cgen.Block([
            cgen.Statement(f"float *restrict mk_rows = polyc_scratch(3, {4 * G * row})"),
            cgen.Statement(f"const long mk_g = min({G}, mk_kc - mk_pg)"),
            cgen.For("long mk_p = mk_pg", "mk_p < mk_pg + mk_g", "mk_p++", cgen.Block(
                k_vars + base + [
                    cgen.Statement(f"float *restrict mk_d = mk_rows + (mk_p - mk_pg) * {row}"),
                    cgen.Statement("long mk_x = 0"),
                    cgen.While(f"mk_x < {size}", run),
                    cgen.For("", f"mk_x % {tile}", "mk_x++", cgen.Assign("mk_d[mk_x]", "0.0f"))])),
            cgen.For("long mk_xp = 0", f"mk_xp < {size}", f"mk_xp += {tile}", cgen.Block([
                cgen.Statement(f"float *restrict mk_o = {buf} + mk_xp * mk_kc + mk_pg * {tile}"),
                cgen.If(f"mk_g == {G}", cgen.Block([cgen.Statement(
                    f"memcpy(mk_o + {g * tile}, mk_rows + {g * row} + mk_xp, {4 * tile})")
                    for g in range(G)]),
                    cgen.For("long mk_p = 0", "mk_p < mk_g", "mk_p++", cgen.Statement(
                        f"memcpy(mk_o + mk_p * {tile}, mk_rows + mk_p * {row} + mk_xp, {4 * tile})")))]))]))

    def _transposed_rows(self, expr: Expr, own: int, red: int, tile: int, start: str,
                         valid: str) -> cgen.Generable | None:
        """A panel of a plain load contiguous along K (a row-major A): one call of
        support.c's transposing packer, or None when the operand is anything else."""
        batch = {self.view.out_iter[d] for d in self.view.batch}
        if (tile > 16 or not isinstance(expr, Load) or expr.dtype != "float32"
                or not all(isinstance(e, Aff) for e in expr.index)
                or self.b.arrays[expr.tensor].kept is not None
                or not iterators(expr) <= {own, red} | batch):
            return None
        shape = self.b.arrays[expr.tensor].type.shape
        coef = {own: 0, red: 0}
        for d, e in enumerate(expr.index):
            for pos, c in e.terms:
                if pos in coef:
                    coef[pos] += c * _stride(shape, d)
        if coef[red] != 1 or coef[own] <= 0:
            return None
        at = ExprPrinter(self.b.arrays, lambda pos: f"({start} + mk_xp)" if pos == own
                         else "mk_k0" if pos == red else f"mk_s{pos}").access(expr.tensor, expr.index)
        return cgen.Statement(f"polyc_pack_rows_t(&{at}, {coef[own]}, {valid}, {tile}, mk_kc, mk_dst)")

    @staticmethod
    def _contiguous_along(expr: Expr, own: set[int]) -> bool:
        """Does the operand's first load walk memory along the tile's own dims (then
        the packing loop runs over them innermost), rather than along K?"""
        for load in loads_of(expr):
            if load.index:
                return bool(iterators(load.index[-1]) & own)
        return True

    # -- the tile: kernel call and write-back ---------------------------------------------
    def tile(self, child) -> cgen.Generable:
        plan, view, mk, rows = self.plan, self.view, self.mk, self.rows
        loops = self._tile_loops(set(plan.loops))
        s0 = view.stmt
        MR, NR = mk.mr, mk.nr
        it = loops.get("ir", loops.get("ic", "0"))
        jt = loops.get("jr", loops.get("jc", "0"))
        has_pc = "pc" in plan.loops
        h = self.b.arrays[s0.target]
        acc_name = "mk_acc" if self._acc_local() else h.c_name
        out = [cgen.Statement(f"const long mk_it = {it}"), cgen.Statement(f"const long mk_jt = {jt}"),
               cgen.Statement(f"const long mk_mr = min({MR}, {plan.m} - mk_it)"),
               cgen.Statement(f"const long mk_nr = min({NR}, {rows.width if rows else plan.n} - mk_jt)"),
               cgen.Statement("const float *restrict mk_ap = mk_pa + (mk_it - mk_i0) * mk_kc")]
        batch_vals = self._batch_values(loops)
        if rows is None:
            out.append(cgen.Statement("const float *restrict mk_bp = mk_pb + (mk_jt - mk_j0) * mk_kc"))
        else:
            bw = dict(rows.batch_weights)
            bbase = " + ".join(f"{v} * {bw[d]}" for d, v in batch_vals.items() if v != "0" and bw[d])
            out += [cgen.Statement(f"const float *restrict mk_bp = mk_P + {bbase or '0'} + mk_jt"),
                    cgen.Statement("const long *restrict mk_offk = mk_off + mk_k0")]
            # the tile's first column, and whether all its columns are real and consecutive
            names = [f"mk_j{d}" for d in view.cols]
            out += _virtual(names, rows.col_weights, "mk_jt")
            real = view.strides(view.cols)
            out.append(cgen.Statement("const long mk_jreal = " + " + ".join(
                f"{n} * {real[d]}" for n, d in zip(names, view.cols))))
            q = rows.inner
            straight = f"{names[q]} + {NR} <= {rows.col_extents[q]}" if q is not None else "0"
            out.append(cgen.Statement(f"const int mk_straight = {straight}"))
        boff = " + ".join(f"{v} * {_stride(view.shape, d)}" for d, v in batch_vals.items()
                          if v != "0") or "0"
        out.append(cgen.Statement(f"const long mk_boff = {boff}"))
        for d, v in batch_vals.items():
            out.append(cgen.Statement(f"const long mk_o{d} = {v}"))
        call = mk.c_function
        first, last = ("(mk_k0 == 0)", f"(mk_k0 + mk_kc >= {plan.k})") if has_pc else ("1", "1")
        # the direct path: a full tile accumulated in memory (C += A B), nothing to apply;
        # it needs a pc loop (else the only block is first and last) unless the result
        # is a plain zero-initialised output
        zero_init = isinstance(view.init.expr, Const) and view.init.expr.value == 0
        applies = bool(view.epilogue) or h.role != "out"
        direct = [f"mk_mr == {MR}", "mk_straight" if rows else f"mk_nr == {NR}"]
        direct += [] if zero_init else [f"!{first}"]
        direct += [f"!{last}"] if applies else []
        cptr = f"{acc_name} + mk_boff + mk_it * {plan.n} + {'mk_jreal' if rows else 'mk_jt'}"
        if rows is None:
            variant = mk.rows_variant  # computes only the tile's first mk_mr rows, mk_nr columns
            slow = [cgen.Statement(f"float mk_tile[{MR * NR}] __attribute__((aligned(64)))"),
                    cgen.Statement(f"{variant}(mk_kc, mk_ap, mk_bp, mk_tile, {NR}, 0, mk_mr, {NR})"
                                   if variant else f"{call}(mk_kc, mk_ap, mk_bp, mk_tile, {NR}, 0)")]
            kernel = f"{call}(mk_kc, mk_ap, mk_bp, {cptr}, {plan.n}, !{first})"
        else:
            variant = ""
            whole = cgen.Statement(f"{mk.b_rows_variant}(mk_kc, mk_ap, mk_bp, mk_offk, mk_tile, {NR}, 0)")
            slow = [cgen.Statement(f"float mk_tile[{MR * NR}] __attribute__((aligned(64)))"),
                    whole if rows.copy else cgen.If(f"mk_nr == {NR}", whole, self._edge_panel(call))]
            kernel = f"{mk.b_rows_variant}(mk_kc, mk_ap, mk_bp, mk_offk, {cptr}, {plan.n}, !{first})"
        if has_pc:
            slow.append(cgen.If(f"!{last}", self._partial(first, acc_name),
                                self._final(first, acc_name)))
        else:
            slow.append(self._final("1", acc_name))
        if has_pc or (zero_init and not applies):
            otherwise: cgen.Generable = cgen.Block(slow)
            if variant:  # an edge tile (M % MR, N % NR): fewer rows and columns, straight into C
                edge = cgen.Statement(
                    f"{variant}(mk_kc, mk_ap, mk_bp, {cptr}, {plan.n}, !{first}, mk_mr, mk_nr)")
                otherwise = cgen.If(" && ".join(direct[2:]), edge, otherwise) if direct[2:] else edge
            out.append(cgen.If(" && ".join(direct), cgen.Statement(kernel), otherwise))
        else:
            out += slow
        return cgen.Block(out)

    def _edge_panel(self, call: str) -> cgen.Generable:
        """The last virtual columns of a B read in place (not a copy with room past
        its end), fewer than a tile: their rows packed into a panel (zero past them), so
        nothing past B's end is read."""
        NR = self.mk.nr
        return cgen.Block([
            cgen.Statement(f"float *restrict mk_panel = polyc_scratch(0, {4 * NR} * mk_kc)"),
            cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Block([
                cgen.Statement(f"memcpy(mk_panel + mk_p * {NR}, mk_bp + mk_offk[mk_p], 4 * mk_nr)"),
                cgen.For("long mk_c = mk_nr", f"mk_c < {NR}", "mk_c++",
                         cgen.Assign(f"mk_panel[mk_p * {NR} + mk_c]", "0.0f"))])),
            cgen.Statement(f"{call}(mk_kc, mk_ap, mk_panel, mk_tile, {NR}, 0)")])

    def _rows_cols(self, body: list[cgen.Generable], simd: bool) -> cgen.Generable:
        view, MR, NR = self.view, self.mk.mr, self.mk.nr
        rows = _decompose([f"mk_o{d}" for d in view.rows], [view.shape[d] for d in view.rows],
                          "mk_it + mk_r")
        def col_loop(cols: list[cgen.Generable], lo: str, nr: str) -> cgen.Generable:
            inner = cgen.For(f"long mk_c = {lo}", f"mk_c < {nr}", "mk_c++", cgen.Block(cols + body))
            return cgen.Module([cgen.Pragma("omp simd"), inner]) if simd else inner

        def nest(mr: str, cols: list[cgen.Generable], lo: str, nr: str) -> cgen.Generable:
            return cgen.For("long mk_r = 0", f"mk_r < {mr}", "mk_r++",
                            cgen.Block(rows + [col_loop(cols, lo, nr)]))
        if self.rows is not None:
            return self._virtual_rows_cols(rows, col_loop, nest)
        cols = _decompose([f"mk_o{d}" for d in view.cols], [view.shape[d] for d in view.cols],
                          "mk_jt + mk_c")
        if not simd:
            return nest("mk_mr", cols, "0", "mk_nr")
        # a full tile with constant bounds: gcc unrolls it into independent vectors, so
        # a long epilogue (gelu's exp and division) is not bound by one vector's latency
        return cgen.If(f"mk_mr == {MR} && mk_nr == {NR}", cgen.Block([nest(str(MR), cols, "0", str(NR))]),
                       cgen.Block([nest("mk_mr", cols, "0", "mk_nr")]))

    def _virtual_rows_cols(self, rows_decl, col_loop, nest) -> cgen.Generable:
        """The write-back over virtual columns (B read by rows): a tile inside one
        output row as a plain full tile; any other by runs, each the columns up to the
        next wrap of the innermost dim, of which those inside the output are written
        (no division per element)."""
        view, rows, MR = self.view, self.rows, self.mk.mr
        names = [f"mk_o{d}" for d in view.cols]
        W, ext = rows.col_weights, rows.col_extents
        q = rows.inner
        if q is None:  # a single column
            cols = [cgen.Statement(f"const long {n} = 0") for n in names]
            return nest("mk_mr", cols, "0", "mk_nr")
        after = [cgen.Statement(f"const long {names[k]} = 0") for k in range(q + 1, len(names))]
        fixed = [cgen.Statement(f"const long {names[k]} = mk_j{view.cols[k]}") for k in range(q)]
        straight = nest(str(MR), fixed + after + [
            cgen.Statement(f"const long {names[q]} = mk_j{view.cols[q]} + mk_c")], "0", str(self.mk.nr))
        radix = next((W[k] for k in reversed(range(q)) if W[k]), None)
        outer = _virtual(names[:q], W[:q], "mk_jt + mk_c0")
        valid = " && ".join(f"{names[k]} < {ext[k]}" for k in range(q) if W[k]) or "1"
        at = "mk_jt + mk_c0"
        run = col_loop(after + [cgen.Statement(f"const long {names[q]} = mk_q + mk_c - mk_c0")],
                       "mk_c0", "mk_end")
        by_runs = cgen.For("long mk_r = 0", "mk_r < mk_mr", "mk_r++", cgen.Block(
            rows_decl + [cgen.For("long mk_c0 = 0, mk_run", "mk_c0 < mk_nr", "mk_c0 += mk_run", cgen.Block(
                outer + [
                    cgen.Statement(f"const long mk_q = {f'({at}) % {radix}' if radix else at}"),
                    cgen.Assign("mk_run", f"min(mk_nr - mk_c0, {radix} - mk_q)"
                                if radix else "mk_nr - mk_c0"),
                    cgen.Statement(f"const long mk_end = mk_c0 + min(mk_run, {ext[q]} - mk_q)"),
                    cgen.If(valid, run)]))]))
        return cgen.If(f"mk_straight && mk_mr == {MR}", cgen.Block([straight]), cgen.Block([by_runs]))

    def _col(self) -> str:
        """The flat output column of the write-back's element (mk_c of the tile)."""
        if self.rows is None:
            return "mk_jt + mk_c"
        real = self.view.strides(self.view.cols)
        return " + ".join(f"mk_o{d} * {real[d]}" for d in self.view.cols)

    def _init_value(self, first: str, acc_name: str) -> str:
        view = self.view
        p = ExprPrinter(self.b.arrays, lambda pos: f"mk_o{pos}")
        init = p.value(view.init.expr)
        if first == "1":
            return init
        mem = f"{acc_name}[mk_boff + (mk_it + mk_r) * {self.plan.n} + {self._col()}]"
        return f"({first} ? {init} : {mem})"

    def _partial(self, first: str, acc_name: str) -> cgen.Generable:
        NR = self.mk.nr
        mem = f"{acc_name}[mk_boff + (mk_it + mk_r) * {self.plan.n} + {self._col()}]"
        body = [cgen.Assign(mem, f"mk_tile[mk_r * {NR} + mk_c] + {self._init_value(first, acc_name)}")]
        return cgen.Block([self._rows_cols(body, simd=False)])

    def _final(self, first: str, acc_name: str) -> cgen.Generable:
        view, NR = self.view, self.mk.nr
        s0 = view.stmt
        ctype = C_TYPE[s0.dtype]
        body = [cgen.Statement(f"const {ctype} mk_v = mk_tile[mk_r * {NR} + mk_c] + "
                               f"{self._init_value(first, acc_name)}")]
        scalars = {s0.target: "mk_v"}
        plain = ExprPrinter(self.b.arrays, lambda pos: f"mk_o{pos}")
        if self.b.arrays[s0.target].role == "out":
            body.append(cgen.Assign(plain.access(s0.target, view.init.index), "mk_v"))
        for k, e in enumerate(view.epilogue):
            p = _Scalars(self.b.arrays, lambda pos: f"mk_o{pos}", scalars)
            name = f"mk_e{k}"
            body.append(cgen.Statement(f"const {C_TYPE[e.dtype]} {name} = {p.value(e.expr)}"))
            scalars[e.target] = name
            if self.b.arrays[e.target].role == "out":
                body.append(cgen.Assign(plain.access(e.target, e.index), name))
        return cgen.Block([self._rows_cols(body, simd=True)])

    # -- row kernels -------------------------------------------------------------------
    def row(self, name: str, child, marks) -> cgen.Generable:
        kind, stmt_name = name.split()[1], name.split()[2]
        node = child
        while node.get_type() == _T.mark:
            node = node.mark_get_node()
        s = self.b.statements.get(stmt_name)
        if s is None or node.get_type() != _T.for_ or node.for_get_body().get_type() != _T.user:
            return self.b.node(child, marks)
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
            return self.b.node(child, marks)
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
        return registry.c_source(self.used) if self.used else ""


# K rows packed per pass of the run packer (emit.py's _run_nest)
_ROWS = 8


def _up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def _stride(shape: tuple[int, ...], d: int) -> int:
    w = 1
    for n in shape[d + 1:]:
        w *= n
    return w


__all__ = ["MicrokernelEmitter", "handles"]
