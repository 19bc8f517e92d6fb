"""B read in place by rows (`b_rows` mark, `analysis.BRows`): the padded copy, the K
rows' offsets, edge panels, and the write-back over virtual columns."""
from __future__ import annotations

import math

import cgen

from ....codegen.ast_to_c import if_
from ....codegen.cexpr import ExprPrinter
from ....kernel.comprehension import Aff, Const
from ....microkernels import registry
from .common import decompose, read_only, stride, virtual


class BRowsMixin:
    def prepare_rows(self, child, outer) -> cgen.Generable:
        """B read in place (`analysis.BRows`): its padded copy, once per call or per
        batch point (`slices`: the mark is then inside the batch loop), and the offset of
        each K row in it. The team shares both loops (par=inner or rows; each `omp for` ends in a
        barrier, so both are complete before any tile reads them); par=batch with slices:
        each thread copies its own batch points into its own buffer."""
        rows, plan, view = self.rows, self.plan, self.view
        arr = self.b.arrays[rows.tensor]
        code: list[cgen.Generable] = [cgen.Comment(
            f"B read in place, K row by K row, from {arr.c_name}"
            + (f" padded to [{','.join(map(str, rows.shape))}]" if rows.copy else "")
            + f"; {rows.width} virtual columns for {plan.n}")]
        team = plan.par in ("inner", "rows")  # one copy for the team
        if not team:
            code += self._buffers("b")
        share = {"inner": "omp for schedule(static)", "rows": "omp for schedule(static)",
                 "batch": "omp parallel for schedule(static)"
                          + (f" num_threads({plan.threads})" if plan.threads else "")
                 if not rows.slices else None}.get(plan.par)
        if rows.copy:
            loops = self._tile_loops({f"b{d}" for _, d in rows.slices})
            code += self._pad_copy(share, {t: loops.get(f"b{d}", "0") for t, d in rows.slices})
        k_names = [f"mk_r{p}" for p in view.red]
        weights = dict(rows.red_weights)
        off = " + ".join([str(rows.const)] + [f"{weights[p]} * mk_r{p}" for p in view.red
                                               if weights[p]] + self._split_offsets())
        loop = cgen.For("long mk_k = 0", f"mk_k < {plan.k}", "mk_k++", cgen.Block(
            decompose(k_names, [view.stmt.extents[p] for p in view.red], "mk_k")
            + [cgen.Assign("mk_off[mk_k]", off)]))
        # the kernels' look-ahead past the last K step: row 0, fetched and never read (in
        # a team, one thread, before the loop whose barrier publishes both)
        pad = cgen.For(f"long mk_k = {plan.k}", f"mk_k < {plan.k + registry.B_ROWS_AHEAD}",
                       "mk_k++", cgen.Assign("mk_off[mk_k]", "0"))
        code += ([cgen.Pragma("omp single nowait"), pad, cgen.Pragma(share), loop] if team
                 else [pad, loop])
        code.append(self.b.node(child, outer))
        return cgen.Block(code)

    def _split_offsets(self) -> list[str]:
        """off(k)'s part in each phase-split dim: its phase and its index in the phase."""
        out = []
        for terms, const, s, wp, wq in self.rows.split:
            r = Aff(terms, const).render(lambda p: f"mk_r{p}")
            out.append(f"(({r}) % {s}) * {wp} + (({r}) / {s}) * {wq}")
        return out

    def _pad_copy(self, share: str | None, fixed: dict[int, str]) -> list[cgen.Generable]:
        """P row by row (its last dim): the pad value where an outer index is out of the
        valid range, else pad, a copy of the valid middle, pad. A last dim split into s
        phases is copied a tensor row at a time into its s rows of P (`_phase_rows`).
        The tensor dims in `fixed` take that index (`BRows.slices`: P holds one batch
        point)."""
        rows = self.rows
        arr = self.b.arrays[rows.tensor]
        lo, valid, layout = rows.lo, rows.valid, rows.layout
        shape = tuple(1 if phase is False and d in fixed else n
                      for (d, phase), n in zip(layout, rows.shape))
        n, W = len(shape), shape[-1]
        last = layout[-1][0]
        s = rows.phases[last]
        # the rows one pass writes: every P row, or with phases every tensor row (the
        # last dim's phase dim left out of the pass's index)
        kp = layout.index((last, True)) if s > 1 else None
        dims = [k for k in range(n - 1) if k != kp]
        names = [f"mk_u{k}" for k in range(n - 1)]
        outer = math.prod(shape[k] for k in dims)
        # each tensor dim's index: lo + s * (its index in P) + (its phase in P)
        at = {d: [v] for d, v in fixed.items()}
        for k, (d, phase) in enumerate(layout[:-1]):
            if d in fixed or k == kp:
                continue
            at.setdefault(d, [str(lo[d])]).append(
                names[k] if phase or rows.phases[d] == 1 else f"{rows.phases[d]} * {names[k]}")
        index = {d: " + ".join(terms) for d, terms in at.items()}
        src_strides = [stride(arr.type.shape, d) for d in range(len(lo))]
        reach = {d: lo[d] + rows.phases[d] * shape[layout.index((d, False))] - 1
                 for d in range(len(lo))}  # the largest index P holds
        inside = " && ".join(f"{valid[d][0]} <= {index[d]} && {index[d]} < {valid[d][1]}"
                             for d in sorted(index) if d != last
                             and (lo[d] < valid[d][0] or reach[d] >= valid[d][1])) or "1"
        src = " + ".join([arr.c_name] + [f"({index[d]}) * {src_strides[d]}"
                                         for d in sorted(index) if d != last])
        first = lo[last]  # the last dim's first element (of phase 0)
        pad = ExprPrinter(self.b.arrays, lambda pos: "0").value(Const(rows.pad, "float32"))
        row = "mk_u" if kp is None else " + ".join(
            f"{names[k]} * {math.prod(shape[k + 1:n - 1])}" for k in dims)
        body = decompose([names[k] for k in dims], [shape[k] for k in dims], "mk_u")
        body.append(cgen.Statement(f"float *restrict mk_d = mk_P + ({row}) * {W}"))
        if kp is None:
            step = 0
            body += self._pad_row(first, valid[last], W, src, inside, pad)
        else:  # a phase's row is `step` floats past the one before
            step = math.prod(shape[kp + 1:n - 1]) * W
            body += self._phase_rows(first, s, step, valid[last], W, src, inside, pad)
        # room past P's last row (the last phase's) for a tile's full width: kernels read it
        body.append(if_(f"mk_u == {outer - 1}", cgen.For(
            f"long mk_t = {W}", f"mk_t < {W + self.mk.nr}", "mk_t++",
            cgen.Assign(f"mk_d[{(s - 1) * step} + mk_t]", pad))))
        # (an image's copy: its batch index is the loop's around, not one of P's)
        loop = cgen.For("long mk_u = 0", f"mk_u < {outer}", "mk_u++", cgen.Block(read_only(body)))
        return ([cgen.Pragma(share)] if share else []) + [loop]

    @staticmethod
    def _pad_row(first: int, valid: tuple[int, int], W: int, src: str, inside: str,
                 pad: str) -> list[cgen.Generable]:
        """One P row of a dim without phases: pad, the valid middle by memcpy, pad."""
        v0, v1 = valid
        return [
            cgen.Statement("long mk_lo = 0, mk_hi = 0"),
            if_(inside, cgen.Block([
                cgen.Assign("mk_lo", f"max(0, {v0 - first})"),
                cgen.Assign("mk_hi", f"max(mk_lo, min({W}, {v1 - first}))")])),
            cgen.For("long mk_t = 0", "mk_t < mk_lo", "mk_t++", cgen.Assign("mk_d[mk_t]", pad)),
            if_("mk_hi > mk_lo", cgen.Statement(
                f"memcpy(mk_d + mk_lo, {src} + mk_lo + ({first}), 4 * (mk_hi - mk_lo))")),
            cgen.For("long mk_t = mk_hi", f"mk_t < {W}", "mk_t++", cgen.Assign("mk_d[mk_t]", pad))]

    @staticmethod
    def _phase_rows(first: int, s: int, step: int, valid: tuple[int, int], W: int, src: str,
                    inside: str, pad: str) -> list[cgen.Generable]:
        """The s rows of P (`step` floats apart) that one tensor row's s phases fill,
        P[ph][t] = x[first + s*t + ph], in one pass reading the row once and in order
        (gcc loads it in vectors and deals them out; a pass per phase, reading every s-th
        float, left 1x128x56x56 /2's copy and write-back 0.45 ms at best against 0.25,
        the whole call 2-3% slower). Where every phase of t is valid the copy needs no
        test: all of t but an edge or two."""
        v0, v1 = valid
        t0 = min(W, max(0, -(-(v0 - first) // s)))  # the first t whose s columns are valid
        t1 = max(t0, min(W, (v1 - first) // s))  # one past the last

        def element(ph: int, guarded: bool) -> cgen.Generable:
            value = f"mk_s[{s} * mk_t + {ph}]"
            if guarded:
                col = f"{first + ph} + {s} * mk_t"
                value = f"({v0} <= {col} && {col} < {v1} ? {value} : {pad})"
            return cgen.Assign(f"mk_d[{ph * step} + mk_t]", value)

        def loop(lo: int, hi: int, guarded: bool) -> list[cgen.Generable]:
            return [cgen.For(f"long mk_t = {lo}", f"mk_t < {hi}", "mk_t++", cgen.Block(
                [element(ph, guarded) for ph in range(s)]))] if hi > lo else []

        fill = cgen.For("long mk_t = 0", f"mk_t < {W}", "mk_t++", cgen.Block(
            [cgen.Assign(f"mk_d[{ph * step} + mk_t]", pad) for ph in range(s)]))
        copy = cgen.Block([cgen.Statement(f"const float *mk_s = {src} + {first}")]
                          + loop(0, t0, True) + loop(t0, t1, False) + loop(t1, W, True))
        return [if_(inside, copy, fill)]

    # -- packing ---------------------------------------------------------------------------

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


    def _straight_cols(self) -> list[cgen.Generable]:
        """The output's column indices (`mk_o{d}`) of the tile's column mk_c, for a tile
        inside one output row (`mk_straight`): the tile's own above the innermost dim, 0
        below it."""
        view, q = self.view, self.rows.inner
        after = [cgen.Statement(f"const long mk_o{d} = 0") for d in view.cols[q + 1:]]
        fixed = [cgen.Statement(f"const long mk_o{d} = mk_j{d}") for d in view.cols[:q]]
        d = view.cols[q]
        return fixed + after + [cgen.Statement(f"const long mk_o{d} = mk_j{d} + mk_c")]

    def _virtual_rows_cols(self, rows_decl, col_loop, nest, lanes) -> cgen.Generable:
        """The write-back over virtual columns (B read by rows): a tile inside one
        output row as a plain full tile; any other by runs, each the columns up to the
        next wrap of the innermost dim, of which those inside the output are written
        (no division per element); both on `lanes` where given (`_lanes`)."""
        view, rows, MR = self.view, self.rows, self.mk.mr
        names = [f"mk_o{d}" for d in view.cols]
        W, ext = rows.col_weights, rows.col_extents
        q = rows.inner
        if q is None:  # a single column
            cols = [cgen.Statement(f"const long {n} = 0") for n in names]
            return nest("mk_mr", cols, "0", "mk_nr")
        after = [cgen.Statement(f"const long {names[k]} = 0") for k in range(q + 1, len(names))]
        straight = nest(str(MR), self._straight_cols(), "0", str(self.mk.nr))
        radix = next((W[k] for k in reversed(range(q)) if W[k]), None)
        outer = virtual(names[:q], W[:q], "mk_jt + mk_c0")
        valid = " && ".join(f"{names[k]} < {ext[k]}" for k in range(q) if W[k]) or "1"
        at = "mk_jt + mk_c0"
        run_cols = after + [cgen.Statement(f"const long {names[q]} = mk_q + mk_c - mk_c0")]
        run = (col_loop(run_cols, "mk_c0", "mk_end") if lanes is None
               else lanes.run(run_cols, "mk_c0", "mk_end"))
        by_runs = cgen.For("long mk_r = 0", "mk_r < mk_mr", "mk_r++", cgen.Block(
            rows_decl + [cgen.For("long mk_c0 = 0, mk_run", "mk_c0 < mk_nr", "mk_c0 += mk_run", cgen.Block(
                outer + [
                    cgen.Statement(f"const long mk_q = {f'({at}) % {radix}' if radix else at}"),
                    cgen.Assign("mk_run", f"min(mk_nr - mk_c0, {radix} - mk_q)"
                                if radix else "mk_nr - mk_c0"),
                    cgen.Statement(f"const long mk_end = mk_c0 + min(mk_run, {ext[q]} - mk_q)"),
                    if_(valid, run)]))]))
        if lanes is not None:  # any tile inside one output row, its rows up to mk_mr
            return if_("mk_straight", cgen.Block([lanes.tile(self._straight_cols())]),
                       cgen.Block([by_runs]))
        if self.plan.row_tile == 2:  # a split tile's columns are no virtual run: straight
            return if_("mk_straight", cgen.Block([nest("mk_mr", self._straight_cols(), "0",
                                                       str(self.mk.nr))]), cgen.Block([by_runs]))
        return if_(f"mk_straight && mk_mr == {MR}", cgen.Block([straight]), cgen.Block([by_runs]))

