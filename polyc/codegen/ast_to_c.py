"""isl AST -> C through cgen, one function per kernel: the target-neutral walk.

`CBuilder` walks the AST isl generated from a kernel's schedule tree and calls one hook
per construct; a target's builder overrides the hooks it needs (the cpu's emits OpenMP
pragmas and vector loops from its marks, packs microkernel operands, ...):

    for_loop(node, marks)   a loop (`emit_loop` prints it)
    emit_if                 a condition
    emit_mark(mark, child, marks)   a schedule-tree mark (typed, `schedule_tree.marks`);
                            by default it applies to the first loop level below it
    emit_assign(s, iters)   one statement instance
    declare_buffer(a)       a local contracted to a small buffer (`contract.py`):
                            (declaration, release or None)
    declare_local(a)        a local that could not be contracted: (allocation, release)

The ABI of every kernel function is `void NAME(T *restrict p0, ..., T *restrict pn)`: one
pointer per `in` / `out` array, in `Kernel.params` order, each a dense row-major buffer
of the array's shape and dtype; `in` pointers are `const`. Arrays never alias. A
symbolic kernel takes its symbols' values after them (`int64_t`, `Kernel.symbols`).
"""
from __future__ import annotations

import math
import re

import cgen
import islpy as isl

from ..kernel import Array, Kernel, c_comment
from ..kernel.comprehension import Statement
from ..schedule_tree import marks as mk
from .cexpr import C_TYPE, ExprPrinter, c_size

_T = isl.ast_node_type


class CBuilder:
    """Turns an isl AST of one kernel into a cgen function definition."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.statements: dict[str, Statement] = {s.name: s for s in kernel.statements}
        self.arrays: dict[str, Array] = {a.tensor: a for a in kernel.arrays}
        # contracted locals: small arrays declared once (per thread, where threads run)
        self.buffers = [a for a in kernel.arrays if a.kept is not None]
        self.unstored: list[Array] = []  # locals no code touched (function())

    # -- the walk ------------------------------------------------------------------
    def node(self, n: isl.AstNode, marks: tuple = ()) -> cgen.Generable:
        """C for an AST node; `marks` are the schedule-tree marks right above it, which
        apply to the first loop level only."""
        kind = n.get_type()
        if kind == _T.for_:
            return self.for_loop(n, marks)
        if kind == _T.if_:
            other = statement(self.node(n.if_get_else_node())) if n.if_has_else_node() else None
            return self.emit_if(n.if_get_cond().to_C_str(),
                                statement(self.node(n.if_get_then_node())), other)
        if kind == _T.block:
            children = n.block_get_children()
            return cgen.Block([self.node(children.get_at(i), marks)
                               for i in range(children.n_ast_node())])
        if kind == _T.mark:
            return self.emit_mark(mk.parse(n.mark_get_id().get_name()), n.mark_get_node(), marks)
        if kind == _T.user:
            return self.emit_user(n.user_get_expr())
        raise NotImplementedError(f"isl AST node of kind {kind}")

    @staticmethod
    def header(n: isl.AstNode) -> tuple[str, str, str, str]:
        """(iterator, init, condition, increment) of a for node, as C."""
        return (n.for_get_iterator().get_id().get_name(), n.for_get_init().to_C_str(),
                n.for_get_cond().to_C_str(), n.for_get_inc().to_C_str())

    # -- hooks ----------------------------------------------------------------------
    def for_loop(self, n: isl.AstNode, marks: tuple) -> cgen.Generable:
        return self.emit_loop(*self.header(n), statement(self.node(n.for_get_body())), marks)

    def emit_loop(self, it: str, init: str, cond: str, inc: str, body: cgen.Generable,
                  marks: tuple) -> cgen.Generable:
        return cgen.For(f"int {it} = {init}", cond, f"{it} += {inc}", body)

    def emit_if(self, cond: str, then: cgen.Generable, other: cgen.Generable | None) -> cgen.Generable:
        return if_(cond, then, other)

    def emit_mark(self, mark: mk.Mark, child: isl.AstNode, marks: tuple) -> cgen.Generable:
        return self.node(child, marks + (mark,))

    def _call(self, call: isl.AstExpr) -> tuple[Statement, list[str]]:
        name = call.get_op_arg(0).get_id().get_name()
        args = [atom(call.get_op_arg(i).to_C_str()) for i in range(1, call.get_op_n_arg())]
        return self.statements[name], args

    def emit_user(self, call: isl.AstExpr) -> cgen.Generable:
        return self.emit_assign(*self._call(call))

    def emit_assign(self, s: Statement, iters: list[str]) -> cgen.Generable:
        p = ExprPrinter(self.arrays, lambda pos: iters[pos])
        target = p.access(s.target, s.index)
        return cgen.Statement(p.update(target, s.reduce, p.value(s.expr), s.dtype).rstrip(";"))

    def declare_buffer(self, a: Array) -> tuple[cgen.Generable, cgen.Generable | None]:
        """(declaration, release or None): a buffer as long as a symbolic dim is on the
        heap, since its length is the call's and may be too large for a stack."""
        ctype, elements = C_TYPE[a.type.dtype], math.prod(a.buffer_shape)
        if type(elements) is not int:
            return (cgen.Statement(f"{ctype} *restrict {a.c_name} = "
                                   f"malloc(sizeof({ctype}) * (size_t)({c_size(elements)}))"),
                    cgen.Statement(f"free({a.c_name})"))
        size = f"[{elements}]" if a.kept else ""
        return cgen.Statement(f"{ctype} {a.c_name}{size}"), None

    def declare_local(self, a: Array) -> tuple[cgen.Generable, cgen.Generable]:
        return (cgen.Statement(f"{C_TYPE[a.type.dtype]} *restrict {a.c_name} = "
                               f"malloc((size_t)({c_size(a.type.nbytes)}))"),
                cgen.Statement(f"free({a.c_name})"))

    # -- the function -----------------------------------------------------------------
    def function(self, ast: isl.AstNode) -> cgen.FunctionBody:
        body = [cgen.Comment(c_comment(f"{a.c_name}: {a.role} {a.type} tensor '{a.tensor}'"))
                for a in self.kernel.arrays]
        body += [cgen.Comment(c_comment(f"{s.name}: from {s.origin}"))
                 for s in self.kernel.statements]
        code = self.node(ast)
        # locals no code touches are not declared: a contraction's result a microkernel
        # keeps in registers, the epilogue values its write-back holds in its own names
        text = str(code)
        untouched = {a.c_name for a in self.kernel.arrays
                     if a.role == "local" and not mentions(text, a.c_name)}
        buffers = [self.declare_buffer(a) for a in self.buffers if a.c_name not in untouched]
        body += [take for take, release in buffers if release is None]
        # locals that could not be contracted live whole for the call
        locals_ = [a for a in self.kernel.arrays if a.role == "local" and a.kept is None]
        self.unstored = [a for a in self.kernel.arrays if a.c_name in untouched]
        held = [self.declare_local(a) for a in locals_ if a not in self.unstored]
        held += [(take, release) for take, release in buffers if release is not None]
        body += [take for take, _ in held] + [code] + [release for _, release in held]
        return cgen.FunctionBody(declaration(self.kernel), cgen.Block(body))


