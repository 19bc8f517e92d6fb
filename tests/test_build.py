"""codegen/build.py: the prelude every unit begins with is precompiled once per toolchain;
the C polyc generates builds without a warning."""
from __future__ import annotations

import ctypes
import dataclasses
import json
import subprocess
from pathlib import Path

import cgen
import numpy as np
import pytest

from polyc import GraphBuilder, compile, load_graph
from polyc.codegen.ast_to_c import if_
from polyc.codegen.build import build_shared_object, compile_c
from polyc.errors import BuildError
from polyc.microkernels.registry import REGISTRY
from polyc.targets.cpu.machine import cpu_machine, cpu_toolchain

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
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


def test_unit_flags_reach_the_unit_and_its_prelude_not_the_prebuilt_parts():
    """The cpu's units are built with gcc's complete peeling limited (a heavy epilogue's
    copies cost gcc's time, not speed); the hand-written parts keep gcc's defaults (an
    8x8 transpose lost a third of its speed without its peeling)."""
    toolchain = _toolchain()
    assert "--param=max-completely-peel-times=1" in toolchain.unit_flags
    for flag in toolchain.unit_flags:
        assert flag in toolchain.command("unit.c", "unit.so")
        assert flag in toolchain.header_command("prelude.h", "prelude.h.gch")
        assert flag not in toolchain.part_command("part.c", "part.o")
    assert toolchain.key("int x;") != dataclasses.replace(toolchain, unit_flags=()).key("int x;")


