"""Codegen of the `winograd` mark (`targets/cpu/winograd.py`): a 3x3 convolution's blocks.

For F(m x m, 3x3) (m = 2 or 4; (m + 2)^2 = 16 or 36 products), for each block of tile
rows: its patches transformed into the products' B panels (`polyc_winograd_f<m>x3_input`),
the products on the gemm kernel over the weights' transformed A panels (made once where
the weights are a constant), then for each output channel the products transformed back
into m output rows a tile row (`polyc_winograd_f<m>x3_output`), read by the init and the
epilogue, which store the outputs:

    U = transformed weights (kept, or per call)
    for blocks of the plan's tile rows        (par=blocks: each thread its own)
      V = input transform of the block        (par=team: the channels shared)
      M[e] = U[e] V[e], e < (m + 2)^2         (par=team: the products' panels shared)
      for each output channel o               (par=team: shared)
        Y = output transform of M's row o
        for each tile row, its m output rows: y = Y + init, epilogue, stores

The statements below the mark are not built (`targets/cpu/first_point`): this is all of
the kernel.
"""
from __future__ import annotations

from dataclasses import replace

import cgen

from ....codegen.ast_to_c import if_
from ....codegen.cexpr import c_size
from ....microkernels import registry
from ....schedule_tree import marks
from ..winograd import conv_of
from .common import Scalars, in_scalars, kept, up

# extra floats between two of the operands: their rows a multiple of 4 KiB apart had
# F(2x2, 3x3)'s 16 write streams share a few of L1's sets (Zen 5: the input transform
# 3.2x its time on 8x128x28x28, the weights' 7x on 64x64)
APART = 16
NAMES = ("mk_n", "mk_o", "mk_y", "mk_x")  # the output's dims in the epilogue


