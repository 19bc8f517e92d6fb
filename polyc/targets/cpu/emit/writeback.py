"""A contraction tile (`microkernel` mark under a `gemm` one): the kernel call on the
packed panels and the write-back that applies the init and the epilogue in registers."""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import cgen

from ....codegen.ast_to_c import if_
from ....codegen.cexpr import INLINED_FNS, ExprPrinter, c_size
from ....errors import InternalError
from ....kernel.comprehension import Const, calls
from ....microkernels.analysis import (a_row_stride, flat_columns_from, iterators, loads_of,
                                        window_taps)
from .common import Scalars, decompose, in_scalars, read_only, stride, virtual
from .lanes import LANES, Lanes

# the target features whose masked vector loads and stores cost what plain ones do:
# AVX-512's. AVX2's vmaskmovps is slower (linear+gelu with its edge tiles masked ran
# 1% slower on Sapphire Rapids, and Zen's masked stores are microcoded).
MASKED_STORES = {"avx512f"}


class Written(NamedTuple):
    """A write-back on lanes (`WriteBackMixin._lanes`): `tile(cols)` a tile's, `run(cols,
    lo, hi)` the columns lo to hi of row mk_r, given the C of their output indices."""

    tile: Callable[[list], cgen.Generable]
    run: Callable[[list, str, str], cgen.Generable]


