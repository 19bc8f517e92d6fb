"""Unit tests of the C printed for statement values (`polyc.codegen.cexpr`)."""
from __future__ import annotations

import pytest

from polyc.codegen.cexpr import _FLOAT_FNS, _INT_FNS, ExprPrinter, c_literal
from polyc.schedule_tree.comprehension import Call, Const


@pytest.mark.parametrize("dtype,fns", [("float32", _FLOAT_FNS), ("float64", _FLOAT_FNS),
                                       ("int32", _INT_FNS)])
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
    assert c_literal(-0.0, "float64") == "(-0.0)"