class WinogradMixin:
    def winograd(self, plan: marks.Winograd, child, outer) -> cgen.Generable:
        conv = conv_of(self.b.kernel)
        mk = registry.by_name(plan.kernel)
        if conv is None or conv.view.stmt.name != plan.stmt:
            return self.b.node(child, outer)  # not the kernel the plan was made for
        conv = replace(conv, m=plan.tile)
        for kernel in (registry.by_name(plan.transforms), mk):
            if kernel not in self.used:
                self.used.append(kernel)
        self.winograd_results.add(conv.view.stmt.target)
        rows, c, o = plan.rows, conv.C, conv.O
        op, cols = up(o, mk.mr), up(rows * conv.row_tiles, mk.nr)
        eu, es, em = op * c + APART, c * cols + APART, op * cols + APART
        body: list[cgen.Generable] = [cgen.Comment(
            f"Winograd F({conv.m}x{conv.m}, 3x3): {conv.view.stmt.name} as {conv.operands} "
            f"products of {o}x{c} @ {c}x{cols} on {mk.name}, blocks of {rows} tile rows, "
            f"par={plan.par}")]
        body += self._weights(plan, conv, mk, eu)
        e, m = conv.operands, conv.m
        buffers = [cgen.Statement(f"float *restrict mk_V = polyc_scratch(0, {c_size(4 * e * es)})"),
                   cgen.Statement(f"float *restrict mk_M = polyc_scratch(2, {c_size(4 * e * em)})")]
        own = [cgen.Statement(f"float *restrict mk_S = polyc_scratch(3, "
                              f"{c_size(4 * (m + 2) * (m * cols + 2))})"),
               cgen.Statement(f"float *restrict mk_Y = polyc_scratch(4, "
                              f"{c_size(4 * m * m * cols)})")]
        block = self._block(plan, conv, mk, op, cols, (eu, es, em))
        loop = cgen.For("long mk_r0 = 0", f"mk_r0 < {conv.tile_rows}", f"mk_r0 += {rows}",
                        cgen.Block(block))
        threads = _num_threads(plan)
        if plan.par == "blocks":
            body += [cgen.Pragma(f"omp parallel{threads}"), cgen.Block(
                buffers + own + [cgen.Pragma("omp for schedule(dynamic, 1)"), loop])]
        elif plan.par == "team":  # the block's buffers the team's, shared
            body += buffers + [cgen.Pragma(f"omp parallel{threads}"), cgen.Block(own + [loop])]
        else:
            body += buffers + own + [loop]
        return cgen.Block(body)

    def _weights(self, plan: marks.Winograd, conv, mk: registry.Microkernel,
                 eu: int) -> list[cgen.Generable]:
        """mk_U: the weights as the products' A panels, `eu` floats apart."""
        w = self.b.arrays[conv.w]
        size = 4 * conv.operands * eu
        # a panel of rows at a time: on every call, the team's (Zen 5, 256 x 256
        # channels: 201 us on one thread)
        fill = [cgen.For("long mk_p = 0", f"mk_p < {-(-conv.O // mk.mr)}", "mk_p++", cgen.Statement(
            f"polyc_{plan.transforms}_weights({w.c_name} + mk_p * {mk.mr * conv.C * 9}, "
            f"min({mk.mr}, {conv.O} - mk_p * {mk.mr}), {conv.C}, {mk.mr}, {eu}, "
            f"mk_U + mk_p * {mk.mr * conv.C})"))]
        if plan.weights == "const":
            return [cgen.Comment(f"the constant {w.c_name} (data sha256 {w.constant}), "
                                 "transformed on the first call"),
                    *kept(f"mk_const_{conv.view.stmt.name}_u", "mk_U", size, fill)]
        team = ([cgen.Pragma(f"omp parallel for schedule(static){_num_threads(plan)}")]
                if plan.par != "none" else [])
        return [cgen.Statement(f"float *restrict mk_U = polyc_scratch(1, {c_size(size)})"),
                *team, *fill]

    def _block(self, plan: marks.Winograd, conv, mk: registry.Microkernel, op: int, cols: int,
               apart: tuple[int, int, int]) -> list[cgen.Generable]:
        """One block of tile rows, from mk_r0: its transforms, products and outputs
        (`apart`: the floats from one of the operands to the next in mk_U, mk_V, mk_M)."""
        eu, es, em = apart
        rows, team = plan.rows, plan.par == "team"
        x = self.b.arrays[conv.x].c_name
        shared = [cgen.Pragma("omp for schedule(static)")] if team else []
        channels = (f"mk_c, mk_c + 1" if team else f"0, {conv.C}")
        transform = cgen.Statement(
            f"polyc_{plan.transforms}_input({x}, {conv.C}, {conv.H}, {conv.W}, {conv.pad_top}, "
            f"{conv.pad_left}, {conv.TY}, {conv.TX}, mk_r0, mk_r1, {channels}, "
            f"{mk.nr}, mk_cols, {es}, mk_V, mk_S)")
        if team:
            transform = cgen.For("long mk_c = 0", f"mk_c < {conv.C}", "mk_c++", transform)
        products = cgen.For(
            "long mk_e = 0", f"mk_e < {conv.operands}", "mk_e++", cgen.For(
                "long mk_j = 0", "mk_j < mk_cols", f"mk_j += {mk.nr}", cgen.For(
                    "long mk_i = 0", f"mk_i < {op}", f"mk_i += {mk.mr}", cgen.Statement(
                        f"{mk.c_function}({conv.C}, mk_U + mk_e * {eu} + mk_i * {conv.C}, "
                        f"mk_V + mk_e * {es} + mk_j * {conv.C}, "
                        f"mk_M + mk_e * {em} + mk_i * {cols} + mk_j, {cols}, 0)"))))
        outputs = cgen.For("long mk_o = 0", f"mk_o < {conv.O}", "mk_o++", cgen.Block([
            cgen.Statement(f"polyc_{plan.transforms}_output(mk_M + mk_o * {cols}, {em}, "
                           "mk_cols, mk_Y)"),
            self._rows(conv)]))
        return [cgen.Statement(f"const long mk_r1 = min(mk_r0 + {rows}, {conv.tile_rows})"),
                cgen.Statement(f"const long mk_cols = ((mk_r1 - mk_r0) * {conv.row_tiles} + "
                               f"{mk.nr - 1}) / {mk.nr} * {mk.nr}"),
                *shared, transform,
                *([cgen.Pragma("omp for collapse(2) schedule(static)")] if team else []), products,
                *shared, outputs]

    def _rows(self, conv) -> cgen.Generable:
        """Output channel mk_o's rows of the block's tile rows, from mk_Y: init, epilogue
        and the stores of what leaves the kernel."""
        view = conv.view
        p = Scalars(self.b.arrays, lambda pos: NAMES[pos], {})
        value = f"mk_src[mk_x] + {p.value(view.init.expr)}"
        points = in_scalars(p, view.stmt.target, view.init.index, "mk_v", view.epilogue,
                            lambda k: f"mk_e{k}", lambda t: self.b.arrays[t].role == "out")
        m = conv.m
        row = [cgen.Statement(f"const long mk_y = {m} * mk_ty + mk_h"),
               cgen.Statement(f"const float *restrict mk_src = mk_Y + mk_h * {m} * mk_cols + "
                              f"(mk_r - mk_r0) * {m * conv.row_tiles}"),
               cgen.Pragma("omp simd"),
               cgen.For("long mk_x = 0", f"mk_x < {conv.OW}", "mk_x++", cgen.Block([
                   cgen.Statement(f"const float mk_v = {value}"), *points]))]
        if conv.OH % m:  # the last tile row's last output rows are past the output
            row.insert(1, if_(f"mk_y >= {conv.OH}", cgen.Statement("break")))
        return cgen.For("long mk_r = mk_r0", "mk_r < mk_r1", "mk_r++", cgen.Block([
            cgen.Statement(f"const long mk_n = mk_r / {conv.TY}, mk_ty = mk_r % {conv.TY}"),
            cgen.For("long mk_h = 0", f"mk_h < {m}", "mk_h++", cgen.Block(row))]))


def _num_threads(plan: marks.Winograd) -> str:
    return f" num_threads({plan.threads})" if plan.threads else ""
