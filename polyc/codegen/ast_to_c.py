"""isl AST -> C through cgen, one function per kernel.

`CBuilder` walks the AST isl generated from a kernel's schedule tree and calls one hook
per construct (emit_loop, emit_if, emit_assign, emit_mark); a target subclasses it to
turn marks into what that target needs (`CpuBuilder`: OpenMP pragmas).

The ABI of every kernel function is `void NAME(T *restrict p0, ..., T *restrict pn)`: one
pointer per `in` / `out` array, in `Kernel.params` order, each a dense row-major buffer
of the array's shape and dtype; `in` pointers are `const`. Arrays never alias.
"""
from __future__ import annotations

import math
import re

import cgen
import islpy as isl

from ..kernel import Array, Kernel, c_comment
from ..schedule_tree.comprehension import Statement
from .cexpr import C_TYPE, ExprPrinter

_T = isl.ast_node_type


class CBuilder:
    """Turns an isl AST of one kernel into a cgen function definition."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.statements: dict[str, Statement] = {s.name: s for s in kernel.statements}
        self.arrays: dict[str, Array] = {a.tensor: a for a in kernel.arrays}
        # contracted locals: small arrays declared once, private to each thread
        self.buffers = [a for a in kernel.arrays if a.kept is not None]

    # -- the walk ------------------------------------------------------------------
    def node(self, n: isl.AstNode, marks: tuple[str, ...] = ()) -> cgen.Generable:
        """C for an AST node; `marks` are the schedule-tree marks right above it, which
        apply to the first loop level only."""
        kind = n.get_type()
        if kind == _T.for_:
            it = n.for_get_iterator().get_id().get_name()
            header = (it, n.for_get_init().to_C_str(), n.for_get_cond().to_C_str(),
                      n.for_get_inc().to_C_str())
            inner = n.for_get_body()
            if "reduce" in marks and inner.get_type() == _T.user:
                code = self.emit_reduction_loop(*header, inner.user_get_expr())
                if code is not None:
                    return code
            return self.emit_loop(*header, _statement(self.node(inner)), marks)
        if kind == _T.if_:
            other = _statement(self.node(n.if_get_else_node())) if n.if_has_else_node() else None
            return self.emit_if(n.if_get_cond().to_C_str(),
                                _statement(self.node(n.if_get_then_node())), other)
        if kind == _T.block:
            children = n.block_get_children()
            return cgen.Block([self.node(children.get_at(i), marks)
                               for i in range(children.n_ast_node())])
        if kind == _T.mark:
            return self.node(n.mark_get_node(), marks + (n.mark_get_id().get_name(),))
        if kind == _T.user:
            return self.emit_user(n.user_get_expr())
        raise NotImplementedError(f"isl AST node of kind {kind}")

    # -- hooks ----------------------------------------------------------------------
    def emit_loop(self, it: str, init: str, cond: str, inc: str, body: cgen.Generable,
                  marks: tuple[str, ...]) -> cgen.Generable:
        """A loop; the base class has no use for marks, a target's builder turns them
        into pragmas and passes those down as `marks`."""
        loop = cgen.For(f"int {it} = {init}", cond, f"{it} += {inc}", body)
        pragmas = [m for m in marks if m.startswith("omp ")]
        return cgen.Module([cgen.Pragma(p) for p in pragmas] + [loop]) if pragmas else loop

    def emit_if(self, cond: str, then: cgen.Generable, other: cgen.Generable | None) -> cgen.Generable:
        return cgen.If(cond, then, other)

    def emit_reduction_loop(self, it: str, init: str, cond: str, inc: str,
                            call: isl.AstExpr) -> cgen.Generable | None:
        """A loop whose body is one reduction update, or None to emit it as any loop."""
        return None

    def _call(self, call: isl.AstExpr) -> tuple[Statement, list[str]]:
        name = call.get_op_arg(0).get_id().get_name()
        args = [_atom(call.get_op_arg(i).to_C_str()) for i in range(1, call.get_op_n_arg())]
        return self.statements[name], args

    def emit_user(self, call: isl.AstExpr) -> cgen.Generable:
        return self.emit_assign(*self._call(call))

    def emit_assign(self, s: Statement, iters: list[str]) -> cgen.Generable:
        p = ExprPrinter(self.arrays, lambda pos: iters[pos])
        target = p.access(s.target, s.index)
        return cgen.Statement(p.update(target, s.reduce, p.value(s.expr), s.dtype).rstrip(";"))

    # -- the function -----------------------------------------------------------------
    def function(self, ast: isl.AstNode) -> cgen.Generable:
        params = []
        for a in self.kernel.params:
            value = cgen.RestrictPointer(cgen.Value(C_TYPE[a.type.dtype], a.c_name))
            params.append(cgen.Const(value) if a.role == "in" else value)
        body = [cgen.Comment(c_comment(f"{a.c_name}: {a.role} {a.type} tensor '{a.tensor}'"))
                for a in self.kernel.arrays]
        body += [cgen.Comment(c_comment(f"{s.name}: from {s.origin}"))
                 for s in self.kernel.statements]
        for a in self.buffers:
            size = max(1, math.prod(a.buffer_shape))
            body.append(cgen.Statement(f"{C_TYPE[a.type.dtype]} {a.c_name}[{size}]"))
        # locals that could not be contracted live whole for the call
        locals_ = [a for a in self.kernel.arrays if a.role == "local" and a.kept is None]
        for a in locals_:
            body.append(cgen.Statement(
                f"{C_TYPE[a.type.dtype]} *restrict {a.c_name} = malloc({a.type.nbytes})"))
        body.append(self.node(ast))
        body += [cgen.Statement(f"free({a.c_name})") for a in locals_]
        decl = cgen.FunctionDeclaration(cgen.Value("void", self.kernel.name), params)
        return cgen.FunctionBody(decl, cgen.Block(body))


def _statement(g: cgen.Generable) -> cgen.Generable:
    """`g` as one C statement: a pragma'd loop (a Module) needs braces under a for or if."""
    return cgen.Block(g.contents) if isinstance(g, cgen.Module) else g