def test_a_unit_without_the_prelude_is_built_from_its_own_text(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    toolchain = _toolchain()
    out = tmp_path / "unit.so"
    compile_c("int polyc_two(void) { return 2; }\n", toolchain, out)
    assert ctypes.CDLL(str(out)).polyc_two() == 2
    assert not list((tmp_path / "cache").rglob("*.gch"))


def test_work_done_while_gcc_runs_is_done_and_its_failure_stops_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    toolchain = _toolchain()
    done = []
    out = tmp_path / "unit.so"
    compile_c("int polyc_two(void) { return 2; }\n", toolchain, out,
              during=lambda: done.append(1))
    assert done == [1] and ctypes.CDLL(str(out)).polyc_two() == 2

    def fail():
        raise ValueError("a schedule check failed")
    out = tmp_path / "other.so"
    with pytest.raises(ValueError, match="schedule check"):
        compile_c("int polyc_three(void) { return 3; }\n", toolchain, out, during=fail)
    assert not out.exists()  # gcc was killed before it wrote the object


def test_gcc_errors_name_the_lines_of_the_unit(tmp_path, monkeypatch):
    """The unit gcc reads starts with an #include of the prelude, not the prelude: its
    messages still name the line of the source polyc generated (and a user downloads)."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    toolchain = _toolchain()
    source = toolchain.prelude + "\nint fine(void) { return 0; }\nint broken(void) { return nowhere; }\n"
    line = source.splitlines().index("int broken(void) { return nowhere; }") + 1
    with pytest.raises(BuildError, match=f"kernels.c:{line}:"):
        compile_c(source, toolchain, tmp_path / "unit.so")


CONTRACTIONS = {"matmul", "linear", "conv2d", "attention"}


def _examples_and_kernels() -> list[tuple[str, str]]:
    """Each example, with each gemm kernel the host runs where it has a contraction."""
    features = cpu_machine().features
    kernels = [m.name for m in REGISTRY if m.kind == "gemm" and m.target == "cpu"
               and set(m.features) <= features]
    out = []
    for path in sorted(EXAMPLES.glob("*.json")):
        ops = {n["op"] for n in json.loads(path.read_text())["nodes"]}
        out += [(path.stem, k) for k in (kernels if ops & CONTRACTIONS else [""])]
    return out



@pytest.fixture(scope="module")
def werror_cache(tmp_path_factory) -> Path:
    """One cache for the -Werror builds: the prebuilt parts and the prelude are compiled
    with -Werror once for all of them (each unit is still built, its flags its key)."""
    return tmp_path_factory.mktemp("werror-cache")


@pytest.mark.parametrize("name,kernel", _examples_and_kernels())
def test_the_examples_build_without_a_warning(tmp_path, monkeypatch, werror_cache, name, kernel):
    """gcc -Wall has nothing to say of the generated C: no declaration nothing reads (a
    contracted local a microkernel's write-back keeps in names of its own), no else a
    reader could give to another if. Each gemm kernel the host runs, as the calibration
    may pick any."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(werror_cache))
    compiled = compile(load_graph(EXAMPLES / f"{name}.json"), options={"gemm_kernel": kernel},
                       build=False)
    base = _toolchain()
    compile_c(compiled.c_source, _toolchain(flags=(*base.flags, "-Werror")), tmp_path / "unit.so")


@pytest.mark.parametrize("x,w,winograd,packed", [
    ((2, 100, 20, 20), (90, 100, 1, 1), True, "mk_paw"),
    ((5, 128, 28, 28), (32, 128, 3, 3), False, "mk_paw"),
    ((5, 128, 28, 28), (32, 128, 3, 3), True, "mk_const_S0_u")],
    ids=["1x1-packed-whole", "3x3-image-by-image", "3x3-winograd"])
def test_a_convolution_of_constant_weights_builds_without_a_warning(tmp_path, monkeypatch,
                                                                    werror_cache, x, w,
                                                                    winograd, packed):
    """Weights that are constants of the graph (an exported model's) are packed once,
    whole (`pack_const`), or transformed once (Winograd's): the tiles' blocks of them
    declare no extent nothing reads. Nor does the padded copy of an input read in place
    one image at a time (`BRows.slices`) name the batch index it does not need, nor
    Winograd's output rows an index nothing reads."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(werror_cache))
    rng = np.random.default_rng(0)
    b = GraphBuilder("conv_bias_relu")
    weights = b.constant("w", w, rng.uniform(-1, 1, w).astype(np.float32).ravel().tolist())
    y = b.conv2d(b.input("x", x), weights, b.input("b", (w[0],)), pads=[w[2] // 2] * 4)
    compiled = compile(b.build([b.relu(y)]), options={"winograd": winograd}, build=False)
    assert packed in compiled.c_source  # packed or transformed whole, once
    base = _toolchain()
    compile_c(compiled.c_source, _toolchain(flags=(*base.flags, "-Werror")), tmp_path / "unit.so")


@pytest.mark.parametrize("name", ["attention", "conv2d", "linear_gelu", "softmax"])
def test_the_examples_kernels_c_builds_alone_without_a_warning(tmp_path, name):
    """The kernels.c a user downloads, built by itself: the microkernels pasted, not
    linked, so some of their entry points go unused (`polyc compile` writes this file).
    The examples that paste something: gemm kernels and their support, row kernels."""
    compiled = compile(load_graph(EXAMPLES / f"{name}.json"), build=False)
    c_file = tmp_path / "kernels.c"
    c_file.write_text(compiled.c_source)
    toolchain = _toolchain()
    command = toolchain.command(c_file, tmp_path / "unit.so")
    proc = subprocess.run([command[0], "-Werror", *command[1:]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _kernel_addresses(so: Path) -> dict[str, int]:
    out = subprocess.run(["nm", str(so)], capture_output=True, text=True, check=True).stdout
    return {name: int(addr, 16) for addr, _, name in
            (line.split() for line in out.splitlines() if line.count(" ") == 2)
            if name.startswith("polyc_sgemm_")}


def test_prebuilt_kernels_sit_on_64_byte_lines_whatever_the_unit_before_them(tmp_path,
                                                                            monkeypatch):
    """A prebuilt gemm kernel is linked after the unit's own code: aligned to 16 bytes
    its loops moved with the unit's size, and the same kernel ran 12-18% slower after
    one unit than after another (cpu CFLAGS). Units 16, 32 and 48 bytes apart in size
    place it on a 64-byte boundary alike."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    compiled = compile(load_graph(EXAMPLES / "linear_gelu.json"), build=False)
    seen = []
    for pad in (0, 16, 32, 48):
        filler = f'\nvoid polyc_filler(void) {{ __asm__ volatile(".skip {pad}, 0x90"); }}\n'
        so = build_shared_object(compiled.c_source + filler, _toolchain())
        seen.append(_kernel_addresses(so))
    assert seen[0] and all(set(s) == set(seen[0]) for s in seen)
    assert all(addr % 64 == 0 for s in seen for addr in s.values()), seen


def test_an_else_after_a_nested_if_stays_with_its_own_if(tmp_path):
    """cgen prints branches bare: `if (a) if (b) x; else y;` would give y to `if (b)`."""
    nested = if_("a", if_("b", cgen.Statement("r = 1")), cgen.Statement("r = 2"))
    looped = if_("a", cgen.For("int i = 0", "i < 1", "i++", if_("b", cgen.Statement("r = 1"))),
                 cgen.Statement("r = 2"))
    source = "\n".join(f"int f{k}(int a, int b) {{ int r = 0; {code} return r; }}"
                       for k, code in enumerate((nested, looped)))
    compile_c(source, _toolchain(), tmp_path / "unit.so")
    lib = ctypes.CDLL(str(tmp_path / "unit.so"))
    for f in (lib.f0, lib.f1):
        assert (f(1, 0), f(0, 0), f(1, 1)) == (0, 2, 1)


def test_bound_calls_keep_their_buffers_alive_after_the_inputs_are_gone():
    # bind hands the kernels raw addresses: the contiguous copy it makes of a transposed
    # input, and the outputs, must live as long as the calls do
    import gc

    import numpy as np

    from polyc import GraphBuilder
    b = GraphBuilder("keep")
    graph = b.build([b.exp(b.add(b.input("x", [64, 48]), b.input("y", [64, 48])))])
    compiled = compile(graph, "cpu")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((48, 64), dtype=np.float32), rng.standard_normal((64, 48),
                                                                                 dtype=np.float32)
    want = np.exp(x.T + y)
    results, calls = compiled.program.bind({"x": x.T, "y": y.copy()})
    del x
    gc.collect()
    junk = [np.full((64, 48), 7.0, np.float32) for _ in range(8)]  # reuse freed memory
    for call in calls:
        call()
    (got,) = results.values()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert len(junk) == 8
