"""codegen/build.py: the prelude every unit begins with is precompiled once per toolchain."""
from __future__ import annotations

import ctypes
import dataclasses

import pytest

from polyc.codegen.build import compile_c
from polyc.errors import BuildError
from polyc.targets.cpu.machine import cpu_machine, cpu_toolchain

UNIT_BODY = "\nlong polyc_floor_of(long n, long d) { return floord(n, d); }\n"


def _toolchain(**changes):
    return dataclasses.replace(cpu_toolchain(cpu_machine()), **changes)


def test_a_unit_is_built_against_the_precompiled_prelude(tmp_path, monkeypatch):
    """gcc must use the precompiled header, not only find it: it refuses one built with
    other settings, and -Werror=invalid-pch makes that refusal a failed build."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    base = _toolchain()
    toolchain = _toolchain(flags=(*base.flags, "-Winvalid-pch", "-Werror=invalid-pch"))
    out = tmp_path / "unit.so"
    compile_c(toolchain.prelude + UNIT_BODY, toolchain, out)
    parts = tmp_path / "cache" / "parts"
    assert len(list(parts.glob("*.h"))) == 1 and len(list(parts.glob("*.h.gch"))) == 1
    assert ctypes.CDLL(str(out)).polyc_floor_of(-7, 2) == -4


def test_a_unit_without_the_prelude_is_built_from_its_own_text(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    toolchain = _toolchain()
    out = tmp_path / "unit.so"
    compile_c("int polyc_two(void) { return 2; }\n", toolchain, out)
    assert ctypes.CDLL(str(out)).polyc_two() == 2
    assert not list((tmp_path / "cache").rglob("*.gch"))


def test_gcc_errors_name_the_lines_of_the_unit(tmp_path, monkeypatch):
    """The unit gcc reads starts with an #include of the prelude, not the prelude: its
    messages still name the line of the source polyc generated (and a user downloads)."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    toolchain = _toolchain()
    source = toolchain.prelude + "\nint fine(void) { return 0; }\nint broken(void) { return nowhere; }\n"
    line = source.splitlines().index("int broken(void) { return nowhere; }") + 1
    with pytest.raises(BuildError, match=f"kernels.c:{line}:"):
        compile_c(source, toolchain, tmp_path / "unit.so")