def _atom(c: str) -> str:
    """`c` parenthesised unless it is a name or a number already."""
    return c if c.replace("_", "").isalnum() else f"({c})"


_OMP_REDUCTION = {"sum": "+", "prod": "*", "max": "max", "min": "min"}


class CpuBuilder(CBuilder):
    """Marks from `lower_cpu` become one OpenMP pragma on the loop right below them."""

    def emit_reduction_loop(self, it, init, cond, inc, call):
        """The update accumulates in a scalar that `omp simd reduction` may split into
        one accumulator per vector lane; the element is read once and written once."""
        s, iters = self._call(call)
        p = ExprPrinter(self.arrays, lambda pos: iters[pos])
        target = p.access(s.target, s.index)
        if re.search(rf"\b{it}\b", target):  # the element moves with the loop: no reduction
            return None
        ctype = C_TYPE[s.dtype]
        loop = cgen.For(f"int {it} = {init}", cond, f"{it} += {inc}",
                        cgen.Statement(p.update("acc", s.reduce, p.value(s.expr), s.dtype).rstrip(";")))
        return cgen.Block([cgen.Statement(f"{ctype} acc = {target}"),
                           cgen.Pragma(f"omp simd reduction({_OMP_REDUCTION[s.reduce]}:acc)"),
                           loop, cgen.Statement(f"{target} = acc")])

    def emit_loop(self, it, init, cond, inc, body, marks):
        # both marks on one loop (a one-member band) make `omp parallel for simd`
        words = (["parallel for"] if "parallel" in marks else []) + (
            ["simd"] if "simd" in marks else [])
        if "parallel" in marks and self.buffers:  # each thread its own contracted buffers
            words.append(f"private({', '.join(a.c_name for a in self.buffers)})")
        pragmas = ("omp " + " ".join(words),) if words else ()
        return super().emit_loop(it, init, cond, inc, body, pragmas)
