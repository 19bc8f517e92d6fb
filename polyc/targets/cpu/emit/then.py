"""The row tail's contraction (`GemmView.then`: attention's probabilities times v) inside
a gemm kernel. Its B is packed beside the contraction's own B, once per batch point (at
the last K block); on each block of rows, once the tail has written their A (the
probabilities, still in cache), the tiles of the plan's `then` kernel read those rows
in place and store straight into the result, which nothing else touches."""
from __future__ import annotations

import math

import cgen

from ....codegen.cexpr import ExprPrinter, c_size
from ....kernel.ir import c_comment
from ....microkernels import registry
from .common import Scalars, in_scalars, up


class ThenMixin:
    def _then_kernel(self) -> registry.Microkernel:
        return registry.by_name(self.plan.then)

    def then_buffer(self) -> cgen.Generable:
        """A thread's panels of the then's B for one batch point."""
        t, mk = self.view.then, self._then_kernel()
        return cgen.Statement(f"float *restrict mk_pt = polyc_scratch(6, "
                              f"{c_size(4 * t.K * up(t.N, mk.nr))})")

    def then_finite(self) -> list[cgen.Generable]:
        """With A 0 past a depth (`Gemm.then_depth`), whether B is finite, once per call."""
        if self.plan.then_depth == "-":
            return []
        return [self.all_finite("mk_tfinite", self.view.then.b_expr.tensor)]

    def then_pack(self, loops: dict[str, str], team: bool) -> list[cgen.Generable]:
        """The then's B for the current batch point into panels of the kernel's width,
        zeros past its columns, K row by K row; the panels shared out by a `team`."""
        t, NR = self.view.then, self._then_kernel().nr
        s, K, N = t.stmt, c_size(t.K), c_size(t.N)
        names = {t.out_iter[d]: v for d, v in self._batch_values(loops).items()}
        names |= {t.out_iter[self.view.rows[0]]: "0", t.out_iter[t.cols[0]]: "(mk_tj + mk_x)",
                  t.red[0]: "mk_p"}
        value = ExprPrinter(self.b.arrays, lambda pos: names[pos]).value(t.b_expr)
        row = cgen.For("long mk_x = 0", f"mk_x < {NR}", "mk_x++", cgen.Assign(
            f"mk_pt[mk_tj * {K} + mk_p * {NR} + mk_x]",
            value if type(t.N) is int and t.N % NR == 0 else f"mk_tj + mk_x < {N} ? ({value}) : 0.0f"))
        panels = cgen.For("long mk_tj = 0", f"mk_tj < {N}", f"mk_tj += {NR}", cgen.For(
            "long mk_p = 0", f"mk_p < {K}", "mk_p++",
            cgen.Block([cgen.Pragma("omp simd"), row])))
        share = [cgen.Pragma("omp for schedule(static)")] if team else []
        last = f"mk_k0 + mk_kc >= {c_size(self.plan.k)}"  # the then runs after the last K block
        return [cgen.Comment(f"{s.name}'s B, {K}x{N}, in panels of {NR} for its "
                             f"{self.plan.then} tiles"),
                cgen.If(last, cgen.Block(share + [panels]))]

    def then_tiles(self) -> cgen.Generable:
        """The then on the current block of rows: its tiles, A's rows read in place."""
        plan, t, mk = self.plan, self.view.then, self._then_kernel()
        MR, NR = mk.mr, mk.nr
        loops = self._tile_loops(set(plan.loops))
        # C's batch and row dims (the then's rows too where B has no batch dim)
        row, col, lead = self.view.rows[0], t.cols[0], len(self.view.batch)
        names = {t.out_iter[d]: v for d, v in self._batch_values(loops).items()}
        names |= {t.out_iter[row]: "mk_ti", t.out_iter[col]: "mk_tj", t.red[0]: "0"}
        p = ExprPrinter(self.b.arrays, lambda pos: names[pos])
        a, K, N = t.a_expr, c_size(t.K), c_size(t.N)
        kc = K
        head = [cgen.Statement(f"const long mk_t0 = {loops.get('ic', '0')}"),
                cgen.Statement(f"const long mk_tm = min({c_size(plan.mc)}, {c_size(plan.m)} - mk_t0)")]
        body = [cgen.Statement(f"const long mk_rows = min({MR}, mk_t0 + mk_tm - mk_ti)")]
        if plan.then_depth != "-":  # K steps past row + depth add only zeros
            kc = "mk_tk"
            body.append(cgen.Statement(f"const long mk_tk = mk_tfinite ? min({K}, mk_ti + "
                                       f"mk_rows + {plan.then_depth}) : {K}"))
        c, ldc = (("mk_tt", str(NR)) if t.epilogue else
                  (f"&{p.access(t.stmt.target, t.stmt.index)}",
                   self._row_stride(t.stmt.target, lead)))
        if t.epilogue:
            body.append(cgen.Statement(f"float mk_tt[{MR * NR}] __attribute__((aligned(64)))"))
        body.append(cgen.Statement(
            f"{mk.a_rows_variant}({kc}, &{p.access(a.tensor, a.index)}, "
            f"{self._row_stride(a.tensor, lead)}, mk_pt + mk_tj * {K}, {c}, {ldc}, 0, mk_rows, "
            f"min({NR}, {N} - mk_tj))"))
        if t.epilogue:
            body.append(self._then_epilogue(names))
        share = ([cgen.Pragma("omp for collapse(2) schedule(static)")]
                 if plan.par == "inner" else [])
        tiles = cgen.For("long mk_tj = 0", f"mk_tj < {N}", f"mk_tj += {NR}", cgen.For(
            "long mk_ti = mk_t0", "mk_ti < mk_t0 + mk_tm", f"mk_ti += {MR}", cgen.Block(body)))
        if mk not in self.used:
            self.used.append(mk)
        return cgen.Block([cgen.Comment(c_comment(  # a tensor's name is the user's
            f"{mk.name}: {t.stmt.name} on the block's rows, {c_size(t.M)}x{N}x{K} in all, A "
            f"({a.tensor}) read in place"))] + head + share + [tiles])

    def _then_epilogue(self, names: dict[int, str]) -> cgen.Generable:
        """The then's epilogue on its tile (`mk_tt`, computed on the stack), element by
        element, in scalars: what leaves is stored (attention's product with v times its
        rows' 1 / sum: normalised after the product, 64 columns a row, not before it,
        512)."""
        t, NR = self.view.then, self._then_kernel().nr
        row, col = self.view.rows[0], t.cols[0]
        at = {d: names[t.out_iter[d]] for d in range(len(t.shape))}
        at |= {row: "(mk_ti + mk_r)", col: "(mk_tj + mk_c)"}
        body = [cgen.Statement(f"const float mk_v = mk_tt[mk_r * {NR} + mk_c]")]
        body += in_scalars(Scalars(self.b.arrays, lambda pos: at[pos], {}), t.stmt.target,
                           t.init.index, "mk_v", t.epilogue, lambda k: f"mk_e{k + 1}",
                           lambda tensor: self.b.arrays[tensor].role == "out")
        cols = cgen.For("long mk_c = 0", f"mk_c < min({NR}, {c_size(t.N)} - mk_tj)", "mk_c++",
                        cgen.Block(body))
        return cgen.For("long mk_r = 0", "mk_r < mk_rows", "mk_r++",
                        cgen.Block([cgen.Pragma("omp simd"), cols]))

    def _row_stride(self, tensor: str, dim: int) -> str:
        """Floats between consecutive indices of `dim` in `tensor`, which is whole or a
        block buffer (`Array.block`: the dims after its rows kept)."""
        return c_size(math.prod(self.b.arrays[tensor].type.shape[dim + 1:]))
