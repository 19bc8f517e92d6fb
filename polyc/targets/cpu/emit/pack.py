"""Packing a block of a contraction's operand into the microkernel's panels (`pack_a`,
`pack_b` marks): whole panels by fixed-length copies, a row-major A by register
transposes (support.c), a gathered operand (conv2d's padded window) by runs."""
from __future__ import annotations

import math

import cgen

from ....codegen.ast_to_c import if_
from ....codegen.cexpr import ExprPrinter, c_size
from ....kernel.comprehension import Aff, Const, Expr, Guarded, Load
from ....microkernels.analysis import (flat_along, iterators, k_col_stride, k_row_stride,
                                        loads_of)
from .common import ROWS, decompose, kept, read_only, up

# panels packed side by side, K row by K row (`_panel_rows`): eight write streams (32,
# a 512-column block's, were slower on Zen 3)
GROUP = 8


class PackMixin:
    def pack(self, child, outer, side: str) -> cgen.Generable:
        plan, view, mk, t = self.plan, self.view, self.mk, self.plan.tiles
        in_place = side == "a" and plan.a == "rows"  # A's rows read where they are
        # the K block is set by the first pack: B's, or A's when B is packed below it
        def k_block(loops: dict[str, str]) -> list[cgen.Generable]:
            return [cgen.Statement(f"const long mk_k0 = {loops.get('pc', '0')}"),
                    cgen.Statement(f"const long mk_kc = min({t.kc}, {plan.k} - mk_k0)")]
        if side == "b":
            loops = self._tile_loops({f"b{d}" for d in view.batch} | {"jc", "pc"}
                                     | ({"ic"} if plan.batch_inside else set()))
            head = [] if plan.batch_inside else k_block(loops)
            head += [cgen.Statement(f"const long mk_j0 = {loops.get('jc', '0')}"),
                     cgen.Statement(f"const long mk_nc = min({t.nc}, {plan.n} - mk_j0)")]
            tile, total, own = mk.nr, plan.n, view.cols
            expr, start, size, buf = view.b_expr, "mk_j0", "mk_nc", "mk_pb"
            if self._acc_per_point():  # inside the batch loops: the thread's own
                head.append(self._acc_buffer(1))
        else:
            loops = self._tile_loops({f"b{d}" for d in view.batch} | {"jc", "pc", "ic"})
            head = k_block(loops) if self.rows is not None or plan.batch_inside else []
            head += [cgen.Statement(f"const long mk_i0 = {loops.get('ic', '0')}")]
            head += [] if in_place else [
                cgen.Statement(f"const long mk_mc = min({t.mc}, {plan.m} - mk_i0)")]
            tile, total, own = mk.mr, plan.m, view.rows
            expr, start, size, buf = view.a_expr, "mk_i0", "mk_mc", "mk_pa"
        then = self.then_pack(loops, plan.par == "inner") if side == "b" and plan.then else []
        if plan.whole(side):
            mine = [self.then_buffer()] if then and plan.par != "inner" else []
            # packed whole (`pack_once`, `pack_const`): the block's extent was the
            # packing's, which is not here
            return cgen.Block(read_only(head + mine + then + [
                cgen.Statement(f"float *restrict {buf} = {buf}w + {self._whole_offset(side)}"),
                self.b.node(child, outer)]))
        team = self._team_packs(side)
        if not team and not in_place:
            head += self._buffers(side)
        # iterator values: batch dims from their loops, own dims and K from the element
        batch = [cgen.Statement(f"const long mk_s{view.out_iter[d]} = {v}")
                 for d, v in self._batch_values(loops).items()
                 if view.out_iter[d] in iterators(expr)]
        if in_place:  # no panels: the tiles read the block's rows where they are
            start = self._row_start(expr, view.out_iter[own[0]], "mk_i0")
            return cgen.Block(head + batch + [
                cgen.Statement(f"const float *restrict mk_A = {start}"),
                self.b.node(child, outer)])
        fill = self._fill(side, expr, tile, total, own, start, size, buf, team)
        return cgen.Block(head + batch + fill + then + [self.b.node(child, outer)])

    def _team_packs(self, side: str) -> bool:
        """Does the team share the packing of `side`'s blocks, into one buffer? With
        par=inner both; with par=rows a B packed outside the row blocks, which every
        thread reads whole: packed by the team, not by each thread alone, 8x2048x7x7 to
        512 1x1 and 8x1024x14x14 to 2048 /2 took 0.96x the time at 2 threads, 1024^3
        0.97-0.98x, five more level, 1x2048x7x7 to 512 1.03x (its block of 49 columns
        packed in a few microseconds, a barrier's worth; Zen 5, in pairs of calls)."""
        plan = self.plan
        return plan.par == "inner" or (side == "b" and plan.par == "rows"
                                       and not plan.batch_inside)

    def pack_once(self) -> list[cgen.Generable]:
        """A packed whole, before the loop over images that would repack it for each
        (`Gemm.a` 'once'): K block by K block, row block by row block, each where the
        block's `pack_a` finds it (`_whole_offset`), one thread (8x256x28x28 to 256 3x3
        /2 had packed its 2.4 MB of weights once per image, 5% of its time)."""
        return [cgen.Statement(f"float *restrict mk_paw = polyc_scratch(1, "
                               f"{c_size(self.b.promotion('mk_pa').bytes)})"),
                self._whole("a")]

    def pack_const(self, side: str) -> list[cgen.Generable]:
        """A constant operand (`side` 'a' or 'b') packed whole as `pack_once` packs A, on
        the kernel's first call, into a buffer the loaded object keeps (`Gemm.a`/`Gemm.b`
        'const'). The comment names the constant's data (`Array.constant`): the unit,
        and so the object holding the panels, belongs to that data alone. Two threads
        calling first may both pack; one buffer is published, the other freed."""
        expr = self.view.a_expr if side == "a" else self.view.b_expr
        arr = self.b.arrays[expr.tensor]
        size = -(-self.b.promotion(f"mk_p{side}").bytes // 64) * 64
        return [cgen.Comment(f"{side.upper()}: the constant {arr.c_name} (data sha256 "
                             f"{arr.constant}), packed on the first call"),
                *kept(f"mk_const_{self.view.stmt.name}_{side}", f"mk_p{side}w", size,
                      [self._whole(side)])]

    def _whole(self, side: str) -> cgen.Generable:
        """All of an operand into mk_paw (A) or mk_pbw (B), block by block where each
        block's `pack_a` / `pack_b` finds it (`_whole_offset`)."""
        plan, view, mk, t = self.plan, self.view, self.mk, self.plan.tiles
        if side == "a":
            fill = self._fill("a", view.a_expr, mk.mr, plan.m, view.rows, "mk_i0", "mk_mc",
                              "mk_pa", team=False)
            start, size, step, total = "mk_i0", "mk_mc", t.mc, plan.m
        else:
            fill = self._fill("b", view.b_expr, mk.nr, plan.n, view.cols, "mk_j0", "mk_nc",
                              "mk_pb", team=False)
            start, size, step, total = "mk_j0", "mk_nc", t.nc, plan.n
        blocks = cgen.For(f"long {start} = 0", f"{start} < {total}", f"{start} += {step}",
                          cgen.Block([
            cgen.Statement(f"const long {size} = min({step}, {total} - {start})"),
            cgen.Statement(f"float *restrict mk_p{side} = mk_p{side}w + {self._whole_offset(side)}"),
            *fill]))
        return cgen.For("long mk_k0 = 0", f"mk_k0 < {plan.k}", f"mk_k0 += {t.kc}", cgen.Block([
            cgen.Statement(f"const long mk_kc = min({t.kc}, {plan.k} - mk_k0)"), blocks]))

    def _whole_offset(self, side: str) -> str:
        """Where block (mk_k0, mk_i0) of an A packed whole starts, or block (mk_k0,
        mk_j0) of a B: K blocks one after the other, each all of the operand's rows (A)
        or columns (B) in panels, rounded up to the kernel's tile."""
        if side == "a":
            return f"mk_k0 * {up(self.plan.m, self.mk.mr)} + mk_i0 * mk_kc"
        return f"mk_k0 * {up(self.plan.n, self.mk.nr)} + mk_j0 * mk_kc"

    def _fill(self, side: str, expr: Expr, tile: int, total: int, own: tuple[int, ...],
              start: str, size: str, buf: str, team: bool) -> list[cgen.Generable]:
        """The loop filling a block's panels (`buf`, from row or column `start`, `size`
        of them) from `expr`, its panels shared out by a `team`."""
        view, t = self.view, self.plan.tiles
        s0 = view.stmt
        p = ExprPrinter(self.b.arrays, lambda pos: f"mk_s{pos}")
        own_names = [f"mk_s{view.out_iter[d]}" for d in own]
        own_ext = [view.shape[d] for d in own]
        red_names = [f"mk_s{q}" for q in view.red]
        red_ext = [s0.extents[q] for q in view.red]
        value = p.value(expr)
        inner_is_own = self._contiguous_along(expr, {view.out_iter[d] for d in own})
        dst = f"mk_dst[mk_p * {tile} + mk_x]"
        k_vars = decompose(red_names, red_ext, "mk_k0 + mk_p")
        x_vars = decompose(own_names, own_ext, f"{start} + mk_xp + mk_x")
        valid = "mk_nv"
        share = [cgen.Pragma("omp for schedule(static)")] if team else []
        block = t.nc if side == "b" else t.mc
        edge = bool(total % tile or block % tile)
        flat = inner_is_own and len(own) > 1 and self._one_run(expr, own)
        if inner_is_own and (flat or len(own) == 1):
            prebuilt = self._column_panels(expr, own, tile, total, start, size, buf, share)
            if prebuilt is not None:
                return prebuilt
        if flat:
            # the own dims are one run in memory (a 1x1 stride-1 conv2d's pixels): the
            # last takes the flattened index, the others 0, packed K row by K row straight
            # from the operand (gathered into a row first, every float was copied twice:
            # 1x512x28x28 to 128 1x1, 1 thread, 5% slower)
            col = [*(cgen.Statement(f"const long {n} = 0") for n in own_names[:-1]),
                   cgen.Statement(f"const long {own_names[-1]} = {start} + mk_xp + mk_x")]
            return self._panel_rows(dst, value, col, k_vars, tile, total, start, size, buf,
                                    share, edge)
        runs = self._run_nest(expr, own_names, own_ext, [view.out_iter[d] for d in own], tile,
                              start, size, buf, k_vars,
                              up(min(t.nc if side == "b" else t.mc, total), tile)
                              ) if inner_is_own else None
        if runs is not None:
            return share + [runs]
        if inner_is_own and len(own) > 1:
            # several dims flattened (conv2d's output pixels): decompose the panel's start
            # once, then step the dims with carries, no division per element
            base = decompose([f"mk_b{n}" for n in own_names], own_ext, f"{start} + mk_xp")
            def carry(k: int) -> cgen.Generable:  # dim k one up, overflowing into k - 1
                if k == 0:
                    return cgen.Statement(f"++{own_names[0]}")
                return if_(f"++{own_names[k]} == {own_ext[k]}",
                           cgen.Block([cgen.Assign(own_names[k], "0"), carry(k - 1)]))
            step = carry(len(own_names) - 1)
            nest = cgen.Block(base + [cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Block(
                k_vars + [cgen.Statement(f"long {n} = mk_b{n}") for n in own_names] + [
                    cgen.Statement("long mk_x = 0"),
                    cgen.For("", f"mk_x < {valid}", "mk_x++",
                             cgen.Block([cgen.Assign(dst, value), step])),
                    cgen.For("", f"mk_x < {tile}", "mk_x++", cgen.Assign(dst, "0.0f"))]))])
        elif inner_is_own:
            return self._panel_rows(dst, value, x_vars, k_vars, tile, total, start, size, buf,
                                    share, edge)
        else:
            if len(red_names) > 1:
                # K flattens several dims (conv2d's channels x window): decompose the
                # block's start once per element row, then step them with carries
                def kcarry(k: int) -> cgen.Generable:
                    if k == 0:
                        return cgen.Statement(f"++{red_names[0]}")
                    return if_(f"++{red_names[k]} == {red_ext[k]}",
                               cgen.Block([cgen.Assign(red_names[k], "0"), kcarry(k - 1)]))
                k_head = decompose([f"mk_b{n}" for n in red_names], red_ext, "mk_k0")
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
                nest = if_(f"{valid} == {tile}", full, nest)
                nest = self._transposed_rows(expr, view.out_iter[own[0]], view.red, red_ext,
                                             tile, start, valid) or nest
        panel = cgen.Block([
            cgen.Statement(f"float *restrict mk_dst = {buf} + mk_xp * mk_kc"),
            cgen.Statement(f"const long {valid} = min({tile}, {total} - ({start} + mk_xp))"),
            nest])
        return share + [cgen.For("long mk_xp = 0", f"mk_xp < {size}", f"mk_xp += {tile}", panel)]

    def _panel_rows(self, dst: str, value: str, x_vars, k_vars, tile: int, total: int,
                    start: str, size: str, buf: str, share: list[cgen.Generable],
                    edge: bool = True) -> list[cgen.Generable]:
        """Panels whose `tile` elements are contiguous in a row of the operand, filled K
        row by K row across a group of them (`GROUP`, or a thread's share if less): each K
        row is read as one run over the group's panels. Panel by panel down all K rows
        read 64 bytes a row, a new page each (linear+gelu's 1024x4096 B, 1 thread: the
        pack's and the write-back's samples from 13-15% of the kernel's to 10%)."""
        # `omp simd`: left to itself gcc sometimes unrolls the row into scalar moves, unsure
        # the panel does not alias the operand (batched 16x(256x64 @ 64x256): the pack took
        # as long as the multiplies). A panel over the operand's edge is the same loop with
        # its missing elements masked to zeros (a scalar edge loop, which gcc vectorised
        # with an alias check and an unrolled remainder, was a fifth of gcc's time on
        # linear+gelu); a full panel has no mask to pay (matmul 127x255x383: 5% slower
        # with one); where blocks and the operand are whole panels (`edge` False), there is
        # no such panel to compile
        def row(v: str) -> cgen.Block:
            return cgen.Block([cgen.Pragma("omp simd"), cgen.For(
                "long mk_x = 0", f"mk_x < {tile}", "mk_x++",
                cgen.Block(x_vars + [cgen.Assign(dst, v)]))])
        panel = cgen.Block([
            cgen.Statement(f"float *restrict mk_dst = {buf} + mk_xp * mk_kc"),
            cgen.Statement(f"const long mk_nv = min({tile}, {total} - ({start} + mk_xp))"),
            if_(f"mk_nv == {tile}", row(value), row(f"mk_x < mk_nv ? ({value}) : 0.0f"))
        ] if edge else [cgen.Statement(f"float *restrict mk_dst = {buf} + mk_xp * mk_kc"),
                        row(value)])
        rows = cgen.For("long mk_p = 0", "mk_p < mk_kc", "mk_p++", cgen.Block(k_vars + [
            cgen.For("long mk_xp = mk_g", "mk_xp < mk_ge", f"mk_xp += {tile}", panel)]))
        return self._in_groups(tile, size, share, cgen.Block([
            cgen.Statement(f"const long mk_ge = min(mk_g + mk_gs, {size})"), rows]))

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
        dims = range(arr.type.ndim) if arr.kept is None else arr.kept

        def address_stride(pos: int) -> int:
            c, stride = 0, 1
            for d in reversed(dims):
                c += dict(load.index[d].terms).get(pos, 0) * stride
                stride *= arr.type.shape[d]
            return c
        q, cq = own_pos[-1], address_stride(own_pos[-1])
        if cq < 0:
            return None
        # the two innermost own dims one run where the outer steps E of the inner's
        # strides and there is no guard (folded 7x7 images of a 1x1 conv2d: a plane's 49
        # floats in one run, not 7 of 7; 8x2048x7x7 to 512 0.94-0.96x the time at 1
        # thread, 0.985x at 2, Zen 5, in pairs): the outer printed as 0, the inner over
        # both
        zeroed = frozenset()
        while (len(own_pos) > 1 and not bounds and type(own_ext[-1]) is int
               and address_stride(own_pos[-2]) == own_ext[-1] * cq):
            zeroed |= {own_pos[-2]}
            own_names = own_names[:-2] + own_names[-1:]
            own_ext = own_ext[:-2] + [own_ext[-2] * own_ext[-1]]
            own_pos = own_pos[:-2] + own_pos[-1:]
        qname, E = own_names[-1], own_ext[-1]
        names = lambda pos: f"mk_s{pos}"
        outer, lo_terms, hi_terms = [], [], []
        # a whole row's guards along q, its steps t with lo <= a t + rest < hi: the same
        # for every such row of a K row where rest holds no own dim (else None)
        row_bounds: list[tuple[str, str]] | None = []
        for b in bounds:
            a = dict(b.aff.terms).get(q, 0)
            if a < 0:
                return None
            if a == 0:
                r = b.aff.render(names)
                outer.append(f"{b.lo} <= ({r}) && ({r}) < {b.hi}")
                continue
            rest = Aff(tuple((p_, c) for p_, c in b.aff.terms if p_ != q), b.aff.const)
            r = rest.render(names)
            if a == 1:
                lo_terms.append(f"{b.lo} - ({r}) - {qname}")
                hi_terms.append(f"{b.hi} - ({r}) - {qname}")
                row = (f"{b.lo} - ({r})", f"{b.hi} - ({r})")
            else:  # a strided window's pad
                c = f"({r}) + {a} * {qname}"
                lo_terms.append(f"-floord({c} - ({b.lo}), {a})")
                hi_terms.append(f"floord({b.hi} - 1 - ({c}), {a}) + 1")
                row = (f"-floord(({r}) - ({b.lo}), {a})", f"floord({b.hi} - 1 - ({r}), {a}) + 1")
            if row_bounds is not None and not iterators(rest) & set(own_pos):
                row_bounds.append(row)
            else:
                row_bounds = None
        zero = ExprPrinter(self.b.arrays, names).value(other) if other is not None else "0.0f"
        src = ExprPrinter(self.b.arrays, lambda pos: "mk_q" if pos == q else
                          "0" if pos in zeroed else f"mk_s{pos}").access(load.tensor, load.index)

        def carry(k: int) -> cgen.Generable:  # dim k one up, overflowing into k - 1
            if k == 0:
                return cgen.Statement(f"++{own_names[0]}")
            return if_(f"++{own_names[k]} == {own_ext[k]}",
                       cgen.Block([cgen.Assign(own_names[k], "0"), carry(k - 1)]))

        step: list[cgen.Generable] = [cgen.Statement(f"{qname} += mk_run")]
        if len(own_names) > 1:
            step.append(if_(f"{qname} == {E}",
                            cgen.Block([cgen.Assign(qname, "0"), carry(len(own_names) - 2)])))
        limits = [cgen.Statement(f"mk_lo = max(mk_lo, {t})") for t in lo_terms]
        limits += [cgen.Statement(f"mk_hi = min(mk_hi, {t})") for t in hi_terms]
        limits += [cgen.Statement("mk_lo = min(mk_lo, mk_run)"),
                   cgen.Statement("mk_hi = max(mk_hi, mk_lo)")]
        if outer:
            limits = [if_(" && ".join(outer), cgen.Block(limits),
                          cgen.Block([cgen.Statement("mk_hi = 0")]))]
        load_at = "mk_src[mk_t]" if cq == 1 else f"mk_src[mk_t * {cq}]"
        copy: cgen.Generable = cgen.For("long mk_t = 0", "mk_t < mk_hi - mk_lo", "mk_t++",
                                        cgen.Assign("mk_o[mk_t]", load_at))
        source = [cgen.Statement(f"const long mk_q = {qname} + mk_lo"),
                  cgen.Statement(f"const float *restrict mk_src = &{src}")]

        def pad(first: str, end: str) -> cgen.Generable:  # the run's elements first..end
            return cgen.For(f"long mk_t = {first}", f"mk_t < {end}", "mk_t++",
                            cgen.Assign("mk_d[mk_x + mk_t]", zero))
        parts: cgen.Generable = cgen.Block([
            pad("0", "mk_lo"),
            if_("mk_lo < mk_hi", cgen.Block([
                *source, cgen.Statement("float *restrict mk_o = mk_d + mk_x + mk_lo"), copy])),
            pad("mk_hi", "mk_run")])
        if cq == 1:
            # a whole row of the dim (every run but a block's ends) as one loop of a
            # constant count, its pad masked: vector moves with a masked load, where the
            # three loops of variable count were scalar moves and a memset call for rows
            # of a few floats, a fifth of 8x512x7x7 3x3's time (Sapphire Rapids, 1 thread,
            # in pairs: 6-8% faster, 8x256x14x14 and 1x256x14x14 3x3 4-6%; AVX2 code 3%)
            masked = cgen.Block([cgen.Pragma("omp simd"), cgen.For(
                "long mk_t = 0", f"mk_t < {E}", "mk_t++", cgen.Assign(
                    "mk_d[mk_x + mk_t]",
                    f"mk_t >= mk_lo && mk_t < mk_hi ? mk_src[mk_t - mk_lo] : {zero}"))])
            whole = if_("mk_lo < mk_hi", cgen.Block([*source, masked]), pad("0", str(E)))
            parts = if_(f"mk_run == {E}", whole, parts)
        general = [cgen.Statement("long mk_lo = 0, mk_hi = mk_run"), *limits, parts]
        whole_row = self._whole_row(arr, load, zeroed | {q}, E, cq, row_bounds, outer, zero) \
            if row_bounds is not None else None
        per_row: list[cgen.Generable] = []
        if whole_row is not None:  # a whole row's copy first, the general path else
            per_row, first, cond, copy = whole_row
            general = [first, if_(cond, copy, cgen.Block(general))]
        run = cgen.Block([
            cgen.Statement(f"const long mk_run = min({size} - mk_x, {E} - {qname})"),
            *general,
            cgen.Statement("mk_x += mk_run"),
            *step])
        base = decompose([f"mk_b{n}" for n in own_names], own_ext, start)
        base += [cgen.Statement(f"long {n} = mk_b{n}") for n in own_names]
        G, row = ROWS, cap + tile  # rows gathered per pass; each panel then gets G rows at once
        return cgen.For("long mk_pg = 0", "mk_pg < mk_kc", f"mk_pg += {G}", cgen.Block([
            cgen.Statement(f"float *restrict mk_rows = polyc_scratch(3, {4 * G * row})"),
            cgen.Statement(f"const long mk_g = min({G}, mk_kc - mk_pg)"),
            cgen.For("long mk_p = mk_pg", "mk_p < mk_pg + mk_g", "mk_p++", cgen.Block(
                k_vars + per_row + base + [
                    cgen.Statement(f"float *restrict mk_d = mk_rows + (mk_p - mk_pg) * {row}"),
                    cgen.Statement("long mk_x = 0"),
                    cgen.While(f"mk_x < {size}", run),
                    cgen.For("", f"mk_x % {tile}", "mk_x++", cgen.Assign("mk_d[mk_x]", "0.0f"))])),
            cgen.For("long mk_xp = 0", f"mk_xp < {size}", f"mk_xp += {tile}", cgen.Block([
                cgen.Statement(f"float *restrict mk_o = {buf} + mk_xp * mk_kc + mk_pg * {tile}"),
                # every group but a block's last is full: told so, gcc copies its rows
                # with vector moves; a branch it guesses rare got a `rep movsl` per row,
                # ~30 cycles each (1x256x56x56 to 512 1x1 /2: 10% faster, Zen 3)
                if_(f"__builtin_expect(mk_g == {G}, 1)", cgen.Block([cgen.Statement(
                    f"memcpy(mk_o + {g * tile}, mk_rows + {g * row} + mk_xp, {4 * tile})")
                    for g in range(G)]),
                    cgen.For("long mk_p = 0", "mk_p < mk_g", "mk_p++", cgen.Statement(
                        f"memcpy(mk_o + mk_p * {tile}, mk_rows + mk_p * {row} + mk_xp, {4 * tile})")))]))]))

    def _whole_row(self, arr, load: Load, row: frozenset[int], E: int, cq: int,
                   row_bounds: list[tuple[str, str]], outer: list[str], zero: str
                   ) -> tuple[list[cgen.Generable], cgen.Generable, str, cgen.Generable] | None:
        """A run over a whole row of the innermost own dim (`row`: its position and any
        merged into it, `_run_nest`; E long, `cq` floats a step): its guards along it
        (`row_bounds`) are the same for every such run of a K row, so the K row works them
        out once (the statements returned first) and the run is one fixed-length copy of
        the row, the window's shift included, then the pad at its ends: (the K row's
        statements, the run's first element, the condition, the copy). The copy may read a
        float or two of the neighbouring rows, never outside the tensor (the condition
        checks; a run at its ends takes the general path). A masked copy with its bounds
        worked out per run had been most of the packing of 8x256x14x14 3x3 (1 thread, in
        pairs: 6-7% faster). None where the tensor's size is not fixed."""
        total = math.prod(arr.type.shape)
        if arr.kept is not None or arr.block is not None or type(total) is not int:
            return None
        flat = ExprPrinter(self.b.arrays, lambda pos: "0" if pos in row else f"mk_s{pos}"
                           ).flat(load.tensor, load.index)
        per_row = [cgen.Statement(f"long mk_wlo = 0, mk_whi = {E}")]
        per_row += [cgen.Statement(f"mk_wlo = max(mk_wlo, {lo})") for lo, _ in row_bounds]
        per_row += [cgen.Statement(f"mk_whi = min(mk_whi, {hi})") for _, hi in row_bounds]
        per_row.append(cgen.Statement("mk_whi = max(mk_whi, mk_wlo)"))
        cond = " && ".join([f"mk_run == {E}", *(f"({c})" for c in outer),
                            f"0 <= mk_f0 && mk_f0 + {cq * (E - 1)} < {total}"])
        copy = cgen.Statement(f"memcpy(mk_d + mk_x, &{arr.c_name}[mk_f0], {4 * E})") if cq == 1 \
            else cgen.Block([cgen.Pragma("omp simd"), cgen.For(
                "long mk_t = 0", f"mk_t < {E}", "mk_t++",
                cgen.Assign("mk_d[mk_x + mk_t]", f"{arr.c_name}[mk_f0 + {cq} * mk_t]"))])
        code = cgen.Block([
            copy,
            cgen.For("long mk_t = 0", "mk_t < mk_wlo", "mk_t++",
                     cgen.Assign("mk_d[mk_x + mk_t]", zero)),
            cgen.For("long mk_t = mk_whi", f"mk_t < {E}", "mk_t++",
                     cgen.Assign("mk_d[mk_x + mk_t]", zero))])
        return per_row, cgen.Statement(f"const long mk_f0 = {flat}"), cond, code

    def _transposed_rows(self, expr: Expr, own: int, red: tuple[int, ...], red_ext: list[int],
                         tile: int, start: str, valid: str) -> cgen.Generable | None:
        """A panel of a plain load contiguous along K (`analysis.k_row_stride`): one call
        of support.c's transposing packer, or None when the operand is anything else."""
        if tile > 48 or not isinstance(expr, Load) or self.b.arrays[expr.tensor].kept is not None:
            return None
        lda = k_row_stride(expr, own, red, red_ext, self.b.arrays[expr.tensor].type.shape,
                           {self.view.out_iter[d] for d in self.view.batch})
        if lda is None:
            return None
        return cgen.Statement(f"polyc_pack_rows_t({self._row_start(expr, own, f'{start} + mk_xp')}, "
                              f"{c_size(lda)}, {valid}, {tile}, mk_kc, mk_dst)")

    def _column_panels(self, expr: Expr, own: tuple[int, ...], tile: int, total: int,
                       start: str, size: str, buf: str, share: list[cgen.Generable]
                       ) -> list[cgen.Generable] | None:
        """A block of panels whose K rows are runs of a plain load (`analysis.k_col_stride`),
        a group of panels (as `_panel_rows` takes them) per call of support.c's packer, or
        None when the operand is anything else. The same loads and stores as
        `_panel_rows`, compiled once: that loop, with its edge panel, was a sixth of gcc's
        time on linear+gelu's unit."""
        view = self.view
        if tile > 48 or not isinstance(expr, Load) or self.b.arrays[expr.tensor].kept is not None:
            return None
        dims = [view.out_iter[d] for d in own]
        ld = k_col_stride(expr, dims, [view.shape[d] for d in own], view.red,
                          [view.stmt.extents[q] for q in view.red],
                          self.b.arrays[expr.tensor].type.shape,
                          {view.out_iter[d] for d in view.batch})
        if ld is None:
            return None
        at = ExprPrinter(self.b.arrays, lambda pos: "0" if pos in dims or pos in view.red
                         else f"mk_s{pos}").access(expr.tensor, expr.index)
        return self._in_groups(tile, size, share, cgen.Statement(
            f"polyc_pack_cols(&{at} + mk_k0 * {c_size(ld)} + {start} + mk_g, {c_size(ld)}, "
            f"mk_kc, min(mk_gs, {size} - mk_g), {total} - ({start} + mk_g), {tile}, "
            f"{buf} + mk_g * mk_kc)"))

    @staticmethod
    def _in_groups(tile: int, size: str, share: list[cgen.Generable],
                   body: cgen.Generable) -> list[cgen.Generable]:
        """`body` for each group of panels packed K row by K row together, from column
        mk_g of the block, mk_gs columns: GROUP panels, or with a team at most a
        thread's share, so that every thread has some."""
        group = f"{GROUP * tile}"
        if share:
            group = (f"min({group}, (({size} + {tile - 1}) / {tile} + omp_get_num_threads() - 1)"
                     f" / omp_get_num_threads() * {tile})")
        return [cgen.Block([cgen.Statement(f"const long mk_gs = {group}"), *share,
                            cgen.For("long mk_g = 0", f"mk_g < {size}", "mk_g += mk_gs", body)])]

    def _row_start(self, expr: Load, own: int, row: str) -> str:
        """The address of row `row`'s first element in the K block (mk_k0) of a plain
        load contiguous along K."""
        red = set(self.view.red)
        at = ExprPrinter(self.b.arrays, lambda pos: f"({row})" if pos == own
                         else "0" if pos in red else f"mk_s{pos}").access(expr.tensor, expr.index)
        return f"&{at} + mk_k0"

    def _one_run(self, expr: Expr, own: tuple[int, ...]) -> bool:
        """Does `expr`, an operand stored whole, read all of the block's own dims as one
        run in memory (`analysis.flat_along`)? (Folded images, each a run of its own,
        are under FOLD_COLUMNS columns: packed by runs.)"""
        view = self.view
        if not isinstance(expr, Load) or self.b.arrays[expr.tensor].kept is not None:
            return False
        return flat_along(expr, [view.out_iter[d] for d in own], [view.shape[d] for d in own],
                          self.b.arrays[expr.tensor].type.shape)

    @staticmethod
    def _contiguous_along(expr: Expr, own: set[int]) -> bool:
        """Does the operand's first load walk memory along the tile's own dims (then
        the packing loop runs over them innermost), rather than along K?"""
        for load in loads_of(expr):
            if load.index:
                return bool(iterators(load.index[-1]) & own)
        return True

