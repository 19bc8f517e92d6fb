"""What the microkernel emitters share: C for flattened indices, scalars for tensors the
write-back keeps in registers, rounding."""
from __future__ import annotations

import re

import cgen

from ....codegen.ast_to_c import if_, mentions
from ....codegen.cexpr import C_TYPE, ExprPrinter, c_size
from ....kernel.comprehension import Expr, Index, Load, Statement

# K rows packed per pass of the run packer (pack.py's _run_nest)
ROWS = 8


class Scalars(ExprPrinter):
    """Prints loads of tensors the write-back holds in C scalars as those scalars."""

    def __init__(self, arrays, iters, scalars: dict[str, str]):
        super().__init__(arrays, iters)
        self.scalars = scalars

    def value(self, e: Expr) -> str:
        if isinstance(e, Load) and e.tensor in self.scalars:
            return self.scalars[e.tensor]
        return super().value(e)

    def ctype(self, dtype: str) -> str:
        return C_TYPE[dtype]

    def at(self, lvalue: str) -> str:
        """The value at C lvalue `lvalue` (`Lanes`: the 16 from it on)."""
        return lvalue

    def assign(self, lvalue: str, value: str) -> cgen.Generable:
        return cgen.Assign(lvalue, value)


def in_scalars(printer: Scalars, target: str, index: Index, value: str,
               epilogue: tuple[Statement, ...], name, stored) -> list[cgen.Generable]:
    """A contraction's element `value` (of `target`, stored at `index`) through its
    `epilogue` in the values `printer` prints (C scalars, or `Lanes`), `name(k)` the
    k-th statement's: each array `stored(tensor)` names is assigned its value, the
    others live in registers only."""
    printer.scalars[target] = value
    out = [printer.assign(printer.access(target, index), value)] if stored(target) else []
    for k, e in enumerate(epilogue):
        out.append(cgen.Statement(f"const {printer.ctype(e.dtype)} {name(k)} = "
                                  f"{printer.value(e.expr)}"))
        printer.scalars[e.target] = name(k)
        if stored(e.target):
            out.append(printer.assign(printer.access(e.target, e.index), name(k)))
    return out


def decompose(names: list[str], extents: list[int], flat: str) -> list[cgen.Generable]:
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


def virtual(names: list[str], weights: tuple[int, ...], flat: str) -> list[cgen.Generable]:
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



def kept(held: str, whole: str, size: int, fill: list[cgen.Generable]) -> list[cgen.Generable]:
    """`float *whole`: `size` bytes that `fill` writes on the kernel's first call, into a
    buffer the loaded object keeps (`static held`): a constant operand's panels. Two
    threads calling first may both fill one; one buffer is published, the other freed."""
    return [
        cgen.Statement(f"static float *{held}"),
        cgen.Statement(f"float *restrict {whole} = __atomic_load_n(&{held}, __ATOMIC_ACQUIRE)"),
        if_(f"!{whole}", cgen.Block([
            cgen.Block([
                cgen.Statement(f"float *restrict {whole} = aligned_alloc(64, {c_size(size)})"),
                if_(f"!{whole}", cgen.Statement("abort()")),  # no error channel in the ABI
                *fill,
                cgen.Statement("float *mk_none = 0"),
                if_(f"!__atomic_compare_exchange_n(&{held}, &mk_none, {whole}, 0, "
                    "__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)",
                    cgen.Statement(f"free({whole})"))]),
            cgen.Assign(whole, f"__atomic_load_n(&{held}, __ATOMIC_ACQUIRE)")]))]


def up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def stride(shape: tuple[int, ...], d: int) -> int:
    w = 1
    for n in shape[d + 1:]:
        w *= n
    return w


def read_only(code: list[cgen.Generable]) -> list[cgen.Generable]:
    """`code` without the `const` values nothing after them reads (a batch index or an
    output row only an epilogue would, on a path without it): gcc -Wall names each."""
    kept: list[cgen.Generable] = []
    after = ""  # the C of what is kept after g
    for g in reversed(code):
        text = str(g)
        m = re.match(r"const [\w *]*?(mk_\w+) = ", text) if isinstance(g, cgen.Statement) else None
        if m and not mentions(after, m.group(1)):
            continue
        kept.insert(0, g)
        after = text + "\n" + after
    return kept
