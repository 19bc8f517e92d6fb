"""C for statement bodies: values, array accesses and the op table per dtype.

Iterators are given as C strings (isl AST expressions for the statement's arguments), so
an index is written exactly once, by `comprehension.c_index`, here and nowhere else.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from ..graph.ir import INT_BITS, int_range
from ..graph.symbols import Reciprocal
from ..kernel import Array
from ..kernel.comprehension import Call, Const, Expr, Guarded, Index, Load, c_index

# float16 (a storage type: only loads, stores and casts touch it) is gcc's _Float16, the
# IEEE binary16 numpy's float16 holds; a conversion to it rounds to nearest even.
# bfloat16 (a storage type too) is its bits in a uint16_t, converted by the prelude's
# polyc_bf16_* (gcc 12's __bf16 has neither arithmetic nor conversions). bool (a storage
# type too) is _Bool, one byte holding 0 or 1 as numpy's bool does; a conversion to it is
# "nonzero", as numpy's astype(bool)
C_TYPE = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t",
          "float16": "_Float16", "bfloat16": "polyc_bf16", "bool": "_Bool"}

# Helpers every target's generated C relies on (ExprPrinter's calls, isl's AST helpers),
# emitted once per translation unit after the target's own prelude.
PRELUDE = r"""#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
/* isl AST helpers */
static inline long floord(long n, long d) { return n < 0 ? -((-n + d - 1) / d) : n / d; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
/* max= and min= updates; a NaN wins, as in numpy */
#define POLYC_EXTREMA(T, NAME) \
  static inline T polyc_max_##NAME(T acc, T v) { return (v > acc || v != v) ? v : acc; } \
  static inline T polyc_min_##NAME(T acc, T v) { return (v < acc || v != v) ? v : acc; }
POLYC_EXTREMA(float, float32)
POLYC_EXTREMA(double, float64)
POLYC_EXTREMA(int32_t, int32)
POLYC_EXTREMA(int64_t, int64)
/* C integer division, total: x / 0 is 0 and the least value / -1 wraps, as the
   reference does */
#define POLYC_IDIV(T, U, NAME) \
  static inline T polyc_idiv_##NAME(T a, T b) { return b == 0 ? 0 : (b == -1 ? (T)((U)0 - (U)a) : a / b); }
POLYC_IDIV(int32_t, uint32_t, int32)
POLYC_IDIV(int64_t, uint64_t, int64)
/* float32 transcendentals that gcc can vectorise (libm's are opaque calls): branch-free,
   within 2 ulp (erf: 4e-7 absolute), with IEEE results for +-inf and NaN */
static inline float polyc_bits_to_float(int32_t i) { union { int32_t i; float f; } u = { i }; return u.f; }
static inline int32_t polyc_float_to_bits(float f) { union { float f; int32_t i; } u = { f }; return u.i; }
/* bfloat16, stored as its bits: the high half of a float32. Narrowing rounds to nearest
   even, as ml_dtypes and PyTorch do; a NaN stays a NaN (quiet, its sign kept) */
typedef uint16_t polyc_bf16;
static inline float polyc_bf16_to_float(polyc_bf16 h) { return polyc_bits_to_float((int32_t)((uint32_t)h << 16)); }
static inline polyc_bf16 polyc_float_to_bf16(float f) {
  uint32_t u = (uint32_t)polyc_float_to_bits(f);
  return f != f ? (polyc_bf16)((u >> 16) | 0x40u) : (polyc_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* The helpers' polynomials, written once for these scalar helpers and for the cpu
   prelude's AVX-512 lanes: FMA(a, b, c) = a b + c, K(c) the coefficient c in FMA's type.
   2 exp(r) for |r| <= ln2/2, fitted for least maximum relative error (4e-9) */
#define POLYC_EXP_POLY(FMA, K, r) \
  FMA(FMA(FMA(FMA(FMA(FMA(K(0.00276736799f), r, K(0.0167496316f)), r, K(0.0833364502f)), \
                  r, K(0.333328396f)), r, K(0.999999821f)), r, K(2.0f)), r, K(2.0f))
/* tanh a = a + a^3 P(a^2) below 0.625, where 1 - 2 / (e^2a + 1) cancels; fitted (4e-9) */
#define POLYC_TANH_POLY(FMA, K, a2) \
  FMA(FMA(FMA(FMA(K(-0.00570498593f), a2, K(0.0206390861f)), a2, K(-0.0537397154f)), \
          a2, K(0.133314416f)), a2, K(-0.333332807f))
/* erf a = 1 - t Q(t) exp(-a^2), t = 1 / (1 + 0.3275911 a): Abramowitz-Stegun 7.1.26 */
#define POLYC_ERF_POLY(FMA, K, t) \
  FMA(FMA(FMA(FMA(K(1.061405429f), t, K(-1.453152027f)), t, K(1.421413741f)), \
          t, K(-0.284496736f)), t, K(0.254829592f))
/* erf a near 0 (a2 = a^2): its Taylor series */
#define POLYC_ERF_NEAR(a, a2) \
  ((a) * 1.12837916709551257f * (1.0f + (a2) * (-1.0f / 3.0f + (a2) * (1.0f / 10.0f \
   + (a2) * (-1.0f / 42.0f + (a2) * (1.0f / 216.0f + (a2) * (-1.0f / 1320.0f)))))))
#define POLYC_K(c) (c)
/* exp for arguments that cannot overflow (x <= ln(FLT_MAX), e.g. x - max(x)); results
   below 2^-125 flush to zero, as with FTZ hardware */
static inline float polyc_expf_no_overflow(float x) {
  /* n = round(x / ln2) by adding 1.5 * 2^23: t's low mantissa bits are n, two's complement */
  float t = __builtin_fmaf(x, 1.44269504088896341f, 12582912.0f);
  float n = t - 12582912.0f;
  float r = __builtin_fmaf(n, -0.693145751953125f, x);           /* x = n ln2 + r */
  r = __builtin_fmaf(n, -1.428606765330187045e-06f, r);
  float q = POLYC_EXP_POLY(__builtin_fmaf, POLYC_K, r);               /* 2 exp(r) */
  /* times 2^(n-1), built in the exponent field: normal for every n the range checks
     keep (-125 to 128), so a NaN in q stays NaN whatever t's bits are */
  uint32_t e = ((uint32_t)polyc_float_to_bits(t) - 0x4b400000u + 126u) << 23;
  float y = q * polyc_bits_to_float((int32_t)e);
  return x < -86.6433f ? 0.0f : y;
}
static inline float polyc_expf(float x) {
  /* 88.72283f is the last float below ln(FLT_MAX) */
  return x > 88.72283f ? INFINITY : polyc_expf_no_overflow(x);
}
static inline float polyc_logf(float x) {
  int32_t sub = x < 1.17549435e-38f;                             /* scale subnormals up */
  float xs = sub ? x * 8388608.0f : x;
  int32_t bits = polyc_float_to_bits(xs);
  int32_t e = ((bits >> 23) & 0xff) - 127;
  float m = polyc_bits_to_float((bits & 0x007fffff) | 0x3f800000); /* in [1, 2) */
  int32_t big = m > 1.41421356f;                                  /* to [sqrt(1/2), sqrt(2)) */
  m = big ? 0.5f * m : m;
  float ef = (float)(e + big - (sub ? 23 : 0));
  float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;                  /* log m = 2 atanh s */
  float p = 1.0f / 9.0f;
  p = __builtin_fmaf(p, s2, 1.0f / 7.0f); p = __builtin_fmaf(p, s2, 1.0f / 5.0f);
  p = __builtin_fmaf(p, s2, 1.0f / 3.0f); p = __builtin_fmaf(p, s2, 1.0f);
  float y = __builtin_fmaf(ef, 0.693147180559945309f, 2.0f * s * p);
  y = x == INFINITY ? INFINITY : y;
  y = x == 0.0f ? -INFINITY : y;
  return (x < 0.0f || x != x) ? NAN : y;
}
/* 1 / d for d in [2^-126, 2^126]: a vector divide has a throughput of one in 10-16
   cycles, these seven operations pipeline (linear+gelu's tanh form: the whole kernel 4%
   faster in pairs on Sapphire Rapids, half its epilogue's cost). A first guess from the exponent field within 12.5%, then
   three Newton steps on the residual 1 - d r: the error squares at each, to under an
   ulp; a NaN stays NaN */
static inline float polyc_recipf(float d) {
  float r = polyc_bits_to_float(0x7ef311c3 - polyc_float_to_bits(d));
  r = __builtin_fmaf(r, __builtin_fmaf(-d, r, 1.0f), r);
  r = __builtin_fmaf(r, __builtin_fmaf(-d, r, 1.0f), r);
  return __builtin_fmaf(r, __builtin_fmaf(-d, r, 1.0f), r);
}
static inline float polyc_tanhf(float x) {
  float a = x < 0.0f ? -x : x;
  float e = polyc_expf(2.0f * (a > 20.0f ? 20.0f : a));
  float big = 1.0f - 2.0f * polyc_recipf(e + 1.0f);
  float a2 = a * a;
  float small = __builtin_fmaf(a * a2, POLYC_TANH_POLY(__builtin_fmaf, POLYC_K, a2), a);
  float y = a < 0.625f ? small : big;
  y = x < 0.0f ? -y : y;
  return x != x ? x : y;
}
/* below -86.6433 exp(-x) overflows the guess's range and the result is below 2^-125:
   flushed, as exp's are */
static inline float polyc_sigmoidf(float x) {
  return x < -86.6433f ? 0.0f : polyc_recipf(1.0f + polyc_expf_no_overflow(-x));
}
static inline float polyc_erff(float x) {
  float a = x < 0.0f ? -x : x;
  /* Abramowitz-Stegun 7.1.26; past 16, exp(-a^2) is 0 and t only needs to be finite */
  float t = polyc_recipf(__builtin_fmaf(0.3275911f, a > 16.0f ? 16.0f : a, 1.0f));
  float far = 1.0f - POLYC_ERF_POLY(__builtin_fmaf, POLYC_K, t) * t * polyc_expf(-a * a);
  float a2 = a * a;
  float near = POLYC_ERF_NEAR(a, a2);
  float y = a < 0.5f ? near : far;
  y = x < 0.0f ? -y : y;
  return x != x ? x : y;
}
"""

# name -> template over args a, b; {f} is the float function suffix, {t} the dtype.
# relu, maximum and minimum let a NaN through, as numpy and PyTorch do (fmax would not)
_FLOAT_FNS = {
    "neg": "(-{a})", "abs": "fabs{f}({a})", "exp": "exp{f}({a})", "log": "log{f}({a})",
    "sqrt": "sqrt{f}({a})", "rsqrt": "({one} / sqrt{f}({a}))", "tanh": "tanh{f}({a})",
    "erf": "erf{f}({a})", "sigmoid": "({one} / ({one} + exp{f}(-{a})))",
    "relu": "({a} < {zero} ? {zero} : {a})", "reciprocal": "({one} / {a})",
    "floor": "floor{f}({a})", "ceil": "ceil{f}({a})",
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "pow": "pow{f}({a}, {b})",
    "maximum": "polyc_max_{t}({a}, {b})", "minimum": "polyc_min_{t}({a}, {b})",
}
# float32 ops whose prelude version vectorises
_FLOAT32_FNS = {"exp": "polyc_expf({a})", "log": "polyc_logf({a})", "tanh": "polyc_tanhf({a})",
                "erf": "polyc_erff({a})", "sigmoid": "polyc_sigmoidf({a})"}
# ...each a polynomial inlined where it is called: a loop of them is much code for gcc
INLINED_FNS = frozenset(_FLOAT32_FNS)
# integer ops over {i} (int32_t / int64_t) wrap like the reference: signed overflow is
# undefined in C, so they compute in the unsigned type {u}
_INT_FNS = {
    "neg": "({i})(({u})0 - ({u}){a})", "abs": "({a} < 0 ? ({i})(({u})0 - ({u}){a}) : {a})",
    "relu": "({a} > 0 ? {a} : 0)",
    "add": "({i})(({u}){a} + ({u}){b})",
    "sub": "({i})(({u}){a} - ({u}){b})",
    "mul": "({i})(({u}){a} * ({u}){b})", "div": "polyc_idiv_{t}({a}, {b})",
    "maximum": "({a} > {b} ? {a} : {b})", "minimum": "({a} < {b} ? {a} : {b})",
}
_INT_UPDATE = {"sum": "+", "prod": "*"}


def _int_types(dtype: str) -> dict[str, str]:
    return {"i": C_TYPE[dtype], "u": "u" + C_TYPE[dtype], "t": dtype}
_COMPARE = {"greater": ">", "less": "<", "equal": "==", "greater_equal": ">=",
            "less_equal": "<=", "not_equal": "!="}


def c_literal(value: float | int, dtype: str) -> str:
    """A C constant of `dtype`; a negative one is parenthesised, because the op
    templates put values right after a minus (`(-{a})`, `exp(-{a})`), and `--2.0f` is a
    decrement, not a number."""
    if isinstance(value, Reciprocal):  # a symbolic mean's 1/N, in double as the literal is
        exact = f"(1.0 / (double)({value.count}))"
        return exact if dtype == "float64" else f"(({C_TYPE[dtype]}){exact})"
    if dtype == "bool":
        return "1" if value else "0"
    if dtype == "bfloat16":  # its bits, rounded as the runtime's polyc_float_to_bf16 does
        bits = np.asarray(value, np.float32).astype("bfloat16").view(np.uint16)
        return f"((polyc_bf16)0x{int(bits):04x})"
    if dtype in INT_BITS:
        v = int(value)
        # the least value's digits do not fit the type: -2147483648 is not an int literal
        text = f"{v + 1} - 1" if v == int_range(dtype)[0] else str(v)
    else:
        v = float(value)
        if math.isinf(v):
            text = "INFINITY" if v > 0 else "-INFINITY"
        elif math.isnan(v):
            text = "NAN"
        else:
            text = repr(v) + ("f" if dtype in ("float32", "float16") else "")
    return f"({text})" if text.startswith("-") else text


def c_size(size) -> str:
    """C for a size or stride: an int, or a polynomial of the symbols (the kernel's
    int64_t parameters, so products of them are int64_t too), powers written as
    products (`L**2` is `L*L`)."""
    if type(size) is int:
        return str(size)
    from sympy.printing.precedence import PRECEDENCE
    from sympy.printing.str import StrPrinter

    class Printer(StrPrinter):
        def _print_Pow(self, expr, rational=False):
            if not (expr.exp.is_Integer and expr.exp > 0):
                raise ValueError(f"{size} is not a polynomial of the symbols")
            return "*".join([self.parenthesize(expr.base, PRECEDENCE["Mul"])] * int(expr.exp))

    return Printer().doprint(size)


class ExprPrinter:
    """Prints a statement's values given C strings for its iterators."""

    def __init__(self, arrays: Mapping[str, Array], iters: Callable[[int], str]):
        self.arrays = arrays
        self.iters = iters

    def access(self, tensor: str, index: tuple[Index, ...]) -> str:
        a = self.arrays[tensor]
        if a.kept == ():
            return a.c_name  # a buffer of one element is a C scalar
        return f"{a.c_name}[{self.flat(tensor, index)}]"

    def flat(self, tensor: str, index: tuple[Index, ...]) -> str:
        """The element's offset in the tensor's (or its buffer's) C array."""
        a = self.arrays[tensor]
        dims = range(a.type.ndim) if a.kept is None else a.kept  # a buffer drops pinned dims
        if a.block is not None:  # one block of rows: the dims before dropped, the rows wrapped
            dims = range(a.block[0], a.type.ndim)
        terms = []
        stride = 1
        for d in reversed(dims):
            e = c_index(index[d], self.iters)
            if a.block is not None and d == a.block[0] and e != "0":
                e = f"({e}) % {a.block[1]}"
            if e != "0":
                e = e if e.replace("_", "").isalnum() else f"({e})"
                # a symbolic stride (64*N, N + 1) is an expression: parenthesised
                terms.append(e if stride == 1 else f"{e} * {stride}" if type(stride) is int
                             else f"{e} * ({c_size(stride)})")
            stride *= a.type.shape[d]
        return " + ".join(reversed(terms)) or "0"

    def value(self, e: Expr) -> str:
        if isinstance(e, Load):
            return self.access(e.tensor, e.index)
        if isinstance(e, Const):
            return c_literal(e.value, e.dtype)
        if isinstance(e, Guarded):
            cond = " && ".join(
                f"{b.lo} <= ({b.aff.render(self.iters)}) && ({b.aff.render(self.iters)}) < {b.hi}"
                for b in e.bounds)
            return f"(({cond}) ? {self.value(e.then)} : {self.value(e.otherwise)})"
        return self.call(e)

    def call(self, e: Call) -> str:
        args = [self.value(a) for a in e.args]
        if e.fn == "cast":
            return _cast(args[0], e.args[0].dtype, e.dtype)
        if e.fn == "nonpositive":  # a fact about the value (prologue.recompute), no code
            return args[0]
        if e.fn == "select":
            # both operands read first (they are in bounds: a conditional read is a
            # Guarded): a ?: with a load on one side makes gcc mask that load, which it
            # vectorises as a gather (causal attention's mask: a quarter of the softmax)
            t = C_TYPE[e.dtype]
            return (f"({{ const {t} polyc_s1 = {args[1]}; const {t} polyc_s2 = {args[2]}; "
                    f"{args[0]} != 0 ? polyc_s1 : polyc_s2; }})")
        if e.fn in _COMPARE:
            return f"(({C_TYPE[e.dtype]})({args[0]} {_COMPARE[e.fn]} {args[1]}))"
        a, b = (args + [None])[:2]
        if e.dtype in INT_BITS:
            return _INT_FNS[e.fn].format(a=a, b=b, **_int_types(e.dtype))
        if e.dtype == "float32" and e.fn == "exp" and (
                (isinstance(e.args[0], Load) and self.arrays[e.args[0].tensor].nonpositive)
                or (isinstance(e.args[0], Call) and e.args[0].fn == "nonpositive")):
            return f"polyc_expf_no_overflow({a})"  # x - max(x): the overflow check never fires
        if e.dtype == "float32" and e.fn in _FLOAT32_FNS:
            return _FLOAT32_FNS[e.fn].format(a=a)
        suffix = "f" if e.dtype == "float32" else ""
        return _FLOAT_FNS[e.fn].format(a=a, b=b, f=suffix, t=e.dtype,
                                       one=c_literal(1, e.dtype), zero=c_literal(0, e.dtype))

    def update(self, target: str, reduce: str | None, value: str, dtype: str) -> str:
        """The C statement `target (reduce)= value`."""
        if reduce is None:
            return f"{target} = {value};"
        if reduce in _INT_UPDATE:
            op = _INT_UPDATE[reduce]
            if dtype in INT_BITS:
                t = _int_types(dtype)
                return f"{target} = ({t['i']})(({t['u']}){target} {op} ({t['u']})({value}));"
            return f"{target} {op}= {value};"
        return f"{target} = polyc_{reduce}_{dtype}({target}, {value});"


def _cast(value: str, src: str, dst: str) -> str:
    """C converting `value` from dtype `src` to `dst`; bfloat16 goes through float32."""
    if src == dst:
        return value
    if src == "bfloat16":
        value, src = f"polyc_bf16_to_float({value})", "float32"
    if dst == "bfloat16":
        return f"polyc_float_to_bf16({value if src == 'float32' else f'(float)({value})'})"
    return f"(({C_TYPE[dst]})({value}))"
