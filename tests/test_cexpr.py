"""Unit tests of the C printed for statement values (`polyc.codegen.cexpr`)."""
from __future__ import annotations

import math
import re
import shutil
import subprocess

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.codegen.cexpr import _FLOAT_FNS, _INT_FNS, ExprPrinter, c_literal
from polyc.compiler import Options, compile
from polyc.kernel.comprehension import Call, Const


@pytest.mark.parametrize("dtype,fns", [("float32", _FLOAT_FNS), ("float64", _FLOAT_FNS),
                                       ("int32", _INT_FNS), ("int64", _INT_FNS)])
def test_negative_constants_never_meet_a_minus(dtype, fns):
    # `(-{a})` of a bare `-2.0f` printed `(--2.0f)`, a decrement gcc rejects; constants
    # reach op templates whenever a scalar constant is folded into the code.
    printer = ExprPrinter({}, str)
    minus_two = Const(-2, dtype)
    for fn in fns:
        text = printer.value(Call(fn, (minus_two, minus_two), dtype))
        assert "--" not in text.replace(" ", ""), (fn, text)


def test_literals():
    assert c_literal(-2.0, "float32") == "(-2.0f)"
    assert c_literal(3, "float64") == "3.0"
    assert c_literal(float("-inf"), "float32") == "(-INFINITY)"
    assert c_literal(-2**31, "int32") == "(-2147483647 - 1)"
    assert c_literal(-2**63, "int64") == "(-9223372036854775807 - 1)"
    assert c_literal(2**40, "int64") == "1099511627776"
    # bfloat16 is its bits, rounded to nearest even: 1 + 2^-8 is a tie, 1 + 3 * 2^-8 too
    assert c_literal(1.0, "bfloat16") == "((polyc_bf16)0x3f80)"
    assert c_literal(1 + 2**-8, "bfloat16") == "((polyc_bf16)0x3f80)"
    assert c_literal(1 + 3 * 2**-8, "bfloat16") == "((polyc_bf16)0x3f82)"
    assert c_literal(float("-inf"), "bfloat16") == "((polyc_bf16)0xff80)"
    assert c_literal(-0.0, "float64") == "(-0.0)"