class WriteBackMixin:
    def tile(self, child) -> cgen.Generable:
        plan, view, mk, rows = self.plan, self.view, self.mk, self.rows
        loops = self._tile_loops(set(plan.loops))
        s0 = view.stmt
        MR, NR = mk.mr, mk.nr
        it = loops.get("ir", loops.get("ic", "0"))
        jt = loops.get("jr", loops.get("jc", "0"))
        if "jy" in plan.loops:  # a window kernel's tile: its row's start, then within it
            jt = f"{loops.get('jy', '0')} + {loops.get('jr', '0')}"
        has_pc = "pc" in plan.loops
        # A read in place: its row stride, which the tile's pointer and every call take
        lda = c_size(a_row_stride(view, self.b.kernel)) if plan.a == "rows" else ""
        h = self.b.arrays[s0.target]
        acc_name = "mk_acc" if self._acc_local() else h.c_name
        out = [cgen.Statement(f"const long mk_it = {it}"), cgen.Statement(f"const long mk_jt = {jt}"),
               cgen.Statement(f"const long mk_mr = min({MR}, {plan.m} - mk_it)"),
               cgen.Statement(f"const long mk_nr = min({NR}, {rows.width if rows else plan.n} - mk_jt)"),
               cgen.Statement("const float *restrict mk_ap = " + (
                   f"mk_A + (mk_it - mk_i0) * {lda}" if lda else "mk_pa + (mk_it - mk_i0) * mk_kc"))]
        batch_vals = self._batch_values(loops)
        if rows is None:
            out.append(cgen.Statement("const float *restrict mk_bp = mk_pb + (mk_jt - mk_j0) * mk_kc"))
        else:
            bw = dict(rows.batch_weights)
            sliced = {d for _, d in rows.slices}  # the copy holds this batch point only
            bbase = " + ".join(f"{v} * {bw[d]}" for d, v in batch_vals.items()
                               if v != "0" and bw[d] and d not in sliced)
            out += [cgen.Statement(f"const float *restrict mk_bp = mk_P + {bbase or '0'} + mk_jt"),
                    cgen.Statement("const long *restrict mk_offk = mk_off + mk_k0")]
            # the tile's first column, and whether all its columns are real and consecutive
            names = [f"mk_j{d}" for d in view.cols]
            out += virtual(names, rows.col_weights, "mk_jt")
            real = view.strides(view.cols)
            out.append(cgen.Statement("const long mk_jreal = " + " + ".join(
                f"{n} * {c_size(real[d])}" for n, d in zip(names, view.cols))))
            q = rows.inner
            straight = f"{names[q]} + {NR} <= {rows.col_extents[q]}" if q is not None else "0"
            if self._flat_columns() or plan.row_tile == 2:
                # a full tile is consecutive across row wraps too (two whole rows of a
                # split tile, which `plan.row_tiles` checked are flat in the output)
                straight = f"mk_nr == {NR}"
            out.append(cgen.Statement(f"const int mk_straight = {straight}"))
        point = self._acc_per_point()  # the partial sums are the batch point's alone
        # a batch's stride is a product of symbols where its rows and columns both are
        boff = " + ".join(f"{v} * ({c_size(stride(view.shape, d))})" for d, v in batch_vals.items()
                          if v != "0" and not point) or "0"
        out.append(cgen.Statement(f"const long mk_boff = {boff}"))
        for d, v in batch_vals.items():
            out.append(cgen.Statement(f"const long mk_o{d} = {v}"))
        vacc = self._virtual_acc()
        if vacc:  # the batch point's block of partial sums
            m, n = self._acc_shape()
            flat = " + ".join(f"{v} * {math.prod(view.shape[e] for e in view.batch if e > d)}"
                              for d, v in batch_vals.items() if v != "0") or "0"
            out.append(cgen.Statement(f"const long mk_vboff = ({flat}) * {m * n}"))
        call = mk.c_function
        first, last = ("(mk_k0 == 0)", f"(mk_k0 + mk_kc >= {plan.k})") if has_pc else ("1", "1")
        # the direct path: a full tile accumulated in memory (C += A B), nothing to apply
        # (C an M x N matrix, `c_matrix`);
        # it needs a pc loop (else the only block is first and last) unless the result
        # is a plain zero-initialised output
        zero_init = isinstance(view.init.expr, Const) and view.init.expr.value == 0
        applies = bool(view.epilogue) or not self._c_in_place()
        direct = [f"mk_mr == {MR}", "mk_straight" if rows else f"mk_nr == {NR}"]
        direct += [] if zero_init else [f"!{first}"]
        direct += [f"!{last}"] if applies else []
        row = "mk_it" if h.block is None else f"(mk_it % {h.block[1]})"  # C's block of rows
        base = "mk_boff + " if h.block is None else ""
        cptr = f"{acc_name} + {base}{row} * {plan.n} + {'mk_jreal' if rows else 'mk_jt'}"
        # a masked tile (`Gemm.masked`): nothing reads its values, zeros stand in; with
        # A 0 past a depth (`Gemm.depth`), the K steps up to it (none: zeros again)
        dead = self._masked_tile()
        kc = "mk_kc"
        if plan.depth != "-":
            kc = "mk_kce"
            out.append(cgen.Statement(f"const long mk_kce = mk_bfinite ? min(mk_kc, mk_it + "
                                      f"mk_mr + {int(plan.depth)} - mk_k0) : mk_kc"))
            dead = " || ".join(filter(None, [dead, "mk_kce <= 0"]))
        if rows is None:
            variant = mk.rows_variant  # computes only the tile's first mk_mr rows, mk_nr columns

            def calls(c: str, ldc: str, acc: str, rows: str = "", cols: str = "") -> str:
                if lda:  # A read in place: rows x cols always given
                    return (f"{mk.a_rows_variant}({kc}, mk_ap, {lda}, mk_bp, {c}, {ldc}, {acc}, "
                            f"{rows or MR}, {cols or NR})")
                if rows:
                    if not variant:  # else a comma expression in C that computes nothing
                        raise InternalError("codegen", f"{mk.name} has no variant for a part "
                                                       "of a tile")
                    return f"{variant}({kc}, mk_ap, mk_bp, {c}, {ldc}, {acc}, {rows}, {cols})"
                return f"{call}({kc}, mk_ap, mk_bp, {c}, {ldc}, {acc})"
            # A read in place: not a row past the tile's, where A may end; an edge
            # tile's kernel computes the columns that are read only
            fill: cgen.Generable = cgen.Statement(
                calls("mk_tile", str(NR), "0", "mk_mr", "mk_nr") if variant or plan.a == "rows"
                else calls("mk_tile", str(NR), "0"))
            if dead:
                fill = if_(dead, cgen.Statement("memset(mk_tile, 0, sizeof(mk_tile))"), fill)
            slow = [cgen.Statement(f"float mk_tile[{MR * NR}] __attribute__((aligned(64)))"),
                    *self._fetch_stores(last), fill]
            kernel = calls(cptr, str(plan.n), f"!{first}")
        else:
            variant = ""
            b_rows = mk.b_rows_variant
            whole = cgen.Statement(f"{b_rows}(mk_kc, mk_ap, mk_bp, mk_offk, mk_tile, {NR}, 0)")
            edge = whole if rows.copy else self._edge_panel(call)
            kernel = f"{b_rows}(mk_kc, mk_ap, mk_bp, mk_offk, {cptr}, {plan.n}, !{first})"
            if plan.taps:
                # a 3x3 window's taps a plane apart; with two output rows a tile, the
                # second a virtual row on, and a last row alone on 7 columns
                step = rows.col_weights[-2] if plan.row_tile == 2 else NR // 2
                taps = (f"{mk.b_taps_variant}(mk_kc, mk_ap, mk_bp, mk_offk, "
                        f"{window_taps(view, rows)}, {step}, ")
                whole = cgen.Statement(f"{taps}mk_tile, {NR}, 0, {NR})")
                if plan.row_tile == 2:
                    edge = cgen.Statement(f"{taps}mk_tile, {NR}, 0, {NR // 2})")
                kernel = f"{taps}{cptr}, {plan.n}, !{first}, {NR})"
            slow = [cgen.Statement(f"float mk_tile[{MR * NR}] __attribute__((aligned(64)))"),
                    *self._fetch_stores(last),
                    whole if rows.copy and plan.row_tile != 2 else if_(f"mk_nr == {NR}", whole, edge)]
        if vacc:
            # a K block but the last adds to the partial sums in place; the last one's
            # tile is computed apart, the sums so far read beside it
            n = self._acc_shape()[1]
            at = f"mk_acc + mk_vboff + mk_it * {n} + mk_jt"
            partial = cgen.Statement(f"{b_rows}(mk_kc, mk_ap, mk_bp, mk_offk, {at}, {n}, !{first})")
            fetch = cgen.For("long mk_r = 0", "mk_r < mk_mr", "mk_r++", cgen.Block([
                cgen.Statement(f"__builtin_prefetch({at} + mk_r * {n} + {c}, 0, 3)")
                for c in _line_points(NR)]))
            out.append(if_(f"!{last}", cgen.Block([if_(f"!{first}", fetch), partial]), cgen.Block([
                slow[0], *self._fetch_stores("1"), if_(f"!{first}", fetch), whole,
                self._final(first, acc_name)])))
            return cgen.Block(read_only(out))
        if self._sums_apart():
            # every K block but the last accumulates in the partial sums through the
            # kernel itself; the last one's tile is computed apart, the sums read beside it
            at = f"mk_acc + mk_boff + mk_it * {plan.n} + mk_jt"
            partial = if_(f"mk_mr == {MR} && mk_nr == {NR}",
                          cgen.Statement(calls(at, str(plan.n), f"!{first}")),
                          cgen.Statement(calls(at, str(plan.n), f"!{first}", "mk_mr", "mk_nr")))
            out.append(if_(f"!{last}", partial, cgen.Block(
                [slow[0], *self._fetch_stores("1"), fill, self._final(first, acc_name)])))
            return cgen.Block(read_only(out))
        if has_pc:
            slow.append(if_(f"!{last}", self._partial(first, acc_name),
                            self._final(first, acc_name)))
        else:
            slow.append(self._final("1", acc_name))
        if view.c_matrix and (has_pc or (zero_init and not applies)):
            otherwise: cgen.Generable = cgen.Block(slow)
            if variant:  # an edge tile (M % MR, N % NR): fewer rows and columns, straight into C
                edge = cgen.Statement(calls(cptr, str(plan.n), f"!{first}", "mk_mr", "mk_nr"))
                otherwise = if_(" && ".join(direct[2:]), edge, otherwise) if direct[2:] else edge
            computed = if_(" && ".join(direct), cgen.Statement(kernel), otherwise)
            if dead:  # zeros in C itself, where its first K block would have stored
                zero = cgen.For("long mk_r = 0", "mk_r < mk_mr", "mk_r++", cgen.Statement(
                    f"memset({cptr} + mk_r * {plan.n}, 0, sizeof(float) * mk_nr)"))
                computed = (if_(f"({dead}) && {first}", zero, if_(f"!({dead})", computed))
                            if has_pc else if_(dead, zero, computed))
            out.append(computed)
        else:
            out += slow
        return cgen.Block(read_only(out))

    def _flat_columns(self) -> bool:
        """Are the virtual columns the output's own, and are they one flat run
        (`_flat_from`)? Then the straight write-back of a full tile holds across a wrap
        of the inner dim (56-wide planes: a third of the 24-wide tiles wrap)."""
        view, cols = self.view, self.view.cols
        real = view.strides(cols)
        return (self.rows.col_weights == tuple(real[d] for d in cols)
                and self.rows.col_extents == tuple(view.shape[d] for d in cols)
                and self._flat_from() == 0)

    def _flat_from(self) -> int:
        return flat_columns_from(self.view, lambda t: self.b.arrays[t].type.shape)

    def _masked_tile(self) -> str:
        """The C condition that the tile is masked, or ''."""
        if self.plan.masked == "-":
            return ""
        if "pc" in self.plan.loops or self.rows is not None or not self.view.c_matrix:
            raise InternalError("codegen", f"mark {str(self.plan)!r}: masked tiles need "
                                           "one K block and a packed B")
        return f"mk_jt > mk_it + mk_mr - 1 + {int(self.plan.masked)}"


    def _tail_reads(self) -> set[str]:
        return {x.tensor for t in self.view.tail for x in loads_of(t.expr)}

    def _rows_cols(self, body: Callable[[int], list[cgen.Generable]], simd: bool,
                   lanes: Written | None = None) -> cgen.Generable:
        """The tile's elements, `body(j)` the statements of row mk_r + j; `lanes`, where
        given, writes back any tile inside one flat run, or with B read in place, inside
        one output row (`_lanes`)."""
        view, MR, NR = self.view, self.mk.mr, self.mk.nr
        rows = self._tile_rows()
        def col_loop(cols: list[cgen.Generable], lo: str, nr: str,
                     pragma: str = "omp simd") -> cgen.Generable:
            inner = cgen.For(f"long mk_c = {lo}", f"mk_c < {nr}", "mk_c++",
                             cgen.Block(read_only(cols + body(0))))
            return cgen.Module([cgen.Pragma(pragma), inner]) if simd else inner

        def nest(mr: str, cols: list[cgen.Generable], lo: str, nr: str,
                 pragma: str = "omp simd") -> cgen.Generable:
            return cgen.For("long mk_r = 0", f"mk_r < {mr}", "mk_r++",
                            cgen.Block(read_only(rows + [col_loop(cols, lo, nr, pragma)])))
        if self.rows is not None:
            return self._virtual_rows_cols(rows, col_loop, nest, lanes)
        names, extents = [f"mk_o{d}" for d in view.cols], [view.shape[d] for d in view.cols]
        cols = decompose(names, extents, "mk_jt + mk_c")
        if not simd:
            return nest("mk_mr", cols, "0", "mk_nr")
        # a full tile inside one flat run: its columns are one index plus mk_c, no
        # division per element, which gcc cannot vectorise (1x1 convolutions' bias+relu
        # ran scalar)
        k = self._flat_from()
        run = math.prod(extents[k:])
        flat = decompose(names, extents, "mk_jt")[:k] + [
            cgen.Statement(f"const long {n} = 0") for n in names[k:-1]] + [
            cgen.Statement(f"const long {names[-1]} = {f'mk_jt % {run}' if k else 'mk_jt'} + mk_c")]
        heavy = self._heavy()
        # A heavy epilogue with masked vector loads and stores (AVX-512's): edge tiles (the
        # last of a row or column of tiles) through the full tiles' loop too, their rows
        # up to mk_mr, their columns masked past mk_nr, so gcc compiles the epilogue
        # once (the edge tiles' copy, in scalars, was 10-15% of gcc's time on
        # linear+gelu; 300x512 @ 512x1000 with gelu ran 5-7% faster vectorised). Not a
        # light one: its full tiles ran 1-4% slower masked (a bias and relu of 3x3 convs
        # over 14x14 and 7x7 planes), and vectorised its edge tiles compile fast. Nor
        # one that reads a value of the row only (a convolution's bias): gcc vectorises
        # no loop with a masked load of one address (conv2d with gelu ran 1.6-2.9x slower).
        masked = (heavy and bool(MASKED_STORES & set(self.mk.features))
                  and all(iterators(x) & set(view.cols)
                          for e in (view.init, *view.epilogue) for x in loads_of(e.expr)))
        if lanes is not None:
            full = lanes.tile(flat)
        elif masked or (heavy and MR % 2 == 0):
            full = self._row_pairs(flat, body, masked)
        else:
            full = nest(str(MR), flat, "0", str(NR))
        whole = masked or lanes is not None  # every tile through `full`, its edges masked
        # an edge tile: its columns each by their own division, in scalars where the
        # epilogue is heavy
        edge = nest("mk_mr", cols, "0", "mk_nr", "omp simd simdlen(1)" if heavy else "omp simd")
        if k:
            # a full tile across a wrap of the flat run: a vector loop over each of its
            # pieces inside one run (its columns each by their own division, in scalars,
            # had been a seventh of 8x1024x14x14 to 2048 1x1 /2's time, tiles of 48 over
            # images of 49: 0.85-0.87x the time so, 8x2048x7x7 to 512 0.92x, Zen 5, 1
            # and 2 threads, in pairs of calls)
            wrap = edge if masked and lanes is None else self._pieces(names, extents, k, body,
                                                                      lanes)
            full = if_(f"mk_jt % {run} + {'mk_nr' if whole else NR} <= {run}", full, wrap)
        return full if whole else if_(f"mk_mr == {MR} && mk_nr == {NR}", cgen.Block([full]),
                                      cgen.Block([edge]))

    def _pieces(self, names: list[str], extents: list[int], k: int,
                body: Callable[[int], list[cgen.Generable]],
                lanes: Written | None = None) -> cgen.Generable:
        """A full tile's rows, each in the pieces of its columns that lie inside one flat
        run of the output's dims from `k` on: the dims before k decomposed once a
        piece, the run's own index one plus mk_c. On `lanes` (`_lanes`), any tile's
        rows, each piece in vectors."""
        run, NR = math.prod(extents[k:]), self.mk.nr
        mr, nr = ("mk_mr", "mk_nr") if lanes else (str(self.mk.mr), str(NR))
        piece = [cgen.Assign("mk_ce", f"min({nr}, mk_cs + {run} - (mk_jt + mk_cs) % {run})"),
                 *decompose(names, extents, "mk_jt + mk_cs")[:k]]
        own = [cgen.Statement(f"const long {n} = 0") for n in names[k:-1]] + [
            cgen.Statement(f"const long {names[-1]} = (mk_jt + mk_cs) % {run} - mk_cs + mk_c")]
        cols = lanes.run(own, "mk_cs", "mk_ce") if lanes else cgen.Module([
            cgen.Pragma("omp simd"), cgen.For("long mk_c = mk_cs", "mk_c < mk_ce", "mk_c++",
                                              cgen.Block(read_only(own + body(0))))])
        return cgen.For("long mk_r = 0", f"mk_r < {mr}", "mk_r++", cgen.Block(read_only(
            self._tile_rows() + [cgen.For("long mk_cs = 0, mk_ce", f"mk_cs < {nr}", "mk_cs = mk_ce",
                                         cgen.Block(read_only(piece + [cols])))])))

    def _row_pairs(self, cols: list[cgen.Generable],
                   body: Callable[[int], list[cgen.Generable]], masked: bool) -> cgen.Generable:
        """The tile two rows at a time: a heavy epilogue (gelu's exp and division) is
        one long chain of dependent operations per vector, and a row of the tile, two
        vectors, left the core waiting on it (linear+gelu 1024x1024x4096, 1 thread:
        the epilogue 3-6% of the kernel's CPU samples over the bare matmul's, in pairs
        about 1%; the whole tile unrolled about as fast, for 38% more gcc work, pairs
        9%). `masked`: of any tile, the second row of an odd row count's last pair
        masked off whole; else of a full tile of an even row count."""
        rows = self._tile_rows() + self._tile_rows(1)
        if not masked:
            return cgen.For("long mk_r = 0", f"mk_r < {self.mk.mr}", "mk_r += 2", cgen.Block(
                read_only(rows + [cgen.Pragma("omp simd"), _columns(
                    self.mk.nr, cols, [("", body(0) + body(1))])])))
        return cgen.For("long mk_r = 0", "mk_r < mk_mr", "mk_r += 2", cgen.Block(read_only(
            rows + [cgen.Statement("const long mk_nr_1 = mk_r + 1 < mk_mr ? mk_nr : 0"),
                    cgen.Pragma("omp simd"),
                    _columns(self.mk.nr, cols, [("mk_nr", body(0)), ("mk_nr_1", body(1))])])))

    def _fetch_stores(self, last: str) -> list[cgen.Generable]:
        """Prefetches of the lines the final write-back will store, issued before the
        tile's kernel call: a tile computed into `mk_tile` stores past the kernel, which
        fetches only its own C; the outputs' lines would miss at the stores (conv2d
        1x64x56x56 to 256 1x1 with bias and relu, 1 thread: +12%; 64 3x3: +3-4%)."""
        view, NR = self.view, self.mk.nr
        stored = self._tail_reads()
        targets = [e for e in (view.init, *view.epilogue)
                   if self.b.arrays[e.target].role == "out" or e.target in stored]
        if not targets:
            return []
        guard = last
        if self.rows is None:
            cols = decompose([f"mk_o{d}" for d in view.cols], [view.shape[d] for d in view.cols],
                             "mk_jt + mk_c")
        elif self.rows.inner is not None:  # a tile inside one output row (`mk_straight`)
            cols = self._straight_cols()
            guard = "mk_straight" if last == "1" else f"{last} && mk_straight"
        else:
            return []
        plain = ExprPrinter(self.b.arrays, lambda pos: f"mk_o{pos}")
        fetch = [cgen.Statement(f"__builtin_prefetch(&{plain.access(e.target, e.index)}, 1, 3)")
                 for e in targets]
        at = _line_points(NR)
        points = [cgen.Block(read_only([
            cgen.Statement(f"const long mk_c = {f'min({c}, mk_nr - 1)' if c else 0}"), *cols, *fetch]))
            for c in at]
        # not unrolled: gcc peeled the at most MR rows into copies, a tenth of its time on
        # linear+gelu, for a loop that runs once a tile
        nest = cgen.Block([cgen.Pragma("GCC unroll 1"), cgen.For(
            "long mk_r = 0", "mk_r < mk_mr", "mk_r++",
            cgen.Block(read_only(self._tile_rows() + points)))])
        return [nest] if guard == "1" else [if_(guard, nest)]

    def _tile_rows(self, j: int = 0) -> list[cgen.Generable]:
        """The output's row indices (`mk_o{d}`) of the tile's row mk_r + j (`_o`)."""
        view = self.view
        return decompose([self._o(d, j) for d in view.rows], [view.shape[d] for d in view.rows],
                         f"mk_it + {_row(j)}")

    def _o(self, d: int, j: int = 0) -> str:
        """The C name of output dim d's index in the tile's row mk_r + j."""
        return f"mk_o{d}_{j}" if j and d in self.view.rows else f"mk_o{d}"

    def _col(self) -> str:
        """The flat output column of the write-back's element (mk_c of the tile)."""
        if self.rows is None:
            return "mk_jt + mk_c"
        real = self.view.strides(self.view.cols)
        return " + ".join(f"mk_o{d} * {c_size(real[d])}" for d in self.view.cols)

    def _init_value(self, first: str, acc_name: str, j: int = 0,
                    printer: Scalars | None = None) -> str:
        """The C of the init's value plus the sums of the K blocks before, at the tile's
        row mk_r + j, printed by `printer` (scalars by default; `Lanes`: the lanes from
        column mk_c on)."""
        view = self.view
        p = printer or Scalars(self.b.arrays, lambda pos: self._o(pos, j), {})
        init = p.value(view.init.expr)
        if first == "1":
            return init
        row = f"(mk_it + {_row(j)})"
        if self._virtual_acc():  # the sums of the K blocks before, init not in them
            n = self._acc_shape()[1]
            return (f"({first} ? {init} : {init} + "
                    f"{p.at(f'{acc_name}[mk_vboff + {row} * {n} + mk_jt + mk_c]')})")
        mem = p.at(f"{acc_name}[mk_boff + {row} * {self.plan.n} + {self._col()}]")
        return f"({first} ? {init} : {init} + {mem})" if self._sums_apart() else f"({first} ? {init} : {mem})"

    def _partial(self, first: str, acc_name: str) -> cgen.Generable:
        NR = self.mk.nr
        mem = f"{acc_name}[mk_boff + (mk_it + mk_r) * {self.plan.n} + {self._col()}]"
        body = [cgen.Assign(mem, f"mk_tile[mk_r * {NR} + mk_c] + {self._init_value(first, acc_name)}")]
        return cgen.Block([self._rows_cols(lambda j: body, simd=False)])

    def _final(self, first: str, acc_name: str) -> cgen.Generable:
        return cgen.Block([self._rows_cols(lambda j: self._final_row(first, acc_name, j),
                                           simd=True, lanes=self._lanes(first, acc_name))])

    def _lanes(self, first: str, acc_name: str) -> Written | None:
        """The last K block's write-back of a heavy epilogue 16 columns at a time
        (`Lanes`): a tile, given the C of its columns inside one flat run (B read in
        place: one output row), its rows each in vectors, unmasked where the tile's
        width is whole vectors, else the last one masked, an edge tile's all masked;
        and a run of a row's columns (`_virtual_rows_cols`), masked. None where
        the kernel is not AVX-512's or the epilogue has a value or an access lanes
        cannot hold."""
        view, NR = self.view, self.mk.nr
        if "avx512f" not in self.mk.features or not self._heavy():
            return None
        if self.rows is None:
            col = view.cols[-1]
        elif self.rows.inner is None or view.strides(view.cols)[view.cols[self.rows.inner]] != 1:
            return None  # C's partial sums (`_init_value`) not one float a column apart
        else:
            col = view.cols[self.rows.inner]
        statements = (view.init, *view.epilogue)
        leaving = {s.target for s in statements if self._leaves(s.target)}
        probe = Lanes(self.b.arrays, self._o, col, scalars={view.stmt.target: ""})
        if not probe.supports(statements, leaving):
            return None

        def step(cols: list[cgen.Generable], mask: str, lo: str, hi: str) -> cgen.Generable:
            """The vectors of row mk_r's columns lo to hi."""
            head = [cgen.Statement(f"const polyc_m16 {mask} = polyc_v_mask({hi} - mk_c)")]
            body = self._final_row(first, acc_name, 0, Lanes(self.b.arrays, self._o, col, mask))
            return cgen.For(f"long mk_c = {lo}", f"mk_c < {hi}", f"mk_c += {LANES}", cgen.Block(
                read_only(cols + (head if mask else []) + body)))

        def tile(cols: list[cgen.Generable], mask: str, hi: str) -> cgen.Generable:
            # a full tile's vectors unrolled (0.3-0.5% of linear+gelu's time; its masks
            # constants then), not an edge's: gcc's time on the code
            unroll = [] if hi == "mk_nr" else [cgen.Pragma(f"GCC unroll {-(-NR // LANES)}")]
            return cgen.For("long mk_r = 0", "mk_r < mk_mr", "mk_r++", cgen.Block(read_only(
                self._tile_rows() + unroll + [step(cols, mask, "0", hi)])))
        full = "mk_m" if NR % LANES else ""
        note = cgen.Comment(f"the epilogue on {LANES} lanes, a vector of a row's columns at once")

        def whole(cols: list[cgen.Generable]) -> cgen.Generable:
            return cgen.Block([note, if_(f"mk_nr == {NR}", tile(cols, full, str(NR)),
                                         tile(cols, "mk_m", "mk_nr"))])
        return Written(whole, lambda cols, lo, hi: step(cols, "mk_m", lo, hi))

    def _heavy(self) -> bool:
        """Does the epilogue call a function the prelude inlines (exp, tanh, erf,
        sigmoid): much code per element, for gcc and for the core?"""
        return any(c.fn in INLINED_FNS for e in self.view.epilogue for c in calls(e.expr))

    def _final_row(self, first: str, acc_name: str, j: int,
                   lanes: Lanes | None = None) -> list[cgen.Generable]:
        """The last K block's write-back of an element of the tile's row mk_r + j (on
        `lanes`: of 16, from column mk_c on): its value, the epilogue, the stores of what
        leaves."""
        view, NR = self.view, self.mk.nr
        s0 = view.stmt
        printer = lanes or Scalars(self.b.arrays, lambda pos: self._o(pos, j), {})
        tile = f"mk_tile[{_row(j)} * {NR} + mk_c]"
        v = f"mk_v_{j}" if j else "mk_v"
        body = [cgen.Statement(f"const {printer.ctype(s0.dtype)} {v} = "
                               f"{printer.at(tile)} + "
                               f"{self._init_value(first, acc_name, j, printer)}")]
        return body + in_scalars(printer, s0.target, view.init.index, v, view.epilogue,
                                 lambda k: f"mk_e{k}_{j}" if j else f"mk_e{k}", self._leaves)

    def _leaves(self, tensor: str) -> bool:
        """Does the write-back store `tensor`: a kernel's output, or what its row tail
        reads?"""
        return self.b.arrays[tensor].role == "out" or tensor in self._tail_reads()


def _columns(nr: int, cols: list[cgen.Generable],
             rows: list[tuple[str, list[cgen.Generable]]]) -> cgen.Generable:
    """A loop over a tile's `nr` columns doing each row's statements, on the columns
    before its bound (a C name; '' for all): gcc vectorises a bound with masked loads
    and stores."""
    return cgen.For("long mk_c = 0", f"mk_c < {nr}", "mk_c++", cgen.Block(read_only(cols + [
        cgen.If(f"mk_c < {bound}", cgen.Block(read_only(body))) if bound
        else cgen.Block(read_only(body)) for bound, body in rows])))


def _line_points(nr: int) -> list[int]:
    """Columns of a tile row of `nr` floats, one in every 64-byte line it spans: one in
    each 16 floats, and its end."""
    return sorted({*range(0, nr, 16), nr - 1})


def _row(j: int) -> str:
    """The tile's row mk_r + j, in C."""
    return f"(mk_r + {j})" if j else "mk_r"