def declaration(kernel: Kernel) -> cgen.FunctionDeclaration:
    """`void name(arrays..., symbols...)`: what the runtime calls."""
    params = []
    for a in kernel.params:
        value = cgen.RestrictPointer(cgen.Value(C_TYPE[a.type.dtype], a.c_name))
        params.append(cgen.Const(value) if a.role == "in" else value)
    params += [cgen.Value("int64_t", name) for name in kernel.symbols]
    return cgen.FunctionDeclaration(cgen.Value("void", kernel.name), params)


def dispatcher(kernel: Kernel, versions: list[tuple[str, str]]) -> cgen.FunctionBody:
    """The kernel's function as a choice among its versions (C condition, function name):
    the first whose condition holds runs; the last one's condition is not tested."""
    args = ", ".join([a.c_name for a in kernel.params] + list(kernel.symbols))
    body: cgen.Generable = cgen.Statement(f"{versions[-1][1]}({args})")
    for cond, name in reversed(versions[:-1]):
        body = if_(cond, cgen.Statement(f"{name}({args})"), body)
    return cgen.FunctionBody(declaration(kernel), cgen.Block([body]))


def user_calls(node: isl.AstNode) -> list[isl.AstExpr] | None:
    """The statement calls of a loop body made only of statements, else None."""
    if node.get_type() == _T.user:
        return [node.user_get_expr()]
    if node.get_type() != _T.block:
        return None
    children = node.block_get_children()
    kids = [children.get_at(i) for i in range(children.n_ast_node())]
    if any(k.get_type() != _T.user for k in kids):
        return None
    return [k.user_get_expr() for k in kids]


def mentions(text: str, name: str) -> bool:
    """Does C `text` use the identifier `name` (not as part of a longer one)?"""
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def if_(cond: str, then: cgen.Generable, other: cgen.Generable | None = None) -> cgen.If:
    """cgen's If, its branches braced where C would read them otherwise: cgen prints
    them bare, and C gives an else to the innermost if before it (one ending `then`: a
    nested if, or a loop around one), and a pragma'd loop (a Module) is two lines."""
    then = statement(then)
    if (other is not None or isinstance(then, cgen.If)) \
            and not isinstance(then, (cgen.Block, cgen.Statement)):
        then = cgen.Block([then])
    return cgen.If(cond, then, None if other is None else statement(other))


def statement(g: cgen.Generable) -> cgen.Generable:
    """`g` as one C statement: a pragma'd loop (a Module) needs braces under a for or if."""
    return cgen.Block(g.contents) if isinstance(g, cgen.Module) else g


def atom(c: str) -> str:
    """`c` parenthesised unless it is a name or a number already."""
    return c if c.replace("_", "").isalnum() else f"({c})"