def _sweep() -> np.ndarray:
    """Every kind of float32 the helpers branch on: specials, the range edges, subnormals,
    and a dense logarithmic sweep of both signs."""
    mag = np.logspace(-40, 38.5, 20001, dtype=np.float64)
    edges = [88.72283, 88.7228394, 88.38, 88.0, -86.6433, -86.64, -87.3, -87.9, -103.0,
             0.5, 0.0625, 20.0, 1e-45, 1.17549435e-38, 3.4028235e38]
    values = np.concatenate([mag, -mag, edges, np.negative(edges), [0.0, np.inf, -np.inf]])
    return np.concatenate([values.astype(np.float32), [np.float32(np.nan)]])


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in float32 units in the last place (want in float64)."""
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("op,exact,ulps,flush", [
    ("exp", np.exp, 2, 2.0 ** -125), ("log", np.log, 2, 0.0), ("tanh", np.tanh, 2, 0.0),
    ("sigmoid", _sigmoid, 3, 2.0 ** -125)])
def test_float32_math_over_the_whole_range(op, exact, ulps, flush):
    # the prelude's vectorisable versions replace libm for float32: IEEE results for
    # +-inf and NaN, within `ulps` elsewhere, flushed to zero only below `flush`
    x = _sweep()
    if op == "log":
        x = np.abs(x)
    b = GraphBuilder(op)
    graph = b.build([b.op(op, b.input("x", x.shape, "float32"), out="y")])
    got = compile(graph, options=Options(parallel=False))(x=x)["y"]
    _assert_bounds(op, got, x, exact, ulps, flush)


def _assert_bounds(op: str, got: np.ndarray, x: np.ndarray, exact, ulps: float,
                   flush: float) -> None:
    """`got`, `op` of float32 `x`, against `exact` in float64: IEEE results where the
    rounded result is +-inf, NaN or 0, within `ulps` elsewhere, flushed to zero only
    below `flush`."""
    with np.errstate(all="ignore"):
        want = exact(x.astype(np.float64))
        rounded = want.astype(np.float32)  # overflows to inf where float32 does
    special = ~np.isfinite(rounded) | (rounded == 0)
    np.testing.assert_array_equal(got[special], rounded[special])
    tiny = ~special & (np.abs(want) < flush)
    assert np.all((got[tiny] == 0) | (_ulps(got[tiny], want[tiny]) <= ulps))
    normal = ~special & ~tiny & (np.abs(want) >= np.finfo(np.float32).tiny)
    worst = _ulps(got[normal], want[normal]).max()
    assert worst <= ulps, f"{op}: {worst:.1f} ulp"


def test_sigmoid_tanh_and_erf_divide_nowhere():
    # a vector divide issues once in 10-16 cycles: in a matmul's epilogue (tanh gelu)
    # it doubled the epilogue's cost; the reciprocal is a guess and Newton steps
    x = np.linspace(-9, 9, 4096, dtype=np.float32)
    b = GraphBuilder("no_divide")
    xs = b.input("x", x.shape, "float32")
    graph = b.build([b.op(op, xs, out=op) for op in ("sigmoid", "tanh", "erf")])
    compiled = compile(graph, options=Options(parallel=False))
    got = compiled(x=x)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(got["sigmoid"], _sigmoid(x.astype(np.float64)), rtol=3e-7)
    np.testing.assert_allclose(got["tanh"], np.tanh(x.astype(np.float64)), rtol=3e-7)
    np.testing.assert_allclose(got["erf"], [math.erf(v) for v in x.astype(float)], atol=3e-7)
    if shutil.which("objdump") is None:
        pytest.skip("no objdump to read the kernels' instructions")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", compiled.program._lib._name],
                         capture_output=True, text=True, check=True).stdout
    kernels = [f for f in asm.split("\n\n") if "<polyc_k" in f.split("\n", 1)[0]]
    assert kernels and not any(re.search(r"\bv?div[ps]s\b", f) for f in kernels)


def test_exp_of_a_shifted_row_skips_only_a_check_that_cannot_fire():
    # exp(x - max(x)) is printed without the overflow check: same results as exp
    x = _sweep()[:-1]  # no NaN (it would make the whole row NaN)
    x = x[np.isfinite(x) | (x < 0)].reshape(1, -1)  # -inf stays: its exp is 0
    b = GraphBuilder("shifted")
    xs = b.input("x", x.shape, "float32")
    graph = b.build([b.exp(b.sub(xs, b.reduce_max(xs, axes=[1], keepdims=True)), out="y")])
    compiled = compile(graph, options=Options(parallel=False))
    # on the stored difference, or on its expression where it is recomputed
    assert "polyc_expf_no_overflow(" in compiled.c_source
    got = compiled(x=x)["y"]
    want = np.exp(x.astype(np.float64) - x.astype(np.float64).max())
    tiny = want < 2.0 ** -125
    assert np.all((got[tiny] == 0) | (_ulps(got[tiny], want[tiny]) <= 2))
    assert _ulps(got[~tiny], want[~tiny]).max() <= 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_relu_maximum_and_minimum_let_nan_through(dtype):
    # as numpy and PyTorch: a NaN on either side wins (C's fmax and `a > 0 ? a : 0` drop it)
    nan, inf = np.nan, np.inf
    a = np.array([nan, 1.0, nan, -2.0, 0.5, -inf, inf, -0.5, 3.0], dtype=dtype)
    c = np.array([2.0, nan, nan, -3.0, 0.5, 1.0, -1.0, nan, -inf], dtype=dtype)
    b = GraphBuilder("nan")
    x, y = b.input("a", a.shape, dtype), b.input("c", c.shape, dtype)
    graph = b.build([b.op("relu", x, out="r"), b.op("maximum", x, y, out="hi"),
                     b.op("minimum", x, y, out="lo")])
    got = compile(graph, options=Options(parallel=False))(a=a, c=c)
    np.testing.assert_array_equal(got["r"], np.maximum(a, 0))
    np.testing.assert_array_equal(got["hi"], np.maximum(a, c))
    np.testing.assert_array_equal(got["lo"], np.minimum(a, c))
    assert np.isnan(got["r"][0]) and np.isnan(got["hi"][1]) and np.isnan(got["lo"][0])
