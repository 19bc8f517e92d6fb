"""A float32 value printed as 16 lanes: the C of a gemm tile's epilogue on 16 consecutive
columns of a row at once, in gcc's vector type `polyc_v16` and the cpu prelude's AVX-512
helpers (`polyc_v_*`). The write-back of a heavy epilogue (gelu, silu, tanh) takes it,
B packed or read in place, where every access is one float a column apart or the same in
every column: gcc's vectorisation of the scalar loop finds neither vrcp14ps nor
vscalefps (about 40 instructions a vector for the tanh gelu, 31 so), and masks each
vector of every tile where lanes mask the edge tiles' only (linear+gelu 1024x1024 @
1024x4096, Zen 5, 1 thread, in pairs of calls: 0.99x the time, its epilogue +4% over the
matmul alone to +3%); a value of the row, which gcc would not load in a masked loop, is
in every lane (a convolution's bias and silu, its B read in place: +18% over its bias
and relu to +2.5%)."""
from __future__ import annotations

import cgen

from ....codegen.cexpr import c_literal
from ....kernel.comprehension import Aff, Call, Const, Expr, Guarded, Load, Statement
from ....microkernels.analysis import iterators
from .common import Scalars

LANES = 16
LANE_TYPE = "polyc_v16"

# name -> C over lanes a, b (polyc_v16 values)
_FNS = {
    "neg": "(-{a})", "abs": "polyc_v_abs({a})", "exp": "polyc_v_expf({a})",
    "tanh": "polyc_v_tanhf({a})", "erf": "polyc_v_erff({a})", "sigmoid": "polyc_v_sigmoidf({a})",
    "relu": "polyc_v_relu({a})", "sqrt": "polyc_v_sqrt({a})",
    "rsqrt": "(polyc_v_set(1.0f) / polyc_v_sqrt({a}))", "reciprocal": "(polyc_v_set(1.0f) / {a})",
    "floor": "polyc_v_floor({a})", "ceil": "polyc_v_ceil({a})",
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "maximum": "polyc_v_max({a}, {b})", "minimum": "polyc_v_min({a}, {b})",
    "nonpositive": "{a}",  # a fact about the value, no code
}


class Lanes(Scalars):
    """Prints values on the lanes of `col` (an iterator position; the iterators name the
    first lane's point): a load one float a column apart is 16 floats from its address,
    one that does not move with the column is its value in every lane. `mask`: the C
    name of the lanes' mask (the first columns only: a tile's edge, a run of a row, the
    last vector of a tile 14 wide), '' for all 16."""

    def __init__(self, arrays, iters, col: int, mask: str = "", scalars: dict | None = None):
        super().__init__(arrays, iters, {} if scalars is None else scalars)
        self.col, self.mask = col, mask

    def weight(self, tensor: str, index) -> int | None:
        """How many floats the access moves by from one column to the next, or None
        where that is not one number (a modulo, a row block, a symbolic stride)."""
        a = self.arrays[tensor]
        dims = range(a.type.ndim) if a.kept is None else a.kept
        if a.block is not None:
            dims = range(a.block[0], a.type.ndim)
        weight, stride = 0, 1
        for d in reversed(dims):
            x = index[d]
            if self.col in iterators(x):
                if not isinstance(x, Aff) or (a.block is not None and d == a.block[0]):
                    return None
                if type(stride) is not int:
                    return None
                weight += dict(x.terms)[self.col] * stride
            stride = stride * a.type.shape[d]
        return weight

    def supports(self, statements: tuple[Statement, ...], stored: set[str]) -> bool:
        """Can `statements` (an init or epilogue, in order) be printed on lanes, the
        tensors in `stored` stored 16 consecutive floats at once?"""
        held = set(self.scalars)
        for s in statements:
            if s.dtype != "float32" or not self._printable(s.expr, held):
                return False
            if s.target in stored and self.weight(s.target, s.index) != 1:
                return False
            held.add(s.target)
        return True

    def _printable(self, e: Expr, held: set[str]) -> bool:
        if isinstance(e, Load):
            return e.tensor in held or (e.dtype == "float32"
                                        and self.weight(e.tensor, e.index) in (0, 1))
        if isinstance(e, Const):
            return e.dtype == "float32"
        if isinstance(e, Guarded):
            return False
        return (e.dtype == "float32" and e.fn in _FNS
                and all(self._printable(a, held) for a in e.args))

    def value(self, e: Expr) -> str:
        if isinstance(e, Load) and e.tensor not in self.scalars:
            if self.weight(e.tensor, e.index) == 0:
                return f"polyc_v_set({self.access(e.tensor, e.index)})"
            return self.at(self.access(e.tensor, e.index))
        if isinstance(e, Const):
            return f"polyc_v_set({c_literal(e.value, e.dtype)})"
        if isinstance(e, Call):
            args = [self.value(a) for a in e.args]
            return _FNS[e.fn].format(a=args[0], b=(args + [None])[1])
        return super().value(e)

    def at(self, lvalue: str) -> str:
        """The 16 floats from C lvalue `lvalue` on."""
        if self.mask:
            return f"polyc_v_loadm(&{lvalue}, {self.mask})"
        return f"polyc_v_load(&{lvalue})"

    def ctype(self, dtype: str) -> str:
        return LANE_TYPE

    def assign(self, lvalue: str, value: str) -> cgen.Generable:
        if self.mask:
            return cgen.Statement(f"polyc_v_storem(&{lvalue}, {value}, {self.mask})")
        return cgen.Statement(f"polyc_v_store(&{lvalue}, {value})")
