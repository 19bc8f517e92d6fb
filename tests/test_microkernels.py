"""Microkernels: the registry, the matcher's marks, and compiled contractions and row
reductions against the numpy reference (every benchmark shape, odd shapes, every
epilogue kind, forced kernel variants and tile sizes, and random shapes by hypothesis).

Which gemm kernel a compile picks depends on the host (its ISA and measured speeds): a
test about one kernel pins it (`_isa`, `gemm_kernel`), and the differential tests run
on every ISA this host and the target's -march can execute, skipping (with the reason)
the others.
"""
from __future__ import annotations

import os
import re
import subprocess

from dataclasses import replace

import islpy as isl
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyc import GraphBuilder, GraphError
from polyc.errors import BuildError
from polyc.codegen.build import cc, compile_c
from polyc.codegen.runtime import Program
from polyc.compiler import Options, compile
from polyc.graph.reference import run_reference
from polyc.microkernels import registry
from polyc.microkernels.analysis import COLUMN_TILE, MAX_TILE_WASTE
from polyc.schedule_tree import marks
from polyc.targets.cpu.emit.gemm import _rectangular_pair
from polyc.targets.cpu import cpu_machine, host_can_run
from polyc.targets.cpu.machine import cpu_toolchain
from polyc.targets.cpu.plan import FOLD_COLUMNS, measured

ISAS = ["avx512", "avx2", "portable"]
PORTABLE = "sgemm_vec_6x16"  # builds and runs on every x86-64: for tests of structure


def _isa(isa: str) -> Options:
    """Options pinning gemm kernels to `isa`; skips when the target cannot run it."""
    target = cpu_machine()
    if registry.select("gemm", "float32", target, isa, rates={}) is None:
        pytest.skip(f"-march={target.arch} enables no {isa} gemm kernel")
    if not host_can_run(target.arch):
        pytest.skip(f"this host cannot run -march={target.arch} code")
    return Options(microkernel_isa=isa)


def _packing(options: Options = Options()) -> Options:
    """`options` pinning the kernel the calibration picks, so that a window stays off
    the window kernel (`plan.window_kernel`) and takes the path a test is about."""
    target = cpu_machine()
    mk = registry.select("gemm", "float32", target, options.microkernel_isa,
                         rates=measured(target))
    return replace(options, gemm_kernel=mk.name)


def _target_isas() -> list[str]:
    """The ISAs whose gemm kernels -march enables: what hypothesis draws from (an ISA
    skipped by `_isa` inside an example skips the whole test, every example with it)."""
    target = cpu_machine()
    return [isa for isa in ISAS
            if registry.select("gemm", "float32", target, isa, rates={}) is not None]


def _check(graph, inputs, options=Options(), rtol=1e-4, atol=1e-4, target="cpu"):
    # the direct convolution these tests are about, not Winograd's (test_winograd.py)
    compiled = compile(graph, target, options=replace(options, winograd=False))
    got = compiled(**inputs)
    want = run_reference(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)
    return compiled


def _gemm_marks(compiled) -> list[str]:
    return [line.split('"')[1] for k in compiled.kernels
            for line in k.to_json()["schedule_text"].splitlines() if 'mark: "gemm ' in line]


def _rand(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def _matmul(sa, sb, epilogue=None, **attrs):
    rng = np.random.default_rng(7)
    b = GraphBuilder("mm")
    a, w = b.input("a", sa), b.input("w", sb)
    inputs = {"a": _rand(rng, sa), "w": _rand(rng, sb)}
    y = b.matmul(a, w, **attrs)
    if epilogue is not None:
        ta, tb = (np.swapaxes(inputs[k], -1, -2) if attrs.get(f"transpose_{t}") else inputs[k]
                  for k, t in (("a", "a"), ("w", "b")))
        y = epilogue(b, y, inputs, rng, np.matmul(ta, tb).shape)
    return b.build(outputs=[y]), inputs


# --- the registry ----------------------------------------------------------------------

def test_registry_describes_every_kernel_file():
    for m in registry.REGISTRY:
        text = (registry.HERE / m.file).read_text()
        assert m.c_function in text and "Contract" in text, m.name
        assert m.to_json()["tile"] == [m.mr, m.nr]


def _features(*names):
    return replace(cpu_machine(), features=frozenset(names))


def test_selection_follows_the_target_features():
    rates = {"sgemm_avx512_14x32": 200.0, "sgemm_avx512_8x48": 200.0, "sgemm_avx2_6x16": 100.0,
             "sgemm_avx2_4x24": 100.0, "sgemm_vec_6x16": 90.0}
    pick = lambda target, isa="": registry.select("gemm", "float32", target, isa, rates=rates)
    assert pick(_features("avx2", "fma")).name == "sgemm_avx2_6x16"
    assert pick(_features("avx2", "fma"), "avx512") is None
    assert pick(_features()).name == "sgemm_vec_6x16"
    assert pick(_features("avx512f", "avx2", "fma")).name == "sgemm_avx512_14x32"


@pytest.mark.parametrize("rates,shape,chosen", [
    # Zen 4: 512-bit FMAs in two halves, the wider kernel is no faster: avx2 wins
    ({"sgemm_avx512_14x32": 100.1, "sgemm_avx512_8x48": 100.3, "sgemm_avx2_6x16": 108.2, "sgemm_avx2_4x24": 107.5,
      "sgemm_vec_6x16": 90.0}, (1024, 1024), "sgemm_avx2_6x16"),
    # two 512-bit FMA units: avx512 wins even with its edge waste on 127 rows (a last
    # row tile of 1 in 14, of 7 in 8)
    ({"sgemm_avx512_14x32": 235.0, "sgemm_avx512_8x48": 234.0, "sgemm_avx2_6x16": 130.0,
      "sgemm_avx2_4x24": 131.0, "sgemm_vec_6x16": 129.0}, (127, 255), "sgemm_avx512_8x48"),
    # channel counts (conv2d's rows) are multiples of 8 that 14 never divides
    ({"sgemm_avx512_14x32": 235.0, "sgemm_avx512_8x48": 234.0, "sgemm_avx2_6x16": 130.0,
      "sgemm_avx2_4x24": 131.0, "sgemm_vec_6x16": 129.0}, (64, 3248), "sgemm_avx512_8x48"),
    # within noise (3%): the one with edge variants, then the one wasting least
    ({"sgemm_avx512_14x32": 80.0, "sgemm_avx512_8x48": 80.0, "sgemm_avx2_6x16": 130.0,
      "sgemm_avx2_4x24": 131.0, "sgemm_vec_6x16": 132.0}, (64, 3136), "sgemm_avx2_4x24"),
    # not measured (a target this host cannot run): the widest ISA, wasting least
    ({}, (1024, 1024), "sgemm_avx512_8x48"),
    ({}, (1022, 1024), "sgemm_avx512_14x32"),
], ids=["zen4", "two-fma512", "channels", "tie", "unmeasured", "unmeasured-14"])
def test_the_default_kernel_is_the_fastest_measured(rates, shape, chosen):
    """Assumes a target with avx512f, avx2 and fma; the rates stand for the host's."""
    target = _features("avx512f", "avx2", "fma")
    mk, why = registry.choose("gemm", "float32", target, shape=shape, rates=rates)
    assert mk.name == chosen, why
    assert why.startswith("measured on this host: " + chosen) if rates else "by rank" in why


def test_calibration_measures_every_kernel_this_host_runs(tmp_path, monkeypatch, seeded_cache):
    from polyc.targets.cpu import calibrate
    # the run's prebuilt kernels (gcc builds them once a run), not its calibration
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path))
    (tmp_path / "calibration.json").unlink(missing_ok=True)
    target = cpu_machine()
    if not host_can_run(target.arch):
        pytest.skip(f"this host cannot run -march={target.arch} code")
    kernels = tuple(m for m in registry.REGISTRY
                    if m.kind == "gemm" and set(m.features) <= target.features)
    monkeypatch.setattr(calibrate, "_seen", {})
    rates = calibrate.rates(target, kernels)
    assert sorted(rates) == sorted(m.name for m in kernels)
    assert all(r > 0.5 for r in rates.values()), rates  # GFLOP/s: any core does more
    streaming = calibrate.rates(target, kernels, streaming=True)  # measured in the same run
    assert sorted(streaming) == sorted(rates) and all(r > 0.5 for r in streaming.values())
    assert (tmp_path / "calibration.json").exists()
    monkeypatch.setattr(calibrate, "measure", lambda *a: pytest.fail("measured twice"))
    monkeypatch.setattr(calibrate, "_seen", {})
    assert calibrate.rates(target, kernels) == rates  # from the file
    assert calibrate.rates(target, kernels, streaming=True) == streaming


def test_a_changed_kernel_is_measured_again(monkeypatch):
    """The rates are kept per kernel code: an edited kernel's old rate would choose."""
    from polyc.targets.cpu import calibrate
    target = cpu_machine()
    before = calibrate._key(target)
    calibrate._key.cache_clear()
    monkeypatch.setattr(calibrate, "c_source", lambda kernels: "/* an edited kernel */")
    try:
        assert calibrate._key(target) != before
    finally:
        calibrate._key.cache_clear()


def test_the_report_says_why_the_kernel_was_chosen():
    graph, _ = _matmul((130, 70), (70, 90))
    compiled = compile(graph, build=False)
    (line,) = [x for x in compiled.kernels[0].fusion_report if x.startswith("microkernel ")]
    assert f"on {compiled.kernels[0].microkernels[0]}: " in line
    assert "measured on this host" in line or "by rank" in line or "only" in line
    pinned = compile(graph, build=False, options=Options(gemm_kernel=PORTABLE))
    assert pinned.kernels[0].microkernels == [PORTABLE]
    assert any("asked for by options.gemm_kernel" in x for x in pinned.kernels[0].fusion_report)


def test_a_kernel_the_target_lacks_is_refused_naming_the_option():
    graph, _ = _matmul((130, 70), (70, 90))
    with pytest.raises(GraphError) as e:
        compile(graph, cpu_machine("x86-64"), build=False,
                options=Options(gemm_kernel="sgemm_avx2_6x16"))
    assert e.value.problems[0].field == "options.gemm_kernel" and "avx2" in str(e.value)


def _two_matmuls():
    rng = np.random.default_rng(3)
    b = GraphBuilder("two")
    x, w1, w2 = b.input("x", (130, 70)), b.input("w1", (70, 90)), b.input("w2", (90, 60))
    graph = b.build(outputs=[b.matmul(b.relu(b.matmul(x, w1)), w2)])
    inputs = {"x": _rand(rng, (130, 70)), "w1": _rand(rng, (70, 90)), "w2": _rand(rng, (90, 60))}
    return graph, inputs


def test_options_name_one_kernel_without_microkernels_or_on_its_own_gemm_kernel():
    graph, inputs = _two_matmuls()
    first, second = (k.name for k in compile(graph, build=False).kernels)
    compiled = _check(graph, inputs, Options(portable_kernels=(first,)))
    assert [k.microkernels for k in compiled.kernels][0] == []
    assert compiled.kernels[1].microkernels
    compiled = _check(graph, inputs, Options(kernel_gemm=((second, PORTABLE),)))
    assert compiled.kernels[1].microkernels == [PORTABLE]
    assert any("asked for by options.kernel_gemm" in x for x in compiled.kernels[1].fusion_report)
    assert not any("asked for" in x for x in compiled.kernels[0].fusion_report)
    for options, field in ((Options(portable_kernels=("polyc_k9",)), "portable_kernels.0"),
                           (Options(kernel_gemm=((first, PORTABLE), ("k", PORTABLE))),
                            "kernel_gemm.1")):
        with pytest.raises(GraphError) as e:
            compile(graph, build=False, options=options)
        assert e.value.problems[0].field == f"options.{field}"
        assert "no kernel is named" in str(e.value)
    with pytest.raises(GraphError, match="options.kernel_gemm"):
        Options(kernel_gemm=((first, "sgemm_nope"),))


def test_avx512_kernel_compiles():
    """This machine may lack AVX-512: the kernel must at least build for a target with it."""
    src = registry.c_source([registry.by_name("sgemm_avx512_14x32")])
    proc = subprocess.run([cc(), "-mavx512f", "-O2", "-fsyntax-only", "-Wall", "-Werror", "-x", "c", "-"],
                          input=src + "\nvoid (*keep)(long, const float *, const float *, float *,"
                          " long, int) = polyc_sgemm_avx512_14x32;\n",
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_kernels_are_linked_as_prebuilt_parts(isa, tmp_path, monkeypatch):
    """A gemm kernel is compiled once per toolchain and linked, with the support the code
    around it calls; the unit names both, and built alone (a user's download) it pastes
    them and computes the same."""
    graph, inputs = _matmul((37, 50), (50, 70))
    compiled = _check(graph, inputs, _isa(isa))
    toolchain = cpu_toolchain(compiled.machine)
    support, (name, _) = toolchain.linked(compiled.c_source)
    assert support[0] == registry.SUPPORT_PART
    assert f"/* polyc link: {name} */" in compiled.c_source
    assert name in _gemm_marks(compiled)[0]
    unit, alone = tmp_path / "unit.c", tmp_path / "alone.so"
    unit.write_text(compiled.c_source)
    subprocess.run(toolchain.command(unit, alone), check=True, capture_output=True)
    program = Program(compiled.primitive, tuple(k.kernel for k in compiled.kernels), alone)
    # pasted, the kernel may be inlined into its caller, which gcc then vectorises in its
    # own way: with -fassociative-math an edge tile's sums come out in another order
    np.testing.assert_allclose(program(inputs)[graph.outputs[0]],
                               compiled(**inputs)[graph.outputs[0]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,kernel", [("softmax", "row_max_f32"),
                                       ("reduce_sum", "row_sum_f32")])
def test_row_kernels_are_linked_as_prebuilt_parts(op, kernel, tmp_path):
    """row_max and row_sum are compiled once per toolchain too, without the support (they
    pack nothing); built alone, the unit pastes them and computes the same. row_maxsumexp
    calls the prelude's polyc_expf, so it is pasted into each unit."""
    b = GraphBuilder("rows")
    x = b.input("x", (64, 300))
    y = b.op(op, x, axis=-1) if op == "softmax" else b.op(op, x, axes=[-1])
    graph = b.build([y])
    inputs = {"x": _rand(np.random.default_rng(3), (64, 300))}
    compiled = _check(graph, inputs)
    toolchain = cpu_toolchain(compiled.machine)
    assert [name for name, _ in toolchain.linked(compiled.c_source)] == [kernel]
    unit, alone = tmp_path / "unit.c", tmp_path / "alone.so"
    unit.write_text(compiled.c_source)
    subprocess.run(toolchain.command(unit, alone), check=True, capture_output=True)
    program = Program(compiled.primitive, tuple(k.kernel for k in compiled.kernels), alone)
    # pasted, the kernel may be inlined and its sum reassociated with the caller's
    np.testing.assert_allclose(program(inputs)[graph.outputs[0]],
                               compiled(**inputs)[graph.outputs[0]], rtol=1e-5, atol=1e-5)
    assert not registry.prebuilt(registry.by_name("row_maxsumexp_f32"))


def test_a_cache_that_cannot_be_written_still_links_prebuilt_parts(tmp_path, monkeypatch):
    """The part's object goes to a private directory when the cache cannot take it (here
    the cache's path runs through a file: no user, root included, can create it)."""
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "cache"
    monkeypatch.setenv("POLYC_CACHE_DIR", str(cache))
    source = registry.unit_source([registry.by_name(PORTABLE)]) + (
        "\nvoid run(const float *a, const float *b, float *c) "
        "{ polyc_sgemm_vec_6x16(1, a, b, c, 16, 0); }\n")
    toolchain = cpu_toolchain(cpu_machine())
    out = tmp_path / "unit.so"
    compile_c(source, toolchain, out)
    assert out.exists() and not cache.exists()


def test_a_unit_linking_an_unknown_part_is_a_build_error():
    toolchain = cpu_toolchain(cpu_machine())
    with pytest.raises(BuildError, match="no prebuilt part"):
        toolchain.key("/* polyc link: sgemm_nowhere */\n")


# --- marks and generated C -------------------------------------------------------------

def test_matmul_shows_marks_and_kernel_call():
    graph, _ = _matmul((130, 70), (70, 90))
    trace: list[str] = []
    compiled = compile(graph, build=False, print_after_all=trace.append,
                       options=Options(gemm_kernel=PORTABLE,
                                       microkernel_tiles=(("kc", 32), ("mc", 60), ("nc", 48))))
    text = compiled.kernels[0].to_json()["schedule_text"]
    for mark in ("gemm S0 ", "pack_b S0", "pack_a S0", "microkernel sgemm_"):
        assert mark in text
    plan = marks.parse(_gemm_marks(compiled)[0])
    assert (plan.m, plan.n, plan.k) == (130, 90, 70)
    assert plan.loops[-5:] == ("jc", "pc", "ic", "jr", "ir")
    assert "polyc_sgemm_" in compiled.c_source and "polyc_scratch" in compiled.c_source
    assert any("IR after microkernels" in t and "microkernel sgemm_" in t for t in trace)


def test_options_turn_microkernels_off_and_set_threads():
    graph, inputs = _matmul((128, 128), (128, 128))
    off = _check(graph, inputs, Options(microkernels=False))
    assert not _gemm_marks(off) and "polyc_sgemm_" not in off.c_source
    four = compile(graph, build=False, options=Options(threads=3))
    assert "num_threads(3)" in four.c_source


# --- contractions against the reference ------------------------------------------------

@pytest.mark.parametrize("sa,sb,attrs", [
    ((127, 383), (383, 255), {}),
    ((512, 512), (512, 512), {}),
    ((1024, 1024), (1024, 1024), {}),
    ((16, 256, 64), (16, 64, 256), {}),
    ((2, 1, 37, 41), (3, 41, 29), {}),
    ((41, 37), (29, 41), {"transpose_a": True, "transpose_b": True}),
    ((5, 200, 30), (30, 70), {}),
], ids=["odd", "512", "1024", "batched", "broadcast-batch", "transposes", "batch-lhs"])
@pytest.mark.parametrize("isa", ISAS)
def test_matmul_shapes(sa, sb, attrs, isa):
    options = _isa(isa)
    graph, inputs = _matmul(sa, sb, **attrs)
    assert _gemm_marks(_check(graph, inputs, options, rtol=1e-4, atol=2e-4))


def _bias_gelu(b, y, inputs, rng, shape):
    n = shape[-1]
    inputs["bias"] = _rand(rng, (n,))
    return b.gelu(b.add(y, b.input("bias", (n,))), approximate="tanh")


def _residual_relu_scale(b, y, inputs, rng, shape):
    inputs["r"] = _rand(rng, shape)
    return b.mul(b.relu(b.add(y, b.input("r", shape))), b.constant("s", [1], [0.5]))


def _silu_erf_gelu(b, y, inputs, rng, shape):
    return b.add(b.silu(y), b.gelu(y, approximate="none"))


def _row_scale_gelu(b, y, inputs, rng, shape):
    inputs["s"] = _rand(rng, (*shape[:-1], 1))
    return b.gelu(b.mul(y, b.input("s", (*shape[:-1], 1))), approximate="tanh")


@pytest.mark.parametrize("epilogue", [_bias_gelu, _residual_relu_scale, _silu_erf_gelu,
                                      _row_scale_gelu],
                         ids=["bias-gelu", "residual-relu-scale", "silu-plus-erf-gelu",
                              "row-scale-gelu"])
@pytest.mark.parametrize("tiles", [(), (("kc", 24), ("mc", 28), ("nc", 32))],
                         ids=["model-tiles", "small-tiles"])
@pytest.mark.parametrize("isa", ISAS)
def test_epilogues_at_write_back(epilogue, tiles, isa):
    options = replace(_isa(isa), microkernel_tiles=tiles)
    graph, inputs = _matmul((70, 90), (90, 100), epilogue)
    compiled = _check(graph, inputs, options)
    assert len(compiled.kernels) == 1 and _gemm_marks(compiled)


def _bias_log(b, y, inputs, rng, shape):
    # heavy (log's polynomial) and printed on no lanes (`emit/lanes.py` has no log)
    n = shape[-1]
    inputs["bias"] = _rand(rng, (n,))
    z = b.add(y, b.input("bias", (n,)))
    return b.log(b.add(b.mul(z, z), b.constant("one", [1], [1.0])))


@pytest.mark.parametrize("epilogue", [_bias_gelu, _row_scale_gelu, _bias_log],
                         ids=["bias", "row-scale", "bias-log"])
@pytest.mark.parametrize("tiles", [(), (("kc", 24),)], ids=["one-k-block", "k-blocks"])
@pytest.mark.parametrize("isa", ISAS)
def test_a_heavy_epilogue_is_written_back_two_rows_at_a_time(epilogue, tiles, isa):
    """A tile whose epilogue calls an inlined polynomial (gelu's sigmoid) is written
    back two rows per vector loop, each row with its own indices and, past the first K
    block, its own partial sums; on AVX-512, on 16 lanes instead where it can be
    (`test_lanes.py`). Where the vector loads and stores can be masked (avx512) and
    every value the epilogue reads is a column's (a bias), edge tiles too: an odd row
    count's last row alone, the columns past the edge masked. Else (no masks; a value
    of the row, which gcc does not load masked in a vector loop) the edge tiles one row
    at a time, in scalars."""
    options = replace(_isa(isa), microkernel_tiles=tiles)
    graph, inputs = _matmul((2, 71, 90), (2, 90, 100), epilogue)
    compiled = _check(graph, inputs, options)
    assert ("pc" in _gemm_marks(compiled)[0]) == bool(tiles)
    lanes = isa == "avx512" and epilogue is not _bias_log
    assert ("polyc_v16 mk_e0 =" in compiled.c_source) == lanes
    if lanes:
        return
    assert "mk_r += 2" in compiled.c_source and "mk_e0_1" in compiled.c_source
    masked = isa == "avx512"
    assert ("mk_c < mk_nr_1" in compiled.c_source) == masked
    assert ("simdlen(1)" in compiled.c_source) == (not masked)


@pytest.mark.parametrize("isa,kernel", [("avx512", "sgemm_avx512_14x32"),
                                        ("avx512", "sgemm_avx512_8x48"),
                                        ("avx2", "sgemm_avx2_6x16"), ("avx2", "sgemm_avx2_4x24"),
                                        ("portable", PORTABLE)])
@pytest.mark.parametrize("sa,sb,epilogue,tiles,threads", [
    ((64, 96), (96, 40), None, (), 1),
    ((3, 100, 70), (3, 70, 40), _bias_gelu, (("kc", 32), ("mc", 24)), 1),
    ((8, 100, 70), (8, 70, 24), None, (("kc", 32),), 2),
    ((130, 300), (300, 40), _residual_relu_scale, (("kc", 64), ("mc", 48)), 2),
], ids=["one-block", "k-blocks-epilogue", "batch-team", "row-team-residual"])
def test_a_block_serving_few_column_tiles_is_read_in_place(isa, kernel, sa, sb, epilogue, tiles,
                                                           threads):
    """A narrow C (attention's probabilities times V: 64 columns) uses each block of A for
    a few column tiles, too few to pay for packing it: the tiles read A's rows where they
    are (`a=rows`), edge rows and columns, K blocks and epilogues alike."""
    options = replace(_isa(isa), gemm_kernel=kernel, microkernel_tiles=tiles, threads=threads)
    graph, inputs = _matmul(sa, sb, epilogue)
    compiled = _check(graph, inputs, options)
    plan = marks.parse(_gemm_marks(compiled)[0])
    assert plan.a == "rows", plan
    mk = registry.by_name(kernel)
    assert mk.a_rows_variant + "(" in compiled.c_source
    assert "polyc_pack_rows_t" not in compiled.c_source.split("polyc_k0_")[-1]


@pytest.mark.parametrize("sa,sb,attrs,options", [
    ((64, 96), (96, 512), {}, Options(gemm_kernel="sgemm_avx2_6x16")),
    ((96, 64), (96, 40), {"transpose_a": True}, Options(gemm_kernel="sgemm_avx2_6x16")),
], ids=["many-column-tiles", "a-transposed"])
def test_a_is_packed_where_reading_it_in_place_does_not_pay(sa, sb, attrs, options):
    """Packed: a block of A that serves many column tiles, and an A whose rows are not
    contiguous along K."""
    if not host_can_run(cpu_machine().arch) or not {"avx2", "fma"} <= cpu_machine().features:
        pytest.skip("the avx2 kernels need a host with avx2 and fma")
    graph, inputs = _matmul(sa, sb, **attrs)
    assert marks.parse(_gemm_marks(_check(graph, inputs, options))[0]).a == "packed"


def test_linear_gelu_benchmark_shape_small():
    rng = np.random.default_rng(3)
    b = GraphBuilder("lg")
    x, w, bias = b.input("x", (256, 512)), b.input("w", (512, 1024)), b.input("bias", (1024,))
    graph = b.build([b.gelu(b.linear(x, w, bias), approximate="tanh")])
    inputs = {"x": _rand(rng, (256, 512)), "w": _rand(rng, (512, 1024)),
              "bias": _rand(rng, (1024,))}
    compiled = _check(graph, inputs, atol=3e-4, options=Options(microkernel_tiles=(("kc", 128),)))
    assert _gemm_marks(compiled)
    # x @ w never exists whole: partial sums of the K blocks meet in the kernel's scratch,
    # and the local the graph names is not allocated
    (k,) = compiled.kernels
    xw = next(a.c_name for a in k.kernel.arrays if a.tensor == "linear_1.xw")
    assert "mk_acc = polyc_scratch(2" in compiled.c_source
    assert f"{xw} = malloc" not in compiled.c_source
    assert any(line.startswith("linear_1.xw (float32[256,1024]) is not materialised in memory: "
                               "the microkernel computes it tile by tile, with the partial sums")
               for line in k.fusion_report)


@pytest.mark.parametrize("xs,ws,attrs,bias", [
    ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, False),
    ((2, 5, 17, 13), (7, 5, 3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1]}, True),
    ((1, 3, 15, 16), (8, 3, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, True),
], ids=["benchmark", "strides-pads-batch", "dilations"])
def test_conv2d_implicit_gemm(xs, ws, attrs, bias):
    rng = np.random.default_rng(5)
    b = GraphBuilder("conv")
    args = [b.input("x", xs), b.input("w", ws)] + ([b.input("b", (ws[0],))] if bias else [])
    graph = b.build([b.relu(b.conv2d(*args, **attrs))])
    inputs = {"x": _rand(rng, xs), "w": _rand(rng, ws)}
    if bias:
        inputs["b"] = _rand(rng, (ws[0],))
    assert _gemm_marks(_check(graph, inputs, atol=3e-4))


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 2), c=st.integers(1, 6), h=st.integers(3, 20), w=st.integers(3, 40),
       co=st.integers(1, 9), kh=st.integers(1, 3), kw=st.integers(1, 3),
       sh=st.just(2), sw=st.integers(1, 3), pads=st.lists(st.integers(0, 2), min_size=4,
                                                          max_size=4),
       kc=st.sampled_from([0, 5, 8, 20]), nc=st.sampled_from([0, 16, 48]),
       parallel=st.booleans())
def test_conv2d_packed_by_runs(n, c, h, w, co, kh, kw, sh, sw, pads, kc, nc, parallel):
    """The run packer (emit.py's _run_nest): padding clipped per run, strided loads along
    the width, rows wrapping inside a panel, K blocks that end in a partial row group.
    A stride along the height with a window of one row leaves B to packing (read by
    rows, every other row of virtual columns would be computed and dropped); with a
    taller window the input is split into phases and read by rows."""
    xs, ws = (n, c, h, w), (co, c, kh, kw)
    rng = np.random.default_rng(h * 100 + w)
    b = GraphBuilder("conv")
    graph = b.build([b.conv2d(b.input("x", xs), b.input("w", ws), strides=[sh, sw], pads=pads)])
    inputs = {"x": _rand(rng, xs), "w": _rand(rng, ws)}
    tiles = tuple((name, v) for name, v in (("kc", kc), ("nc", nc)) if v)
    compiled = compile(graph, options=Options(microkernel_tiles=tiles, parallel=parallel))
    got = compiled(**inputs)
    want = run_reference(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=3e-4)


def test_conv2d_gather_is_packed_by_runs():
    """A stride along the height over a window one row tall: no phase to split, packed."""
    b = GraphBuilder("conv")
    graph = b.build([b.conv2d(b.input("x", (1, 16, 20, 20)), b.input("w", (24, 16, 1, 3)),
                              pads=[0, 1, 0, 1], strides=[2, 1])])
    rng = np.random.default_rng(1)
    inputs = {"x": _rand(rng, (1, 16, 20, 20)), "w": _rand(rng, (24, 16, 1, 3))}
    compiled = _check(graph, inputs, Options(microkernel_tiles=(("kc", 44),)), atol=3e-4)
    assert "mk_rows" in compiled.c_source and "mk_run" in compiled.c_source
    assert "b=packed" in _gemm_marks(compiled)[0]
    # a plain matmul keeps the per-panel copy: its B rows are contiguous already
    graph, inputs = _matmul((40, 30), (30, 50))
    assert "mk_rows" not in _check(graph, inputs).c_source


@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 2, 1, 0]])
def test_a_strided_padded_window_is_packed_by_runs(pads):
    """Small images of a 3x3 /2 window, folded into one C and packed (conv5's 14x14 to
    7x7): each run's pad is clipped by steps of two (a guard 2 w + kw - 1 >= 0), where the
    packer had fallen back to a guarded gather element by element."""
    b = GraphBuilder("conv")
    graph = b.build([b.conv2d(b.input("x", (4, 16, 14, 13)), b.input("w", (24, 16, 3, 3)),
                              pads=pads, strides=[2, 2])])
    rng = np.random.default_rng(2)
    inputs = {"x": _rand(rng, (4, 16, 14, 13)), "w": _rand(rng, (24, 16, 3, 3))}
    compiled = _check(graph, inputs, atol=3e-4)
    assert "b=folded" in _gemm_marks(compiled)[0]
    assert "mk_run" in compiled.c_source and "floord(" in compiled.c_source.split("polyc_k0")[-1]


@pytest.mark.parametrize("pads,strides", [([1, 1, 1, 1], 1), ([0, 2, 1, 0], 1), ([2, 0, 0, 2], 1),
                                          ([1, 1, 1, 1], 2), ([0, 1, 2, 0], 2)])
def test_a_whole_row_of_a_window_is_one_copy_and_its_pad(pads, strides):
    """Small images packed by runs: a run over a whole row of the window is one copy of
    the row (every other float of it with a stride of 2), shifted by the window's
    column, then its pad at the ends; the K row works the pad out once. The first and
    last rows of the input, whose shifted copy would read outside it, take the general
    path."""
    b = GraphBuilder("conv")
    xs, ws = (3, 16, 14, 14), (24, 16, 3, 3)
    graph = b.build([b.conv2d(b.input("x", xs), b.input("w", ws), pads=pads,
                              strides=[strides, strides])])
    rng = np.random.default_rng(4)
    inputs = {"x": _rand(rng, xs), "w": _rand(rng, ws)}
    compiled = _check(graph, inputs, _packing(), atol=3e-4)
    assert "b=packed" in _gemm_marks(compiled)[0] or "b=folded" in _gemm_marks(compiled)[0]
    src = compiled.c_source.split("polyc_k0")[-1]
    assert "mk_wlo" in src
    assert ("mk_f0 + 2 * mk_t" if strides == 2 else "mk_f0 + 13 < 9408") in src


def test_a_strided_window_of_more_tiles_in_place_is_packed():
    """28x28 /2: a copy in phases would take 14 column tiles for the 13 of 196 columns
    (`analysis.MAX_TILE_WASTE`): packed, by runs, each whole row one strided copy."""
    graph, inputs = _conv((1, 8, 28, 28), (16, 8, 3, 3), bias_relu=True, pads=[1] * 4,
                          strides=[2, 2])
    compiled = _check(graph, inputs, _packing(), atol=3e-4)
    assert "b=packed" in _gemm_marks(compiled)[0]
    assert "mk_f0 + 2 * mk_t" in compiled.c_source.split("polyc_k0")[-1]


def _conv(xs, ws, bias_relu=False, seed=5, **attrs):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("conv")
    args = [b.input("x", xs), b.input("w", ws)] + ([b.input("b", (ws[0],))] if bias_relu else [])
    y = b.conv2d(*args, **attrs)
    graph = b.build([b.relu(y) if bias_relu else y])
    inputs = {"x": _rand(rng, xs), "w": _rand(rng, ws)}
    if bias_relu:
        inputs["b"] = _rand(rng, (ws[0],))
    return graph, inputs


def test_conv2d_reads_b_by_rows_from_a_padded_copy(monkeypatch):
    """The benchmark's conv2d: no im2col; its window rows are read from a zero-padded
    copy of x (57 wide: a row's right pad is the next row's left), the output tiled over
    56 x 57 virtual columns."""
    options = _isa("avx2")
    # as if both avx2 kernels measured alike (a loaded host's calibration may differ by
    # more than the tie): the tile shape decides
    from polyc.targets.cpu import calibrate
    monkeypatch.setattr(calibrate, "rates", lambda target, kernels, streaming=False: {
        m.name: 100.0 for m in kernels})
    graph, inputs = _conv((1, 64, 56, 56), (64, 64, 3, 3), pads=[1, 1, 1, 1])
    compiled = _check(graph, inputs, options, atol=3e-4)
    mark = _gemm_marks(compiled)[0]
    assert "b=rows" in mark and "sgemm_avx2_4x24" in mark and "jc" not in mark
    tree = compiled.kernels[0].to_json()["schedule_text"]
    assert 'mark: "b_rows S0"' in tree and "pack_b" not in tree and "pack_a" in tree
    assert "57i2 + i3" in tree  # the column tiles cut virtual columns
    src = compiled.c_source
    assert "polyc_sgemm_avx2_4x24_b_rows(" in src and "padded to [1,64,58,57]" in src
    assert "3191 virtual columns for 3136" in src and "mk_run" in src and "mk_rows" not in src


@pytest.mark.parametrize("xs,ws,attrs,copy", [
    ((2, 4, 12, 30), (8, 4, 3, 3), {}, False),
    ((1, 4, 32, 40), (16, 4, 1, 3), {}, False),
    ((2, 3, 15, 40), (12, 3, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, True),
    ((1, 6, 20, 40), (12, 6, 3, 3), {"pads": [2, 1, 0, 2]}, True),
], ids=["valid", "1x3", "dilated", "odd-pads"])
@pytest.mark.parametrize("isa", ISAS)
def test_conv2d_b_rows_with_and_without_a_copy(xs, ws, attrs, copy, isa):
    """No padding: the rows are read from x itself; padding: from a padded copy."""
    options = _isa(isa)
    graph, inputs = _conv(xs, ws, bias_relu=True, **attrs)
    compiled = _check(graph, inputs, options, atol=3e-4)
    assert "b=rows" in _gemm_marks(compiled)[0]
    assert ("polyc_scratch(4," in compiled.c_source) == copy


WINDOWS = ("sgemm_avx512_32x14", "sgemm_avx512_32x14_bcast")


@pytest.mark.parametrize("xs,ws,attrs,threads,tiles,taps", [
    ((2, 128, 14, 14), (64, 128, 3, 3), {"pads": [1] * 4}, 1, "jy", 9),  # a tile a row
    ((1, 128, 28, 28), (32, 128, 3, 3), {"pads": [1] * 4}, 1, "jy,jr", 9),  # two a row
    ((2, 128, 7, 7), (64, 128, 3, 3), {"pads": [1] * 4}, 1, "jy", 9),  # two rows a tile
    ((1, 128, 20, 20), (64, 128, 3, 3), {"pads": [1] * 4}, 1, "jr", 9),  # across rows
    ((2, 128, 28, 28), (40, 128, 3, 3), {"pads": [1] * 4, "strides": [2, 2]}, 1, "jy", 9),
    ((1, 128, 16, 30), (32, 128, 3, 3), {}, 1, "jy,jr", 9),  # no pad: rows of x itself
    ((1, 128, 9, 9), (32, 128, 3, 3), {}, 1, "jy", 9),  # no pad, two rows a tile
    ((3, 128, 14, 14), (64, 128, 3, 3), {"pads": [1] * 4}, 2, "jy", 9),  # par=batch
    ((1, 128, 28, 28), (64, 128, 3, 3), {"pads": [1] * 4}, 2, "jy,jr", 9),
], ids=["14x14", "28x28", "7x7", "20x20", "strided-40", "valid", "valid-7x7",
        "team-batch", "team"])
@pytest.mark.parametrize("window", WINDOWS)
def test_the_window_kernel_reads_a_window_in_place(xs, ws, attrs, threads, tiles, taps, window):
    """On avx512, a conv2d's window is the window kernel's (its weights the vectors, its
    pixels broadcast from the padded copy): where an output row is whole tiles of 14,
    the tiles start at each row (`jy`) and their write-back is straight, and so do
    tiles of two rows of 7 (a 3x3 window, its taps a plane apart: `taps=9`), a last row
    alone on 7 columns; one image of 20x20 in tiles across its rows; a partial row tile
    (40 channels) and K rows read from x itself too; against the reference; each of
    the two window kernels (their pixels broadcast two ways)."""
    options = replace(_isa("avx512"), threads=threads, gemm_kernel=window)
    graph, inputs = _conv(xs, ws, bias_relu=True, **attrs)
    compiled = _check(graph, inputs, options, atol=3e-4)
    mark = marks.parse(_gemm_marks(compiled)[0])
    assert (mark.kernel, mark.b, mark.taps) == (window, "rows", taps)
    assert ",".join(loop for loop in mark.loops if loop[0] == "j") == tiles
    assert mark.row_tile == (0 if tiles == "jr" else 2 if xs[2] < 14 else 1)
    assert f"polyc_{window}_b_rows(" in compiled.c_source


@pytest.mark.parametrize("size,par", [(7, "rows"), (14, "batch")])
def test_a_team_shares_the_window_kernel_s_weights_by_row_blocks(size, par):
    """Weights over L2 and images of 49 columns: each thread of a team takes whole row
    blocks, the batch loop inside them, so that each block of weights serves every
    image (`plan.shares_weights`); images of 196 columns are the threads' own."""
    l2 = cpu_machine().fusion_level.capacity
    o = 32 * (l2 // (4 * 128 * 9 * 32) + 1)  # 4 * o * K bytes of weights: over L2
    options = replace(_isa("avx512"), threads=2)
    graph, inputs = _conv((2, 128, size, size), (o, 128, 3, 3), bias_relu=True, pads=[1] * 4)
    mark = marks.parse(_gemm_marks(_check(graph, inputs, options, atol=3e-4))[0])
    assert mark.kernel in WINDOWS and mark.par == par, mark
    assert mark.loops[:2] == (("ic", "b0") if par == "rows" else ("b0", "ic")), mark



@pytest.mark.parametrize("channels,par", [(128, "rows"), (64, "inner")])
def test_one_image_of_the_window_kernel_is_shared_by_row_blocks(channels, par):
    """One image read in place by the window kernel, 2 threads: with two blocks of 32
    output channels or more a thread, each thread takes whole row blocks; with one, the
    team shares each block's tiles."""
    options = replace(_isa("avx512"), threads=2)
    graph, inputs = _conv((1, 64, 28, 28), (channels, 64, 3, 3), bias_relu=True,
                          pads=[1] * 4)
    mark = marks.parse(_gemm_marks(_check(graph, inputs, options, atol=3e-4))[0])
    assert mark.kernel in WINDOWS and mark.b == "rows" and mark.par == par, mark

def test_k_blocks_of_the_window_kernel_add_up_in_its_virtual_columns():
    """Tiles of a few K rows each (kc 40): partial sums in the virtual columns, the init
    and the epilogue at the last block."""
    options = replace(_isa("avx512"), microkernel_tiles=(("kc", 40),))
    graph, inputs = _conv((2, 128, 14, 14), (32, 128, 3, 3), bias_relu=True, pads=[1] * 4)
    compiled = _check(graph, inputs, options, atol=1e-3)
    mark = marks.parse(_gemm_marks(compiled)[0])
    assert mark.kernel in WINDOWS and "pc" in mark.loops and not mark.taps


@pytest.mark.parametrize("fold,bcast", [(231.1, 252.2), (120.0, 104.0), (None, None)],
                         ids=["zen5", "folded-faster", "unmeasured"])
def test_of_the_window_kernels_the_one_measured_faster_is_taken(monkeypatch, fold, bcast):
    """The two window kernels differ in how a pixel is broadcast, which cores rank
    differently: the calibration's deep (streaming) rates pick; a host that measured
    nothing keeps the registry's order; the reason names both rates. Without avx512vl
    (their stores of C's rows) neither."""
    from polyc.graph.decompose import decompose_graph
    from polyc.kernel import build_kernels
    from polyc.targets.cpu import calibrate
    from polyc.targets.cpu.plan import window_kernel
    rates = {} if fold is None else {WINDOWS[0]: fold, WINDOWS[1]: bcast}
    monkeypatch.setattr(calibrate, "rates", lambda target, kernels, streaming=False:
                        dict(rates) if streaming else {})
    graph, _ = _conv((2, 128, 14, 14), (64, 128, 3, 3), pads=[1] * 4)
    (kernel,) = build_kernels(decompose_graph(graph), ((graph.nodes[0].name,),))
    want = WINDOWS[1] if fold and bcast > fold else WINDOWS[0]
    assert window_kernel(kernel, _features("avx512f", "avx512vl"), Options()).name == want
    asked = window_kernel(kernel, _features("avx512f", "avx512vl"),
                          Options(gemm_kernel=WINDOWS[1]))
    assert asked.name == WINDOWS[1]
    assert window_kernel(kernel, _features("avx512f"), Options()) is None  # Xeon Phi: no VL
    if fold:
        options = _isa("avx512")
        why = [line for k in compile(graph, options=options).kernels
               for line in k.fusion_report if "direct convolution" in line]
        assert f"{want} measured on this host at {max(fold, bcast):.1f} GFLOP/s" in why[0]


@pytest.mark.parametrize("xs,narrow", [((1, 512, 7, 7), True), ((2, 512, 14, 14), True),
                                       ((8, 512, 7, 7), True), ((1, 512, 28, 28), False)],
                         ids=["7x7", "14x14", "7x7-folded", "28x28"])
def test_one_narrow_image_weighs_the_window_kernels_packed(monkeypatch, xs, narrow):
    """A 1x1 conv2d 512 deep of 7x7 or 14x14 images (49 or 196 columns, B packed; eight
    7x7 images folded, 392): the window kernels' packed entry is among the candidates,
    by the rates measured deep (Zen 5's: 56 columns computed for 49 at 252 GFLOP/s
    against 64 at 263, 196 against 208); a 28x28 image's 784 columns keep to the
    others; against the reference."""
    from polyc.targets.cpu import calibrate
    deep = {"sgemm_avx512_14x32": 243.0, "sgemm_avx512_8x48": 262.7, WINDOWS[0]: 231.1,
            WINDOWS[1]: 252.2}
    cached = {"sgemm_avx512_14x32": 239.7, "sgemm_avx512_8x48": 260.6, WINDOWS[0]: 192.7,
              WINDOWS[1]: 208.0}
    monkeypatch.setattr(calibrate, "rates", lambda target, kernels, streaming=False:
                        dict(deep if streaming else cached))
    graph, inputs = _conv(xs, (64, 512, 1, 1), bias_relu=True)
    compiled = _check(graph, inputs, _isa("avx512"), atol=3e-4)
    mark = marks.parse(_gemm_marks(compiled)[0])
    folded = xs[0] > 1 and xs[2] * xs[3] < FOLD_COLUMNS
    assert (mark.kernel, mark.b) == (WINDOWS[1] if narrow else "sgemm_avx512_8x48",
                                     "folded" if folded else "packed")
    why = [line for k in compiled.kernels for line in k.fusion_report if "microkernel" in line]
    assert ("in deep K blocks" in why[0]) == narrow, why


def test_the_window_kernels_packed_entry_keeps_the_images_outside_constant_weights():
    """Constant weights in blocks of rows and the window kernels' packed entry (1x1, 195
    columns an image): B is packed per image, so the loop over images stays outside the
    weights' blocks (inside, each image's B would be packed again for each block)."""
    from polyc.targets.cpu import calibrate
    deep = {"sgemm_avx512_14x32": 243.0, "sgemm_avx512_8x48": 262.7, WINDOWS[0]: 231.1,
            WINDOWS[1]: 252.2}
    options = replace(_isa("avx512"), microkernel_tiles=(("mc", 32),))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(calibrate, "rates", lambda target, kernels, streaming=False: dict(deep))
        graph = _const_conv(3, (64, 512, 1, 1), data_seed=2)
        rng = np.random.default_rng(3)
        inputs = {"x": _rand(rng, (3, 512, 13, 15)), "b": _rand(rng, (64,))}
        mark = marks.parse(_gemm_marks(_check(graph, inputs, options, atol=3e-4))[0])
    assert mark.kernel == WINDOWS[1] and mark.a == "const" and mark.b == "packed", mark
    assert mark.loops[0] == "b0" and "ic" in mark.loops, mark

@pytest.mark.parametrize("xs,ws,attrs,kernel,b", [
    ((8, 24, 9, 9), (64, 24, 5, 5), {"pads": [1] * 4}, "", "folded"),
    ((2, 32, 14, 14), (64, 32, 3, 3), {"pads": [1] * 4}, "", "packed"),
    ((1, 128, 14, 14), (64, 128, 1, 1), {}, "", "packed"),
    ((1, 128, 14, 14), (64, 128, 3, 3), {"pads": [1] * 4}, "sgemm_avx512_14x32", "packed"),
], ids=["7x7-images", "shallow", "1x1", "asked"])
def test_the_window_kernel_leaves_what_it_does_not_win(xs, ws, attrs, kernel, b):
    """Images of 7x7 outputs of a 5x5 window are folded for the other kernels (a tile
    of theirs would span two rows and the pads between); a window under WINDOW_MIN_K
    deep is left to them; a 1x1 conv2d has no window; a kernel the options name is
    taken."""
    options = replace(_isa("avx512"), gemm_kernel=kernel)
    graph, inputs = _conv(xs, ws, bias_relu=True, **attrs)
    mark = marks.parse(_gemm_marks(_check(graph, inputs, options, atol=3e-4))[0])
    assert mark.kernel not in WINDOWS and mark.b == b


@pytest.mark.parametrize("isa", ISAS)
def test_a_full_tile_across_images_is_written_back_in_pieces(isa):
    """Eight 7x7 images folded into 392 columns: most tiles (16, 24 or 48 wide) cross
    from one image into the next; each piece inside one image is one vector loop, its
    image decomposed once, not a division per column; against the reference."""
    graph, inputs = _conv((8, 64, 7, 7), (40, 64, 1, 1), bias_relu=True)
    compiled = _check(graph, inputs, _packing(_isa(isa)), atol=3e-4)
    mark = marks.parse(_gemm_marks(compiled)[0])
    assert mark.b == "folded" and mark.n == 392, mark
    assert "mk_cs = mk_ce" in compiled.c_source


@pytest.mark.parametrize("case", ["conv-rows", "linear-packed"])
def test_a_tile_written_back_from_the_stack_prefetches_its_output_lines(case):
    """A tile with an epilogue is computed into `mk_tile` and stored by the write-back
    after the kernel call: every 64-byte line of each of its output rows is fetched
    before that call (the first column, one in each 16 floats, the last), not missed
    at the stores."""
    options = _isa("portable")
    if case == "conv-rows":
        graph, inputs = _conv((1, 8, 12, 40), (12, 8, 3, 3), bias_relu=True, pads=[1] * 4)
    else:
        graph, inputs = _matmul((30, 20), (20, 40), lambda b, y, inputs, rng, shape: b.gelu(
            b.add(y, b.input("bias", (40,))), approximate="tanh"))
        inputs["bias"] = _rand(np.random.default_rng(3), (40,))
    compiled = _check(graph, inputs, options, atol=3e-4)
    mk = registry.by_name(_gemm_marks(compiled)[0].split()[2].split(",")[0])
    kernel = compiled.c_source.split("void polyc_k0")[-1]
    out = re.search(r"/\* (\w+): out ", kernel).group(1)
    call = kernel.index(", mk_tile, ")
    fetches = re.findall(rf"const long mk_c = ([^;]+);[^{{}}]*__builtin_prefetch\(&{out}\[",
                         kernel[:call])
    assert fetches == ["0", *(f"min({c}, mk_nr - 1)" for c in range(16, mk.nr, 16)),
                       f"min({mk.nr - 1}, mk_nr - 1)"], fetches


@pytest.mark.parametrize("xs,ws,pads,tiles,b,threads,par", [
    ((3, 16, 10, 30), (40, 16, 3, 3), [1] * 4, (("kc", 48), ("mc", 16)), "rows", 1, "none"),
    ((3, 16, 10, 30), (40, 16, 3, 3), [1] * 4, (("kc", 48), ("mc", 16)), "rows", 2, "inner"),
    ((3, 72, 9, 9), (256, 72, 1, 1), [0] * 4, (("kc", 24), ("mc", 128)), "packed", 2, "inner"),
], ids=["3x3-b-rows-1", "3x3-b-rows-2", "1x1-packed-b-2"])
def test_batched_conv2d_packs_the_weights_once_for_all_images(xs, ws, pads, tiles, b,
                                                              threads, par):
    """The weights (A) have no batch dim: the batch loop runs inside the A block, so each
    block is packed once and serves the 3 images (par=inner: the team packs it, then
    shares each image's tiles); a packed B (a 1x1 conv over planes too large to fold,
    `plan.FOLD_COLUMNS`) is packed per image below it."""
    graph, inputs = _conv(xs, ws, bias_relu=True, pads=pads)
    compiled = _check(graph, inputs, Options(threads=threads, microkernel_tiles=tiles),
                      atol=3e-4)
    plan = marks.parse(_gemm_marks(compiled)[0])
    assert plan.b == b and plan.par == par and plan.batch_inside
    assert plan.loops[:3] == ("pc", "ic", "b0")
    tree = compiled.kernels[0].to_json()["schedule_text"]
    assert (tree.index("pack_a") < tree.index("pack_b")) if b == "packed" else "pack_b" not in tree


@pytest.mark.parametrize("xs,ws,attrs,tiles,threads,folded", [
    # conv5's 7x7 images: 8 x 49 columns in one matrix
    ((8, 64, 7, 7), (40, 64, 1, 1), {}, (), 1, True),
    # a strided 1x1, K blocks (partial sums of C in scratch), edge tiles both ways, and
    # C a graph output with no epilogue
    ((3, 40, 9, 9), (30, 40, 1, 1), {"strides": [2, 2]}, (("kc", 16), ("mc", 12)), 1, True),
    ((3, 40, 9, 9), (30, 40, 1, 1), {"strides": [2, 2]}, (("kc", 16), ("mc", 12)), 2, True),
    # images of 64 columns or more keep the batch loop, for a team or one thread
    ((3, 72, 9, 9), (256, 72, 1, 1), {}, (), 2, False),
    ((3, 72, 9, 9), (256, 72, 1, 1), {}, (), 1, False),
], ids=["7x7", "strided-kblocks-1", "strided-kblocks-2", "team-keeps-images", "9x9"])
@pytest.mark.parametrize("bias_relu", [True, False])
def test_a_packed_b_folds_the_images_into_the_columns(xs, ws, attrs, tiles, threads, folded,
                                                      bias_relu):
    """A 1x1 conv2d over small planes packs B: its images become columns of one C
    (`gemm_view(fold=True)`), so the weights are packed once and no batch loop remains;
    the write-back scatters each column to its image."""
    graph, inputs = _conv(xs, ws, bias_relu=bias_relu, **attrs)
    compiled = _check(graph, inputs, Options(threads=threads, microkernel_tiles=tiles),
                      atol=3e-4)
    plan = marks.parse(_gemm_marks(compiled)[0])
    assert (plan.b == "folded") == folded
    out = graph.types[graph.outputs[0]].shape
    columns = out[2] * out[3] * (out[0] if folded else 1)
    batch_loop = any(loop.startswith("b") for loop in plan.loops)
    assert plan.n == columns and batch_loop != folded
    if folded:
        assert any("folded into its" in line for line in compiled.kernels[0].fusion_report)
    if folded and not attrs:  # an image's plane, contiguous: one run, not a run a row
        assert f"- mk_x, {out[2] * out[3]} - " in compiled.c_source


@pytest.mark.parametrize("other,flat", [
    ((3, 16, 7, 7), True),  # a residual: its planes are runs as C's
    ((16, 1, 1), True),  # a bias per channel: the columns do not move it
    ((1, 1, 7), False),  # a row broadcast down each plane: not one run
    ((7, 1), False),  # a column broadcast along each row
])
def test_the_write_back_of_a_folded_tile_indexes_its_planes_flat(other, flat):
    """The write-back of a full tile inside one image addresses its columns as the
    plane's flat index plus the tile's column (no division per element, which gcc
    cannot vectorise), where every tensor it touches lays the plane out as C does; a
    broadcast along one of the plane's dims keeps the per-element row and column."""
    rng = np.random.default_rng(8)
    b = GraphBuilder("conv_residual")
    y = b.conv2d(b.input("x", (3, 24, 7, 7)), b.input("w", (16, 24, 1, 1)))
    graph = b.build([b.relu(b.add(y, b.input("r", other)))])
    inputs = {"x": _rand(rng, (3, 24, 7, 7)), "w": _rand(rng, (16, 24, 1, 1)),
              "r": _rand(rng, other)}
    compiled = _check(graph, inputs, Options(threads=1, gemm_kernel=PORTABLE), atol=3e-4)
    assert "b=folded" in _gemm_marks(compiled)[0]
    # 49 columns an image: tiles of 16 inside one image take the flat path, the others
    # (and every tile where it does not apply) divide
    assert ("mk_jt % 49 + mk_c" in compiled.c_source) == flat
    assert "(mk_jt + mk_c) % 7" in compiled.c_source


def test_a_shared_a_folds_a_batched_b():
    """C[b] = A @ B[b] with A shared: the batch is folded into the columns too."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("shared_a")
    y = b.matmul(b.input("a", (37, 50)), b.input("w", (5, 50, 29)))
    graph = b.build([b.tanh(y)])
    inputs = {"a": _rand(rng, (37, 50)), "w": _rand(rng, (5, 50, 29))}
    compiled = _check(graph, inputs, Options(threads=1, microkernel_tiles=(("kc", 16),)))
    plan = marks.parse(_gemm_marks(compiled)[0])
    assert plan.b == "folded" and (plan.m, plan.n, plan.k) == (37, 5 * 29, 50)


@pytest.mark.parametrize("xs,ws,attrs,layout,passes", [
    ((1, 8, 12, 12), (16, 8, 3, 3), {"strides": [2, 2], "pads": [1] * 4}, "1,8,2,2,7,7",
     8 * 2 * 7),
    ((2, 5, 15, 65), (12, 5, 3, 3), {"strides": [2, 2], "pads": [1, 0, 2, 1]}, "2,5,2,2,9,33",
     2 * 5 * 2 * 9),
    ((1, 4, 20, 21), (8, 4, 3, 2), {"strides": [3, 2]}, "1,4,3,2,6,10", 4 * 3 * 6),
    ((1, 4, 20, 21), (8, 4, 5, 3), {"strides": [2, 1], "pads": [1] * 4, "dilations": [2, 1]},
     "1,4,2,11,22", 4 * 2 * 11),
], ids=["resnet", "batch-odd-pads", "3x2-strides", "dilated-height-only"])
@pytest.mark.parametrize("isa", ISAS)
def test_strided_conv2d_reads_b_by_rows_from_phases(xs, ws, attrs, layout, passes, isa):
    """A strided window: the copy splits each strided dim into its phases (analysis.b_rows),
    so every K row is a unit-stride run of one phase; no packing of B. The copy makes one
    pass per row of P, or where the last dim is split, one per row of the tensor (filling
    that row's phases); its edges (pads, a phase past the tensor's end) are zero."""
    graph, inputs = _conv(xs, ws, bias_relu=True, **attrs)
    compiled = _check(graph, inputs, _isa(isa), atol=3e-4)
    assert "b=rows" in _gemm_marks(compiled)[0]
    assert f"padded to [{layout}]" in compiled.c_source
    assert f"for (long mk_u = 0; mk_u < {passes}; mk_u++)" in compiled.c_source
    assert "pack_b" not in compiled.kernels[0].to_json()["schedule_text"]


@pytest.mark.parametrize("xs,threads,sliced,loops", [
    ((3, 16, 17, 17), 1, False, ("loops=pc,", ",b0,")),  # one copy of every image
    ((3, 16, 17, 17), 1, True, ("loops=b0,pc,",)),  # each image's copy in turn
    ((4, 32, 33, 33), 2, False, ("par=batch",)),  # each thread's images
], ids=["images-inside", "images-outside", "team"])
@pytest.mark.parametrize("isa", ISAS)
def test_k_blocks_of_a_b_read_in_place_add_up_in_its_virtual_columns(xs, threads, sliced,
                                                                     loops, isa, monkeypatch):
    """A strided conv2d's partial sums (a local result, K in blocks) keep B's virtual
    columns and whole row tiles: each K block but the last accumulates in them through
    the kernel call; the last adds the bias and the sums to its tile and writes back the
    output's columns only. 14 output channels (a short row tile)."""
    from polyc.microkernels import analysis
    if sliced:
        monkeypatch.setattr(analysis, "SLICED_COPY", 1024)
    graph, inputs = _conv(xs, (14, xs[1], 3, 3), bias_relu=True, strides=[2, 2],
                          pads=[1] * 4)
    options = replace(_isa(isa), threads=threads, microkernel_tiles=(("kc", 40), ("mc", 8)))
    compiled = _check(graph, inputs, options, atol=3e-4)
    (mark,) = _gemm_marks(compiled)
    assert "b=rows" in mark and all(part in mark for part in loops), mark
    mk = registry.by_name(marks.parse(mark).kernel)
    side = (xs[2] + 1) // 2  # outputs a side; phase rows as wide, sharing their pad
    n = -(-(side * side + side - 1) // mk.nr) * mk.nr
    assert f"mk_acc + mk_vboff + mk_it * {n} + mk_jt, {n}, " in compiled.c_source
    rows = -(-14 // mk.mr) * mk.mr
    assert f"polyc_scratch(2, {4 * xs[0] * rows * n})" in compiled.c_source


@pytest.mark.parametrize("xs,ws,pads,layout", [
    ((1, 24, 32, 32), (12, 24, 3, 1), [0] * 4, "1,24,32,33"),  # 4 KiB planes, no guard
    ((1, 16, 30, 31), (8, 16, 3, 3), [1] * 4, "1,16,32,33"),  # padded to 32x32 (shared pad)
], ids=["3x1-32x32", "3x3-30x31-pad1"])
def test_rows_a_multiple_of_1_kib_apart_are_copied_wider(xs, ws, pads, layout):
    """K rows 4 KiB apart would share a few L1 sets (`analysis._crowded`): B's copy gets
    rows one float longer, the extra column virtual and dropped."""
    graph, inputs = _conv(xs, ws, bias_relu=True, pads=pads)
    compiled = _check(graph, inputs, Options(threads=1), atol=3e-4)
    assert "b=rows" in _gemm_marks(compiled)[0]
    assert f"padded to [{layout}]" in compiled.c_source


def test_a_large_copy_is_made_per_image():
    """Over analysis.SLICED_COPY bytes, the padded copy holds one image at a time, made
    inside the batch loop (BRows.slices)."""
    graph, inputs = _conv((2, 64, 64, 64), (8, 64, 3, 3), bias_relu=True, pads=[1] * 4)
    compiled = _check(graph, inputs, Options(gemm_kernel=PORTABLE), atol=3e-4)
    src = compiled.c_source
    assert "b=rows" in _gemm_marks(compiled)[0] and "padded to [2,64,66,65]" in src
    size = int(re.search(r"polyc_scratch\(4, (\d+)\)", src).group(1))
    assert 4 * 64 * 66 * 65 <= size < 4 * 2 * 64 * 66 * 65


AVX512_CASES = {  # graph, inputs: edges in every direction of both tiles
    "odd-matmul": lambda: _matmul((127, 383), (383, 255)),
    "batched-transposed": lambda: _matmul((3, 33, 41), (29, 41), transpose_b=True),
    "bias-gelu-small-tiles": lambda: _matmul((70, 90), (90, 100), _bias_gelu),
    "conv-padded": lambda: _conv((2, 5, 18, 18), (24, 5, 3, 3), bias_relu=True, pads=[1] * 4),
    "conv-1x1-strided": lambda: _conv((1, 16, 15, 15), (40, 16, 1, 1), bias_relu=True,
                                      strides=[2, 2]),
    "conv-64-channels": lambda: _conv((1, 8, 11, 13), (64, 8, 3, 3), pads=[1] * 4),
}


@pytest.mark.parametrize("case", AVX512_CASES)
@pytest.mark.parametrize("kernel", registry.ISAS["avx512"])
def test_each_avx512_tile_matches_the_reference(kernel, case):
    """The avx512 kernels are one code on two tiles (sgemm_avx512.c): each, pinned."""
    options = replace(_isa("avx512"), gemm_kernel=kernel,
                      microkernel_tiles=(("kc", 24), ("mc", 32)) if "small" in case else ())
    graph, inputs = AVX512_CASES[case]()
    compiled = _check(graph, inputs, options, atol=3e-4)
    assert kernel in _gemm_marks(compiled)[0]


@pytest.mark.parametrize("kernel", [m.name for m in registry.REGISTRY
                                    if m.kind == "gemm" and m.target == "cpu"])
def test_tiles_at_the_right_edge_of_every_width_match_the_reference(kernel):
    """A tile of a few columns at the right edge computes only the vectors it stores
    (`W` in the kernels' C): every such width of the kernel, with K blocks adding up in C
    itself (a plain product) and in the partial sums (with bias and gelu), against the
    reference."""
    isa = next(isa for isa, names in registry.ISAS.items() if kernel in names)
    mk = registry.by_name(kernel)
    options = replace(_isa(isa), gemm_kernel=kernel, microkernel_tiles=(("kc", 16),))
    rng = np.random.default_rng(11)
    b, inputs, outputs = GraphBuilder("edges"), {}, []
    m, k = 99, 256  # rows past a whole tile too; products big enough to keep their kernels
    for e in (w for w in (5, 12, 20, 40) if w < mk.nr):
        n = 2 * mk.nr + e  # 32x14's 19 columns would be a kernel with another product
        for epilogue in (False, True):
            names = [f"{x}{e}{'g' if epilogue else ''}" for x in "awc"]
            shapes = [(m, k), (k, n), (n,)]
            inputs |= {name: _rand(rng, shape) for name, shape in zip(names, shapes)}
            y = b.matmul(b.input(names[0], shapes[0]), b.input(names[1], shapes[1]))
            outputs.append(b.gelu(b.add(y, b.input(names[2], shapes[2])), approximate="tanh")
                           if epilogue else y)
    graph = b.build(outputs)
    inputs = {t.name: inputs[t.name] for t in graph.inputs}
    marks_ = _gemm_marks(_check(graph, inputs, options))
    assert len(marks_) == len(outputs) and all(kernel in mark for mark in marks_)


def test_a_1x1_conv2d_over_small_planes_packs_b():
    """Its K rows are whole planes apart: packed, as a matmul's B (analysis.b_rows)."""
    graph, inputs = _conv((2, 24, 14, 14), (16, 24, 1, 1), bias_relu=True)
    compiled = _check(graph, inputs, Options(gemm_kernel=PORTABLE), atol=3e-4)
    mark = _gemm_marks(compiled)[0]
    assert "b=packed" in mark and "pack_b" in compiled.kernels[0].to_json()["schedule_text"]


@pytest.mark.parametrize("xs,ws,threads,mark", [((1, 40, 13, 13), (24, 40, 1, 1), 1, "b=packed"),
                                                ((1, 128, 23, 23), (48, 128, 1, 1), 2, "par=inner"),
                                                ((2, 40, 13, 13), (24, 40, 1, 1), 1, "b0,")])
def test_a_1x1_conv2d_packs_its_pixels_as_rows_of_one_run(xs, ws, threads, mark):
    """A stride-1 1x1 window reads each input plane's pixels end to end: B's K rows are
    contiguous across the image's row wraps, packed as a matmul's are, with no gathered
    row between (169 and 529 pixels: the last panel partial). Two images of 169 pixels
    keep their batch loop (`plan.FOLD_COLUMNS`), each packed so."""
    graph, inputs = _conv(xs, ws, bias_relu=True)
    options = Options(gemm_kernel=PORTABLE, threads=threads, microkernel_tiles=(("kc", 24),))
    compiled = _check(graph, inputs, options, atol=3e-4)
    assert mark in _gemm_marks(compiled)[0]
    assert "mk_rows" not in compiled.c_source and "mk_g += mk_gs" in compiled.c_source


@pytest.mark.parametrize("isa", ISAS)
def test_conv2d_b_rows_on_every_isa_with_the_variant(isa):
    options = _isa(isa)
    graph, inputs = _conv((2, 5, 18, 18), (12, 5, 3, 3), bias_relu=True, pads=[1, 1, 1, 1])
    compiled = _check(graph, inputs, options, atol=3e-4)
    (used,) = compiled.kernels[0].microkernels
    mk = registry.by_name(used)  # whichever of the isa's kernels measured fastest
    assert used in registry.ISAS[isa] and mk.b_rows_variant
    assert "b=rows" in _gemm_marks(compiled)[0] and mk.b_rows_variant + "(" in compiled.c_source


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 2), c=st.integers(1, 6), h=st.integers(3, 20), w=st.integers(3, 40),
       co=st.sampled_from([4, 6, 8, 12, 20]), kh=st.integers(1, 3), kw=st.integers(1, 3),
       dil=st.integers(1, 2), pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       kc=st.sampled_from([0, 5, 8, 20]), mc=st.sampled_from([0, 4, 12, 28]),
       parallel=st.booleans(), bias_relu=st.booleans(), isa=st.sampled_from(_target_isas()),
       fold=st.booleans())
def test_conv2d_b_rows_random(n, c, h, w, co, kh, kw, dil, pads, kc, mc, parallel, bias_relu,
                              isa, fold):
    """B read by rows for random shapes: virtual columns that wrap inside a tile (or
    several times, on narrow images), tiles at the edge of the virtual columns, K blocks,
    row blocks, the epilogue at the last block, threads sharing the tiles. With `fold`,
    two images under 64 columns each are folded into the columns of a packed B instead."""
    xs, ws = (n, c, h, w), (co, c, kh, kw)
    wp = w + pads[1] + pads[3]
    oh, ow = h + pads[0] + pads[2] - dil * (kh - 1), wp - dil * (kw - 1)
    if oh < 1 or ow < 1:
        return
    graph, inputs = _conv(xs, ws, bias_relu, seed=h * 100 + w, pads=pads,
                          dilations=[dil, dil])
    tiles = tuple((name, v) for name, v in (("kc", kc), ("mc", mc)) if v)
    options = replace(_isa(isa), microkernel_tiles=tiles, parallel=parallel, fold_batch=fold)
    compiled = _check(graph, inputs, options, atol=3e-4)
    marks = _gemm_marks(compiled)
    # a row's right pad and the next row's left one are shared in the copy, as far as
    # the row stays as wide as the outputs
    virtual = (wp - min(pads[1], pads[3], dil * (kw - 1))) * (oh - 1) + ow
    # a 1x1 window's K rows are whole planes apart: packed
    no_window = kh == kw == 1
    folded = fold and n > 1 and oh * ow < FOLD_COLUMNS
    if marks and folded:
        assert "b=folded" in marks[0], marks
    # rows made longer against L1 conflicts (`analysis._crowded`) add up to 8 columns each
    elif marks and (oh == 1 or _tiles(virtual + 8 * (oh - 1)) <= MAX_TILE_WASTE * _tiles(oh * ow)) \
            and not no_window:
        assert "b=rows" in marks[0], marks
    elif marks and (no_window or _tiles(virtual) > MAX_TILE_WASTE * _tiles(oh * ow)):
        assert "b=rows" not in marks[0], marks


def _tiles(columns: int) -> int:
    return -(-columns // COLUMN_TILE)


@pytest.mark.parametrize("xs,loops,points", [((4, 64, 20, 20), "par=batch threads=2 loops=b0,pc", 1),
                                              ((4, 64, 13, 13), "loops=pc,b0", 4)],
                         ids=["each-thread-its-images", "images-inside-k-blocks"])
def test_partial_sums_are_one_images_where_each_thread_takes_whole_images(xs, loops, points):
    """A local result in K blocks (bias+relu after the last) sums in scratch: where the
    threads share out the images, each image's K blocks in the thread that took it,
    that is one image's sums at a time in each thread's own buffer, warm from the image
    before; where every image's K block comes before the next block, all of them."""
    graph, inputs = _conv(xs, (24, 64, 1, 1), bias_relu=True)
    compiled = _check(graph, inputs, Options(threads=2, microkernel_tiles=(("kc", 24),)),
                      atol=3e-4)
    (mark,) = _gemm_marks(compiled)
    assert loops in mark and "b=packed" in mark, mark
    columns = xs[2] * xs[3]
    assert f"mk_acc = polyc_scratch(2, {4 * points * 24 * columns})" in compiled.c_source


@pytest.mark.parametrize("images,threads,par", [(3, 1, "none"), (3, 2, "inner"),
                                                (4, 2, "batch")])
def test_weights_are_packed_once_for_every_image(images, threads, par, monkeypatch):
    """B copied image by image (`SLICED_COPY`, lowered) keeps the loop over images
    outside A's blocks; A, the same for every image, is packed whole before that loop
    (`a=once`): K blocks and row blocks that end short, 14 rows in panels of 4 or 6,
    the images shared by a team or each thread's own."""
    from polyc.microkernels import analysis
    monkeypatch.setattr(analysis, "SLICED_COPY", 1024)
    graph, inputs = _conv((images, 24, 20, 21), (14, 24, 3, 3), bias_relu=True,
                          pads=[1, 1, 1, 1])
    options = Options(threads=threads, microkernel_tiles=(("kc", 40), ("mc", 8)))
    compiled = _check(graph, inputs, options, atol=3e-4)
    (mark,) = _gemm_marks(compiled)
    assert "a=once" in mark and "loops=b0," in mark and f"par={par}" in mark, mark
    assert "mk_paw" in compiled.c_source
    (promoted,) = [p for p in compiled.kernels[0].promotions if p.buffer == "mk_pa"]
    mr = registry.by_name(marks.parse(mark).kernel).mr
    assert promoted.bytes == 4 * -(-14 // mr) * mr * 216  # all of A, in whole panels


def _const_conv(images, ws, data_seed, **attrs):
    """conv2d + bias + relu whose weights are a constant of the graph (an ONNX model's
    initializer)."""
    rng = np.random.default_rng(data_seed)
    b = GraphBuilder("conv_const")
    w = b.constant("w", ws, _rand(rng, ws).ravel().tolist())
    y = b.conv2d(b.input("x", (images, ws[1], 13, 15)), w, b.input("b", (ws[0],)), **attrs)
    return b.build([b.relu(y)])


@pytest.mark.parametrize("images,ws,threads,attrs", [
    (1, (14, 24, 3, 3), 1, {"pads": [1, 1, 1, 1]}),
    (3, (14, 24, 3, 3), 2, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    (2, (30, 24, 1, 1), 2, {})])
def test_constant_weights_are_packed_on_the_first_call_and_kept(images, ws, threads, attrs):
    """Weights that are a constant are packed whole on the kernel's first call and kept
    by the loaded object (`a=const`): later calls, on other images, read the same
    panels. The unit names the constant's data, so two graphs that differ only in their
    weights build two objects, each right for its own."""
    options = Options(threads=threads, microkernel_tiles=(("kc", 40), ("mc", 8)))
    rng = np.random.default_rng(1)
    sources = []
    for data_seed in (0, 1):
        graph = _const_conv(images, ws, data_seed, **attrs)
        compiled = compile(graph, options=options)
        (mark,) = _gemm_marks(compiled)
        assert "a=const" in mark, mark
        for _ in range(2):  # the first call packs, the second reads what it kept
            inputs = {"x": _rand(rng, (images, ws[1], 13, 15)), "b": _rand(rng, (ws[0],))}
            got, want = compiled(**inputs), run_reference(graph, inputs)
            for name in graph.outputs:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=3e-4)
        sources.append(compiled.c_source)
    assert all("static float *mk_const_S0_a" in c for c in sources) and sources[0] != sources[1]


@pytest.mark.parametrize("threads", [1, 2])
def test_constant_b_is_packed_on_the_first_call_and_kept(threads):
    """A linear layer's weights as a constant (B, over batch dims of x it has not):
    packed whole on the first call, K blocks and column blocks that end short, then
    read by every later call (`b=const`)."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("linear_const")
    w = b.constant("w", (96, 200), _rand(rng, (96, 200)).ravel().tolist())
    graph = b.build([b.gelu(b.linear(b.input("x", (3, 70, 96)), w, b.input("b", (200,))))])
    options = Options(threads=threads, microkernel_tiles=(("kc", 40), ("nc", 64), ("mc", 12)))
    compiled = compile(graph, options=options)
    (mark,) = _gemm_marks(compiled)
    assert "b=const" in mark and "loops=jc,pc," in mark, mark
    for _ in range(2):
        inputs = {"x": _rand(rng, (3, 70, 96)), "b": _rand(rng, (200,))}
        got, want = compiled(**inputs), run_reference(graph, inputs)
        np.testing.assert_allclose(got[graph.outputs[0]], want[graph.outputs[0]],
                                   rtol=1e-4, atol=1e-4)
    assert "static float *mk_const_S0_b" in compiled.c_source


def test_a_symbolic_kernel_packs_its_constant_weights_once():
    """Rows of x as a symbol, the weights a constant: every version of the kernel keeps
    its own panels of them, right at any number of rows."""
    rng = np.random.default_rng(3)
    w = _rand(rng, (64, 48))
    compiled = compile({"name": "sym_linear", "inputs": [{"name": "x", "shape": ["N", 64]}],
                        "constants": [{"name": "w", "shape": [64, 48], "dtype": "float32",
                                       "data": w.ravel().tolist()}],
                        "nodes": [{"op": "matmul", "inputs": ["x", "w"], "outputs": ["y"]}],
                        "outputs": ["y"], "symbols": {"N": {"min": 1, "max": 4096}}})
    assert all("b=const" in m for m in _gemm_marks(compiled))
    for rows in (3, 700, 77):
        x = _rand(rng, (rows, 64))
        np.testing.assert_allclose(compiled(x=x)["y"], x @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("images,threads,alone", [(1, 1, True), (2, 2, True), (1, 2, False)])
def test_a_1x1_conv2d_is_packed_in_blocks_that_stay_in_l2_where_one_thread_has_it(
        images, threads, alone):
    """A 1x1 window's K rows are whole planes apart: B is packed (`analysis.b_rows`), even
    over 56x56 planes. Its one block of A reads each B block once, so where one thread
    computes the whole contraction (one thread, or a thread per image) the block fills
    an eighth of L2 (`tiles.model_tiles`' `alone`), in several blocks; a team sharing
    the one image's blocks keeps a share of L3, here one block."""
    graph, inputs = _conv((images, 64, 56, 56), (32, 64, 1, 1), bias_relu=True)
    compiled = _check(graph, inputs, Options(threads=threads, gemm_kernel="sgemm_vec_6x16"),
                      atol=3e-4)
    (mark,) = _gemm_marks(compiled)
    plan = marks.parse(mark)
    assert plan.b == "packed" and plan.par == ("inner" if not alone else
                                               "batch" if images > 1 else "none"), mark
    from polyc.targets.cpu.tiles import model_tiles
    machine = cpu_machine()
    if alone:
        assert 4 * plan.kc * plan.nc <= machine.fusion_level.capacity // 8, mark
        assert "jc" in plan.loops, mark
    else:
        shared = model_tiles(32, 56 * 56, 64, registry.by_name("sgemm_vec_6x16"), machine)
        assert plan.nc == shared.nc, mark


@pytest.mark.parametrize("const", [True, False])
def test_a_constant_a_that_fits_l2_is_one_k_block(const):
    """One thread, A packed once and whole in a quarter of L2 (conv2d's weights, 32 x
    1024): K is one block, no pass over C again (`tiles.model_tiles`' `const_a`). A
    matmul's A of that shape, packed again for each block of B, keeps the L1 rule's
    K blocks (16 columns x 768 floats of B fill 48 KiB)."""
    options = Options(threads=1, gemm_kernel="sgemm_vec_6x16")
    if const:
        graph = _const_conv(1, (32, 1024, 1, 1), 3)
        rng = np.random.default_rng(4)
        inputs = {"x": _rand(rng, (1, 1024, 13, 15)), "b": _rand(rng, (32,))}
    else:
        graph, inputs = _matmul((32, 1024), (1024, 195))
    plan = marks.parse(_gemm_marks(_check(graph, inputs, options, atol=3e-4))[0])
    assert (plan.a == "const") == const, plan
    assert ("pc" not in plan.loops and plan.kc == 1024) == const, plan


@pytest.mark.parametrize("isa", ISAS)
def test_forced_variants(isa):
    options = _isa(isa)
    graph, inputs = _matmul((50, 70), (70, 45), _bias_gelu)
    compiled = _check(graph, inputs, options)
    assert any(name in _gemm_marks(compiled)[0] for name in registry.ISAS[isa])


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(8, 70), n=st.integers(8, 70), k=st.integers(8, 70),
       batch=st.sampled_from([(), (3,), (2, 1)]), ta=st.booleans(), tb=st.booleans(),
       kc=st.sampled_from([0, 8, 20]), mc=st.sampled_from([0, 6, 24, 28]),
       nc=st.sampled_from([0, 16, 48, 64]), parallel=st.booleans(),
       isa=st.sampled_from(_target_isas()))
def test_random_contractions(m, n, k, batch, ta, tb, kc, mc, nc, parallel, isa):
    sa = batch + ((k, m) if ta else (m, k))
    sb = (n, k) if tb else (k, n)
    graph, inputs = _matmul(sa, sb, _bias_gelu if (m + n) % 2 else None,
                            transpose_a=ta, transpose_b=tb)
    tiles = tuple((name, v) for name, v in (("kc", kc), ("mc", mc), ("nc", nc)) if v)
    options = replace(_isa(isa), microkernel_tiles=tiles, parallel=parallel)
    assert _gemm_marks(_check(graph, inputs, options))


# --- prologues folded into packing, and fusions that would lose the kernel -------------

def _prologue_graph(prologue: str):
    rng = np.random.default_rng(3)
    b = GraphBuilder("pro")
    shapes = {"a": (128, 96), "at": (96, 128), "w": (96, 160), "wt": (160, 96), "s": (96,)}
    x = {n: b.input(n, shapes[n]) for n in shapes}

    def t(v):
        return b.op("transpose", v, perm=[1, 0])
    y = {"transpose_a": lambda: b.matmul(t(x["at"]), x["w"]),
         "transpose_b": lambda: b.matmul(x["a"], t(x["wt"])),
         "scale_a": lambda: b.matmul(b.mul(x["a"], x["s"]), x["w"]),
         "relu_b": lambda: b.matmul(x["a"], b.relu(x["w"])),
         "chain": lambda: b.gelu(b.matmul(b.relu(t(x["at"])), x["w"]))}[prologue]()
    graph = b.build([y])  # inputs no node reads are dropped
    return graph, {n.name: _rand(rng, shapes[n.name]) for n in graph.inputs}


@pytest.mark.parametrize("prologue", ["transpose_a", "transpose_b", "scale_a", "relu_b", "chain"])
def test_cheap_producers_are_folded_into_the_packed_operand(prologue):
    compiled = _check(*_prologue_graph(prologue))
    (kernel,) = compiled.kernels
    assert len(_gemm_marks(compiled)) == 1
    assert any("folded into the operand of" in line for line in kernel.fusion_report)
    stored = {s.target for s in kernel.kernel.statements}  # the prologue's are gone
    assert not any(t.startswith(("transpose", "relu", "mul")) for t in stored), stored


def test_a_pair_refused_early_is_proposed_again_after_a_merge():
    # transpose(relu(transpose(a))): the inner pair fuses first, the outer transpose is
    # refused (transposed read), then folds into the matmul; proposed again, the inner
    # pair folds into that operand too
    rng = np.random.default_rng(6)
    b = GraphBuilder("chain")
    a, w = b.input("a", [128, 96]), b.input("w", [96, 160])
    inner = b.relu(b.op("transpose", a, perm=[1, 0]))
    graph = b.build([b.matmul(b.op("transpose", inner, perm=[1, 0]), w)])
    compiled = _check(graph, {"a": _rand(rng, (128, 96)), "w": _rand(rng, (96, 160))})
    (kernel,) = compiled.kernels
    assert len(_gemm_marks(compiled)) == 1
    last = [x for x in kernel.fusion_report if x.startswith(("vertical", "horizontal"))][-1]
    # only relu's output newly stays local: written and read once, 96 * 128 floats each
    assert "folded into the operand" in last and last.endswith("saves 96.0 KiB"), last


def test_expensive_or_shared_producers_stay_in_their_own_kernel():
    b = GraphBuilder("kept")
    a, w = b.input("a", [128, 96]), b.input("w", [96, 160])
    r = b.relu(a, out="r")  # an output: stored anyway
    graph = b.build([b.matmul(b.exp(a), w, out="y1"), b.matmul(r, w, out="y2"), r])
    rng = np.random.default_rng(4)
    compiled = _check(graph, {"a": _rand(rng, (128, 96)), "w": _rand(rng, (96, 160))})
    assert len(_gemm_marks(compiled)) == 2
    report = [line for k in compiled.kernels for line in k.fusion_report]
    assert not any("folded" in line for line in report), report


def _row_tail_graph(after: str, sa=(130, 200), sb=(200, 170), seed=5):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mmrows")
    a, w = b.input("a", sa), b.input("w", sb)
    y = b.matmul(a, w)
    if after == "scaled_softmax":  # an epilogue, then the rows
        y = b.op("softmax", b.mul(y, b.constant("s", [], [0.125])), axis=-1)
    elif after == "rms_norm":
        y = b.op("rms_norm", y, b.input("g", sb[-1:]))
    elif after == "reduce_sum":
        y = b.reduce_sum(y, axes=[-1], keepdims=True)
    else:
        y = b.op(after, y, axis=-1)
    graph = b.build([y])
    return graph, {t.name: _rand(rng, t.type.shape) for t in graph.inputs}


@pytest.mark.parametrize("after", ["softmax", "scaled_softmax", "log_softmax", "reduce_sum",
                                   "rms_norm"])
@pytest.mark.parametrize("tiles,parallel", [((), False), ((("kc", 64), ("mc", 12)), True)])
def test_row_operations_after_a_matmul_run_in_its_nest(after, tiles, parallel):
    # every column of C in one block, so each block of rows is final at its end and the
    # row operations read it from cache: one kernel, the contraction on its microkernel;
    # odd M and N (edge tiles), K in blocks, several row blocks shared by a team of 2
    graph, inputs = _row_tail_graph(after)
    options = Options(microkernel_tiles=tiles, parallel=parallel, threads=2 if parallel else 0)
    compiled = _check(graph, inputs, options)
    (kernel,) = compiled.kernels
    (plan,) = _gemm_marks(compiled)
    mk = registry.by_name(marks.parse(plan).kernel)  # the host's calibration chose it
    assert " n=170 " in plan and f" nc={-(-170 // mk.nr) * mk.nr} " in plan, plan
    assert "jc" not in plan, plan
    if tiles:  # mc a multiple of the kernel's rows
        assert "pc" in plan and f"mc={max(mk.mr, 12 - 12 % mk.mr)}" in plan, plan
        assert "par=inner" in plan and "ic" in plan, plan
        assert 'mark: "team_for' in kernel.to_json()["schedule_text"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(100, 100), (70, 130)])
def test_attention_is_one_kernel_its_softmax_and_product_with_v_in_the_scores_nest(causal, lq, lk):
    # (each contraction large enough to keep its microkernel: 2^20 multiply-adds); at 2
    # threads the 3 heads are shared by a team (par=inner): the tail's rows and the
    # product's tiles are split among its threads
    rng = np.random.default_rng(6)
    b = GraphBuilder("att")
    q, k, v = b.input("q", (3, lq, 64)), b.input("k", (3, lk, 64)), b.input("v", (3, lk, 48))
    graph = b.build([b.attention(q, k, v, causal=causal, out="y")])
    inputs = {t.name: _rand(rng, t.type.shape) for t in graph.inputs}
    for options in (Options(), Options(threads=2)):
        compiled = _check(graph, inputs, options)
        (kernel,) = compiled.kernels
        (plan,) = _gemm_marks(compiled)
        assert "y.unscaled" in kernel.kernel.nodes and "y" in kernel.kernel.nodes
        report = kernel.fusion_report
        assert any("row tail (y.max, " in line and "y.inv_sum)" in line for line in report)
        assert any("row tail's contraction" in line and "y.exp, read in place" in line
                   for line in report), report
        assert f" then={registry.by_name(marks.parse(plan).then).name}" in plan
        # the scores and exponentials live one block of rows at a time
        assert any(line.startswith(("y.scores (", "y.exp (")) and "a block of" in line
                   for line in report), report
        # the causal mask's tiles of scores are not computed, nor the K steps of the
        # product with v past each tile's diagonal
        assert ("masked=0" in plan) == causal and ("then_depth=0" in plan) == causal, plan


@pytest.mark.parametrize("kc", [0, 40])
def test_causal_attention_with_an_inf_in_v_past_the_diagonal_is_nan_as_the_reference(kc):
    # the K steps past the diagonal multiply v by 0: skipped only while v is finite; K
    # blocks of 40 for the scores: v is packed, and the product runs, at the last only
    rng = np.random.default_rng(11)
    b = GraphBuilder("att")
    q, k, v = b.input("q", (2, 150, 64)), b.input("k", (2, 150, 64)), b.input("v", (2, 150, 32))
    graph = b.build([b.attention(q, k, v, causal=True, out="y")])
    inputs = {t.name: _rand(rng, t.type.shape) for t in graph.inputs}
    options = Options(microkernel_tiles=(("kc", kc),) if kc else ())
    compiled = _check(graph, inputs, options)
    (plan,) = _gemm_marks(compiled)
    assert "then_depth=0" in plan and ("pc" in plan) == bool(kc), plan
    inputs["v"][1, 140, 5] = np.inf  # a key only queries 140.. see
    got, want = compiled(**inputs)["y"], run_reference(compiled.graph, inputs)["y"]
    assert np.isnan(got[1, :140, 5]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_row_tails_contraction_takes_an_elementwise_epilogue(threads):
    """softmax(q k^T) @ v + bias, relu: the bias and relu are the product's epilogue,
    applied to each of its tiles on the stack in the scores' nest (at 2 threads by the
    team that shares the block's rows), one kernel."""
    rng = np.random.default_rng(8)
    b = GraphBuilder("tail_epilogue")
    q, k, v = b.input("q", (2, 100, 64)), b.input("k", (2, 120, 64)), b.input("v", (2, 120, 40))
    probs = b.op("softmax", b.matmul(q, k, transpose_b=True), axis=-1)
    graph = b.build([b.relu(b.add(b.matmul(probs, v), b.input("bias", (40,))))])
    inputs = {t.name: _rand(rng, t.type.shape) for t in graph.inputs}
    compiled = _check(graph, inputs, Options(threads=threads))
    (plan,) = _gemm_marks(compiled)
    assert len(compiled.kernels) == 1 and " then=" in plan, plan
    assert "mk_tt" in compiled.c_source  # the product's tile, written back through its epilogue


@pytest.mark.parametrize("threads", [1, 2])
def test_a_v_shared_by_every_head_follows_the_softmax_in_its_nest(threads):
    # multi-query attention: v has no head dim, so the heads are rows of the product
    # with v, which still runs on each block of the scores' rows
    rng = np.random.default_rng(13)
    b = GraphBuilder("mqa")
    q, k, v = b.input("q", (4, 200, 64)), b.input("k", (4, 300, 64)), b.input("v", (300, 48))
    probs = b.op("softmax", b.matmul(q, k, transpose_b=True), axis=-1)
    graph = b.build([b.matmul(probs, v)])
    inputs = {t.name: _rand(rng, t.type.shape) for t in graph.inputs}
    compiled = _check(graph, inputs, Options(threads=threads))
    (plan,) = _gemm_marks(compiled)
    assert len(compiled.kernels) == 1 and " then=" in plan, plan


@pytest.mark.parametrize("isa", ["", "portable"])
def test_one_head_of_attention_shared_by_a_team_with_edge_tiles(isa):
    # one head (no batch loop: the team shares every tile loop), rows in several blocks
    # and a last short one, v 40 wide (a last tile of 8 columns); the portable kernel
    # reads its A in place too; an L2 of 1 MiB, so that the rows take several blocks
    rng = np.random.default_rng(12)
    b = GraphBuilder("att1")
    q, k, v = b.input("q", (1, 301, 64)), b.input("k", (1, 700, 64)), b.input("v", (1, 700, 40))
    graph = b.build([b.attention(q, k, v, out="y")])
    inputs = {t.name: _rand(rng, t.type.shape) for t in graph.inputs}
    compiled = _check(graph, inputs, Options(threads=2, microkernel_isa=isa),
                      target=_with_l2(1 << 20))
    (plan,) = _gemm_marks(compiled)
    assert "par=inner" in plan and "ic" in plan and " then=" in plan, plan
    if isa:
        assert "then=sgemm_vec_6x16" in plan


def _masked_scores(select_args, *, d: int = 0, fold: bool = False, out_scores: bool = False):
    """softmax over select(col > row + d, ...) of q k^T, the mask from iota constants or
    (`fold`) a constant; `select_args(mask, neg_inf, scores)` orders the select."""
    b = GraphBuilder("ms")
    q, k = b.input("q", (2, 90, 64)), b.input("k", (2, 110, 64))
    scores = b.matmul(q, k, transpose_b=True)
    if fold:
        rows, cols = np.indices((90, 110))
        mask = b.constant("mask", (90, 110), (cols > rows + d).astype(np.int32).ravel().tolist(),
                          "int32")
    else:
        row = b.constant("row", (90, 1), [i + d for i in range(90)], "int32")
        col = b.constant("col", (1, 110), list(range(110)), "int32")
        mask = b.greater(col, row)
    masked = b.select(*select_args(mask, b.constant("ninf", (), [-1e30]), scores))
    outs = [b.op("softmax", masked, axis=-1)] + ([scores] if out_scores else [])
    return b.build(outs)


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("d", [0, 3])
def test_masked_tiles_of_scores_are_skipped_and_the_softmax_unchanged(fold, d):
    graph = _masked_scores(lambda m, ninf, s: (m, ninf, s), d=d, fold=fold)
    rng = np.random.default_rng(9)
    inputs = {t.name: _rand(rng, t.type.shape) for t in graph.inputs}
    for options in (Options(threads=1), Options(threads=2)):
        compiled = _check(graph, inputs, options)
        # iota constants shifted by d are no iota: only the folded mask states d = 3
        want = f"masked={d}" if fold or d == 0 else None
        plan = _gemm_marks(compiled)[0]
        assert (want in plan) if want else ("masked" not in plan), plan


@pytest.mark.parametrize("case", ["mask selects the scores", "scores are an output"])
def test_scores_read_where_masked_are_computed(case):
    if case == "mask selects the scores":  # select(mask, scores, -inf): the other half
        graph = _masked_scores(lambda m, ninf, s: (m, s, ninf))
    else:
        graph = _masked_scores(lambda m, ninf, s: (m, ninf, s), out_scores=True)
    rng = np.random.default_rng(10)
    inputs = {t.name: _rand(rng, t.type.shape) for t in graph.inputs}
    compiled = _check(graph, inputs)
    assert all("masked" not in plan for plan in _gemm_marks(compiled))


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(20, 90), n=st.integers(20, 150), k=st.integers(20, 90),
       batch=st.sampled_from([(), (3,)]),
       after=st.sampled_from(["softmax", "log_softmax", "reduce_sum", "rms_norm"]),
       kc=st.sampled_from([0, 16, 40]), mc=st.sampled_from([0, 6, 24]),
       parallel=st.booleans())
def test_random_row_tails(m, n, k, batch, after, kc, mc, parallel):
    # the host's own gemm kernel (pinning an ISA it lacks would skip every example)
    graph, inputs = _row_tail_graph(after, sa=batch + (m, k), sb=(k, n), seed=m * n + k)
    tiles = tuple((name, v) for name, v in (("kc", kc), ("mc", mc)) if v)
    options = Options(microkernel_tiles=tiles, parallel=parallel, threads=2 if parallel else 0)
    compiled = _check(graph, inputs, options)
    assert len(compiled.kernels) == 1 and _gemm_marks(compiled)


def test_a_row_tail_shared_by_a_team_may_stream_its_output():
    # 18 MiB of probabilities: on a host whose last cache level is at most 36 MiB, the
    # tail's rows, shared by the team, store them with non-temporal stores (`stream`)
    rng = np.random.default_rng(7)
    b = GraphBuilder("att")
    q, k = b.input("q", (1, 4608, 64)), b.input("k", (1, 1024, 64))
    graph = b.build([b.op("softmax", b.matmul(q, k, transpose_b=True), axis=-1)])
    inputs = {t.name: _rand(rng, t.type.shape) for t in graph.inputs}
    compiled = _check(graph, inputs, Options(threads=2))
    assert len(compiled.kernels) == 1 and "par=inner" in _gemm_marks(compiled)[0]


def test_a_row_tail_over_a_symbolic_number_of_rows():
    graph = {"name": "smw", "inputs": [{"name": "x", "shape": ["N", 96]},
                                       {"name": "w", "shape": [96, 200]}],
             "nodes": [{"op": "matmul", "inputs": ["x", "w"], "outputs": ["h"]},
                       {"op": "softmax", "inputs": ["h"], "outputs": ["y"]}],
             "outputs": ["y"]}
    compiled = compile(graph)
    (kernel,) = compiled.kernels
    assert not compiled.fallbacks and kernel.marks(marks.Gemm)
    for n in (1, 7, 300, 1000):
        rng = np.random.default_rng(n)
        inputs = {"x": _rand(rng, (n, 96)), "w": _rand(rng, (96, 200))}
        np.testing.assert_allclose(compiled(**inputs)["y"],
                                   run_reference(compiled.graph, inputs)["y"], rtol=1e-4,
                                   atol=1e-6)


def test_a_conv2d_keeps_reading_its_input_in_place_rather_than_take_a_row_tail():
    # a global sum pool after conv2d is a row tail, but the tail's single column block
    # would make B packed: the direct convolution and a pooling kernel instead
    b = GraphBuilder("convpool")
    x, w = b.input("x", (1, 16, 20, 40)), b.input("w", (32, 16, 3, 3))
    y = b.reduce_sum(b.relu(b.conv2d(x, w, pads=[1, 1, 1, 1])), axes=[2, 3], keepdims=True)
    graph = b.build([y])
    rng = np.random.default_rng(8)
    compiled = _check(graph, {"x": _rand(rng, (1, 16, 20, 40)), "w": _rand(rng, (32, 16, 3, 3))},
                      atol=1e-3)
    assert len(compiled.kernels) == 2
    (plan,) = _gemm_marks(compiled)
    assert plan.endswith("b=rows"), plan


def _with_l2(capacity: int):
    return cpu_machine().with_capacity("L2", capacity)


def test_a_packed_b_block_stays_a_few_mib_whatever_l3_says():
    # a virtual machine is shown its socket's whole L3 (300 MiB on a 2-core guest): an
    # eighth of a core's share would make 16 MiB blocks of 1024x1024 @ 1024x4096's B
    from polyc.targets.cpu.tiles import B_BLOCK, model_tiles
    big = replace(cpu_machine().with_capacity("L3", 300 << 20), cores=2)
    for mk in registry.REGISTRY:
        if mk.kind == "gemm" and mk.target == "cpu":
            t = model_tiles(1024, 4096, 1024, mk, big)
            assert 4 * t.kc * t.nc <= B_BLOCK and t.nc < 4096, (mk.name, t)


@pytest.mark.parametrize("k,whole", [(1024, True), (2048, True), (4096, False)])
def test_where_c_streams_k_is_one_block_if_its_micro_panel_fits_half_the_l2(k, whole):
    # 1 MiB of L2 (Zen 5), the 8x48 kernel: an eighth of it is 682 rows of B's panel,
    # half is 2730; C 16 MiB, far over twice L2 (`c_streams`)
    from polyc.targets.cpu.tiles import model_tiles
    mk = registry.by_name("sgemm_avx512_8x48")
    t = model_tiles(1024, 4096, k, mk, _with_l2(1 << 20))
    assert (t.kc == k) == whole, t
    assert t.kc * mk.nr * 4 <= (1 << 20) // (2 if whole else 8) and t.mc >= mk.mr
    # C over twice L2 streams (3 MiB); up to twice it keeps the L1 rule
    assert (model_tiles(768, 1024, k, mk, _with_l2(1 << 20)).kc == k) == whole
    assert model_tiles(512, 1024, k, mk, _with_l2(1 << 20)).kc < k


@pytest.mark.parametrize("l2,kernels", [(256 << 10, 3), (2 << 20, 1)])
def test_a_softmax_tail_needs_blocks_of_several_row_panels(l2, kernels):
    # 2048 scores a row: half of a 256 KiB L2 holds 16 rows, too few for B's panels to
    # be reused by any kernel's 8 row panels (the matmul would stream k from L3 every
    # few tiles); 2 MiB holds 128, and the product with v follows on each block
    b = GraphBuilder("att")
    q, k, v = (b.input(n, (2, 2048, 64)) for n in "qkv")
    graph = b.build([b.attention(q, k, v, out="y")])
    compiled = compile(graph, _with_l2(l2), options=Options(gemm_kernel=PORTABLE), build=False)
    assert len(compiled.kernels) == kernels


def test_rows_longer_than_half_the_l2_stay_in_their_own_kernel():
    # a row of C over half of L2: no block of rows fits, the row sum is a kernel of its own
    graph, inputs = _row_tail_graph("reduce_sum", sa=(24, 16), sb=(16, 5000))
    compiled = compile(graph, _with_l2(32 << 10))
    got = compiled(**inputs)[graph.outputs[0]]
    np.testing.assert_allclose(got, run_reference(graph, inputs)[graph.outputs[0]], rtol=1e-4,
                               atol=1e-3)
    assert len(compiled.kernels) == 2
    report = [line for k in compiled.kernels for line in k.fusion_report]
    assert any("rows that fit half of L2" in line for line in report), report


# --- row reductions ---------------------------------------------------------------------

@pytest.mark.parametrize("op,fn", [("reduce_sum", "polyc_row_sum_f32"),
                                   ("reduce_max", "polyc_row_max_f32")])
def test_row_kernels(op, fn):
    rng = np.random.default_rng(11)
    b = GraphBuilder("rows")
    x = b.input("x", (37, 1001))
    graph = b.build([getattr(b, op)(x, axes=[-1], keepdims=op == "reduce_max")])
    xv = _rand(rng, (37, 1001))
    xv[3, 500] = np.nan  # numpy's max and sum propagate it, from the vector loop
    xv[5, 1000] = np.nan  # and from the scalar tail
    xv[7] = -np.inf
    xv[9, 17] = np.inf
    compiled = compile(graph)
    got = compiled(x=xv)[graph.outputs[0]]
    want = run_reference(graph, {"x": xv})[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert fn in compiled.c_source


# --- tuning -------------------------------------------------------------------------------

def _tuned(text: str) -> tuple[str, dict[str, int]]:
    """(microkernel, tiles) of a tune report's 'best: ' text."""
    words = text.split(" (")[0].split()
    return words[0], {k: int(v) for k, v in (w.split("=") for w in words[1:])}


def test_tune_keeps_the_best_tiles_for_later_compiles(tmp_path, monkeypatch, seeded_cache,
                                                      capsys):
    from polyc.cli import main
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path))  # the stored entry stays here
    b = GraphBuilder("tune_me")
    graph_json = b.to_json([b.relu(b.matmul(b.input("a", (96, 72)), b.input("w", (72, 80))))])
    path = tmp_path / "g.json"
    import json
    path.write_text(json.dumps(graph_json))

    def tiles(threads):
        plan = marks.parse(_gemm_marks(compile(str(path), options=Options(threads=threads),
                                                  build=False))[0])
        return plan.kernel, {"kc": plan.tiles.kc, "mc": plan.tiles.mc, "nc": plan.tiles.nc}

    model_tiles = tiles(3)
    assert main(["tune", str(path), "--budget", "6", "--repeat", "1", "--threads", "1"]) == 0
    out = capsys.readouterr()
    assert "best: " in out.out and "6/6" in out.err  # the progress bar ends full
    assert "with 1 thread(s)" in out.out
    assert tiles(1) == _tuned(out.out.split("best: ")[1])
    assert tiles(3) == model_tiles  # measured for one thread, not for a team of three
    # every gemm kernel the host can run was among the candidates
    target = cpu_machine()
    runnable = [m.name for m in registry.REGISTRY
                if m.kind == "gemm" and set(m.features) <= target.features]
    measured = {line.split()[1] for line in out.out.splitlines() if line.endswith(" ms")
                and ": best: " not in line}
    assert measured == set(runnable[:6])


def test_tune_measures_each_contraction_alone(tmp_path, monkeypatch, seeded_cache, capsys):
    import json

    from polyc.cli import main
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path))
    b = GraphBuilder("two")
    y1 = b.matmul(b.input("a", (96, 72)), b.input("w", (72, 80)))
    y2 = b.matmul(b.input("c", (40, 200)), b.input("v", (200, 64)))
    path = tmp_path / "g.json"
    path.write_text(json.dumps(b.to_json([y1, y2])))
    assert main(["tune", str(path), "--budget", "2", "--repeat", "1", "--threads", "1"]) == 0
    best = {}
    for line in capsys.readouterr().out.splitlines():
        if ": best: " in line:
            name, text = line.split(": best: ")
            best[name] = _tuned(text)
    compiled = compile(str(path), options=Options(threads=1), build=False)
    assert sorted(best) == sorted(k.name for k in compiled.kernels)
    for k in compiled.kernels:
        (mark,) = [line.split('"')[1] for line in k.to_json()["schedule_text"].splitlines()
                   if 'mark: "gemm ' in line]
        plan = marks.parse(mark)
        t = plan.tiles
        assert (plan.kernel, {"kc": t.kc, "mc": t.mc, "nc": t.nc}) == best[k.name]


def test_tuned_tiles_hold_for_the_team_they_were_measured_with(tmp_path, monkeypatch,
                                                                seeded_cache):
    from polyc.targets.cpu import tuning
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path))  # the stored entry stays here
    graph, _ = _matmul((96, 72), (72, 80), None)
    plan = lambda threads: marks.parse(_gemm_marks(
        compile(graph, options=Options(threads=threads), build=False))[0])
    model = plan(2).tiles
    tuned = {"kc": 24, "mc": 168, "nc": 96}  # multiples of every kernel's mr and nr
    assert (model.kc, model.mc, model.nc) != tuple(tuned.values())
    for kernel in compile(graph, build=False).kernels:
        tuning.store(kernel.kernel, cpu_machine(), 1, kernel.marks(marks.Gemm)[0].kernel,
                     tuned, 1e-3)
    got = plan(1).tiles
    assert (got.kc, got.mc, got.nc) == tuple(tuned.values())
    assert plan(2).tiles == model


# --- the kernel's tile shape follows the shape of C ---------------------------------------

@pytest.mark.parametrize("shape,name", [((64, 3136), "sgemm_avx2_4x24"),
                                        ((1024, 1024), "sgemm_avx2_6x16"),
                                        ((127, 255), "sgemm_avx2_6x16"),  # a tie: the taller
                                        ((20, 48), "sgemm_avx2_4x24")])
def test_the_tile_that_wastes_least_is_chosen(shape, name):
    """Assumes a target with avx2 and fma whose two avx2 kernels measured alike."""
    rates = {"sgemm_avx2_6x16": 100.0, "sgemm_avx2_4x24": 100.0, "sgemm_vec_6x16": 50.0}
    target = _features("avx2", "fma")
    assert registry.select("gemm", "float32", target, shape=shape, rates=rates).name == name


def test_an_avx512_edge_tile_costs_the_vectors_it_computes():
    # 196 columns (a 14x14 image): 8x48 computes 4 tiles and one vector (208), 14x32 six
    # tiles and one vector (208); counted whole, 240 and 224 had ranked 14x32 first
    for name in ("sgemm_avx512_8x48", "sgemm_avx512_14x32"):
        assert registry.tile_efficiency(registry.by_name(name), 1024, 196) == pytest.approx(
            (1024 / (-(-1024 // registry.by_name(name).mr) * registry.by_name(name).mr))
            * 196 / 208)
    assert registry.tile_efficiency(registry.by_name("sgemm_avx2_6x16"), 6, 196) == 196 / 208
    assert registry.tile_efficiency(registry.by_name("sgemm_avx2_4x24"), 4, 196) == 196 / 216
    rates = {"sgemm_avx512_14x32": 247.5, "sgemm_avx512_8x48": 268.4}  # Zen 5's
    target = _features("avx512f")
    assert registry.select("gemm", "float32", target, shape=(1024, 196),
                           rates=rates).name == "sgemm_avx512_8x48"


@pytest.mark.parametrize("streaming,name", [(False, "sgemm_avx2_4x24"),
                                            (True, "sgemm_avx2_6x16")])
def test_streaming_b_chooses_by_the_rates_measured_streaming(monkeypatch, streaming, name):
    """Where B's panels stream from L2 (`plan.streams_b`) the kernel is chosen by the
    calibration's rates measured so: on Zen 3 the 4x24 kernel ran 1% faster in cache and
    the 6x16, which loads fewer floats a K step, 1.2-1.4x faster on folded 1x1s."""
    from polyc.graph.decompose import decompose_graph
    from polyc.kernel import build_kernels
    from polyc.targets.cpu import calibrate
    from polyc.targets.cpu.plan import cpu_gemm_view, gemm_microkernel
    measured = {False: {"sgemm_avx2_6x16": 97.7, "sgemm_avx2_4x24": 98.5, "sgemm_vec_6x16": 50.0},
                True: {"sgemm_avx2_6x16": 71.0, "sgemm_avx2_4x24": 52.0, "sgemm_vec_6x16": 40.0}}
    monkeypatch.setattr(calibrate, "rates",
                        lambda target, kernels, streaming=False: measured[streaming])
    graph, _ = _conv((8, 512, 28, 28), (128, 512, 1, 1))
    (kernel,) = build_kernels(decompose_graph(graph), ((graph.nodes[0].name,),))
    view = cpu_gemm_view(kernel)
    target = _features("avx2", "fma")
    assert gemm_microkernel(view, target, streaming=streaming).name == name


@pytest.mark.parametrize("x,w,packed", [((8, 512, 28, 28), (128, 512, 1, 1), True),
                                         ((1, 512, 28, 28), (128, 512, 1, 1), True),
                                         ((1, 64, 56, 56), (256, 64, 1, 1), True),
                                         ((1, 64, 56, 56), (64, 64, 3, 3), False)])
def test_b_streams_when_packed_beside_a_large_c_not_a_window_read_in_place(x, w, packed):
    from polyc.graph.decompose import decompose_graph
    from polyc.kernel import build_kernels
    from polyc.microkernels.analysis import b_rows
    from polyc.targets.cpu.plan import cpu_gemm_view, streams_b

    machine = cpu_machine()
    graph, _ = _conv(x, w, pads=[w[2] // 2] * 4)
    (kernel,) = build_kernels(decompose_graph(graph), ((graph.nodes[0].name,),))
    view = cpu_gemm_view(kernel)
    assert (b_rows(view, kernel) is None) == packed
    # deep K blocks: C over twice L2 (the 8 images folded, on this host); a
    # window's rows read in place overlap in cache
    want = packed and view.M * view.N * 4 > 2 * machine.fusion_level.capacity
    assert streams_b(view, kernel, machine) == want


@pytest.mark.parametrize("sa,sb,epilogue", [((28, 50), (50, 70), _bias_gelu),
                                            ((3, 40, 33), (33, 24), None),
                                            ((8, 9), (9, 100), _bias_gelu)])
def test_four_row_kernel_matches_the_reference(sa, sb, epilogue):
    options = replace(_isa("avx2"), gemm_kernel="sgemm_avx2_4x24")
    graph, inputs = _matmul(sa, sb, epilogue)
    assert "sgemm_avx2_4x24" in _gemm_marks(_check(graph, inputs, options))[0]


def test_conv2d_with_64_output_channels_uses_the_four_row_kernel(monkeypatch):
    options = _isa("avx2")
    # as if both avx2 kernels measured alike: the tile shape decides
    from polyc.targets.cpu import calibrate
    monkeypatch.setattr(calibrate, "rates", lambda target, kernels, streaming=False: {
        m.name: 100.0 for m in kernels})
    b = GraphBuilder("conv")
    graph = b.build([b.conv2d(b.input("x", (1, 8, 11, 13)), b.input("w", (64, 8, 3, 3)),
                              pads=[1, 1, 1, 1])])
    rng = np.random.default_rng(5)
    inputs = {"x": _rand(rng, (1, 8, 11, 13)), "w": _rand(rng, (64, 8, 3, 3))}
    compiled = _check(graph, inputs, options, atol=3e-4)
    assert "sgemm_avx2_4x24" in _gemm_marks(compiled)[0]


def test_a_kernel_is_chosen_by_the_virtual_columns_its_tiles_cover(monkeypatch):
    """A 17x17 output of a 3x3 /2 window read in place spans 305 virtual columns (17 rows
    of 18, the pads between them): 20 tiles of the 6x16 kernel (320 columns), 13 of the
    4x24 (312). By C's own 289 columns the 6x16 would waste less (19 tiles, 304 columns);
    24 channels fit both."""
    options = _isa("avx2")
    from polyc.targets.cpu import calibrate
    monkeypatch.setattr(calibrate, "rates", lambda target, kernels, streaming=False: {
        m.name: 100.0 for m in kernels})
    b = GraphBuilder("conv")
    graph = b.build([b.conv2d(b.input("x", (1, 8, 33, 33)), b.input("w", (24, 8, 3, 3)),
                              pads=[1, 1, 1, 1], strides=[2, 2])])
    rng = np.random.default_rng(6)
    inputs = {"x": _rand(rng, (1, 8, 33, 33)), "w": _rand(rng, (24, 8, 3, 3))}
    compiled = _check(graph, inputs, options, atol=3e-4)
    (mark,) = _gemm_marks(compiled)
    assert "sgemm_avx2_4x24" in mark and "n=289" in mark and "b=rows" in mark, mark
    assert "305 virtual columns for 289" in compiled.c_source


@pytest.mark.parametrize("sa,sb", [((50, 70), (70, 445)), ((2, 1, 13, 21), (3, 21, 417)),
                                   ((4, 9), (9, 430))])
@pytest.mark.parametrize("isa", ISAS)
def test_a_row_major_a_is_packed_by_register_transposes(sa, sb, isa):
    # K contiguous in A: polyc_pack_rows_t transposes 8 K steps of 8 rows at a time (two
    # row groups for 14-row panels); edge panels (50 and 13 rows) are zero-filled, batch
    # dims broadcast, K = 9 and 21 end in a tail. C is wide, over 8 tiles of the widest
    # kernel: a block of A serving a few column tiles is read in place instead
    # (`plan.A_IN_PLACE_TILES`)
    options = _isa(isa)
    graph, inputs = _matmul(sa, sb)
    assert "polyc_pack_rows_t(&" in _check(graph, inputs, options).c_source
    graph, inputs = _matmul(sa[:-2] + sa[:-3:-1], sb, transpose_a=True)  # K outer: no
    assert "polyc_pack_rows_t(&" not in _check(graph, inputs, options).c_source


@pytest.mark.parametrize("kernel", ["sgemm_avx512_14x32", "sgemm_avx512_8x48", "sgemm_avx2_6x16",
                                    "sgemm_avx2_4x24", PORTABLE])
def test_a_b_contiguous_along_k_is_packed_by_register_transposes(kernel):
    # q @ k^T, x @ W^T: B's columns are rows of K contiguous floats, packed into panels as
    # wide as the kernel's tile (16 to 48 columns) by 8 x 8 transposes; the last panel
    # (233 columns) is partial and K = 45 ends in a tail
    mk = registry.by_name(kernel)
    options = replace(_isa(next(i for i, names in registry.ISAS.items() if kernel in names)),
                      gemm_kernel=kernel)
    graph, inputs = _matmul((2, 37, 45), (2, 233, 45), transpose_b=True)
    source = _check(graph, inputs, options).c_source.split("polyc_k0_")[-1]
    assert re.search(rf"polyc_pack_rows_t\([^;]*, {mk.nr}, mk_kc, mk_dst\)", source), source


@pytest.mark.parametrize("n,threads,par", [(16 * 19 + 5, 1, "none"), (16 * 19 + 5, 2, "inner"),
                                           (16 * 9 + 3, 2, "inner")])
def test_b_panels_are_packed_k_row_by_k_row_in_groups(n, threads, par):
    # B's rows contiguous along N: each K row is copied across a group of panels
    # (`pack.GROUP`). 20 panels, the last 3 or 5 columns wide (zero-filled past them),
    # are groups of 8, 8 and 4; a team of two shares 10 panels as two groups of 5. A B
    # of plain loads is packed by support.c's `polyc_pack_cols`, one call a group; an
    # operand with a prologue (relu(w), evaluated while packing) by the unit's own loop
    graph, inputs = _matmul((200, 150), (150, n))
    options = Options(gemm_kernel=PORTABLE, threads=threads, microkernel_tiles=(("nc", 512),))
    compiled = _check(graph, inputs, options)
    assert f"par={par}" in _gemm_marks(compiled)[0]
    assert "mk_g += mk_gs)\n" in compiled.c_source and "polyc_pack_cols(&" in compiled.c_source

    b = GraphBuilder("mm")
    y = b.matmul(b.input("a", (200, 150)), b.relu(b.input("w", (150, n))))
    compiled = _check(b.build([y]), inputs, options)
    assert len(compiled.kernels) == 1 and f"par={par}" in _gemm_marks(compiled)[0]
    assert "mk_g += mk_gs)\n" in compiled.c_source and "polyc_pack_cols(&" not in compiled.c_source


# --- memory safety -------------------------------------------------------------------

def _run_under_asan(compiled, tmp_path) -> subprocess.CompletedProcess:
    """Every kernel of `compiled` run once in an executable built with AddressSanitizer,
    each tensor in a heap block of exactly its size (and polyc's scratch buffers in
    theirs): a read or write one byte past any of them aborts the run."""
    names: dict[str, str] = {}
    body = []
    for k in compiled.program.kernels:
        for a in k.params:
            if a.tensor not in names:
                names[a.tensor] = v = f"t{len(names)}"
                body.append(f"  void *{v} = malloc({a.type.nbytes}); memset({v}, 0x3e, {a.type.nbytes});")
        body.append(f"  {k.name}({', '.join(names[a.tensor] for a in k.params)});")
    (tmp_path / "kernels.c").write_text(compiled.c_source)
    (tmp_path / "main.c").write_text('#include "kernels.c"\n#include <stdlib.h>\n#include <string.h>\n'
                                     "int main(void) {\n" + "\n".join(body) + "\n  return 0;\n}\n")
    flags = [f for f in cpu_toolchain(cpu_machine()).flags if f not in ("-O3", "-shared", "-fPIC")]
    subprocess.run([cc(), *flags, "-O1", "-g", "-fsanitize=address", "-o", str(tmp_path / "main"),
                    str(tmp_path / "main.c"), "-lm"], check=True, capture_output=True)
    return subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0", "OMP_NUM_THREADS": "2"})


@pytest.mark.parametrize("case", ["conv-padded", "conv-1x1", "conv-in-place", "conv-a-once",
                                  "conv-a-const", "linear-b-const", "matmul-edges",
                                  "matmul-edges-portable", "linear-k-blocks", "attention"])
def test_kernels_stay_inside_their_buffers(case, tmp_path, monkeypatch):
    """The last virtual columns of a conv read B's rows whole from the padded copy (room
    is left past its end) or, in place, through a panel; edge tiles and K blocks of a
    matmul, its A read in place (29 columns: `a=rows`), touch no element outside A, B, C
    and the scratch; attention's scores and probabilities stay in their block buffers
    (a last short block, a last tile of v 8 columns wide, causal K steps)."""
    target = "cpu"
    if case == "conv-padded":  # 18 x 20 - 2 = 358 virtual columns: the last tile partial
        graph, _ = _conv((1, 5, 18, 18), (12, 5, 3, 3), bias_relu=True, pads=[1, 1, 1, 1])
        options = Options(microkernel_tiles=(("kc", 20),))
    elif case == "conv-1x1":  # 169 pixels an image packed K row by K row, the last panel partial
        graph, _ = _conv((2, 40, 13, 13), (24, 40, 1, 1), bias_relu=True)
        options = Options(gemm_kernel=PORTABLE, threads=1, microkernel_tiles=(("kc", 24),))
    elif case == "conv-in-place":
        graph, _ = _conv((2, 4, 12, 30), (8, 4, 3, 3))
        options = Options()
    elif case == "conv-a-once":  # A packed whole, its last K and row blocks short
        from polyc.microkernels import analysis
        monkeypatch.setattr(analysis, "SLICED_COPY", 1024)  # B copied image by image
        graph, _ = _conv((3, 5, 14, 15), (14, 5, 3, 3), bias_relu=True, pads=[1, 1, 1, 1])
        options = Options(microkernel_tiles=(("kc", 20), ("mc", 8)))
    elif case == "conv-a-const":  # constant weights packed whole, last blocks short
        graph = _const_conv(2, (14, 5, 3, 3), 0, pads=[1, 1, 1, 1])
        options = Options(microkernel_tiles=(("kc", 20), ("mc", 8)))
    elif case == "linear-b-const":
        b = GraphBuilder("linear_const")
        w = b.constant("w", (37, 45), [(i % 7) * 0.25 for i in range(37 * 45)])
        graph = b.build([b.linear(b.input("x", (2, 19, 37)), w, b.input("b", (45,)))])
        options = Options(microkernel_tiles=(("kc", 16), ("nc", 32)))
    elif case.startswith("matmul-edges"):
        graph, _ = _matmul((13, 37), (37, 29))
        options = Options(microkernel_tiles=(("kc", 8), ("mc", 6), ("nc", 16)),
                          gemm_kernel=PORTABLE if case.endswith("portable") else "")
    elif case == "attention":
        b = GraphBuilder("att")
        q, k, v = b.input("q", (2, 301, 64)), b.input("k", (2, 700, 64)), b.input("v", (2, 700, 40))
        graph = b.build([b.attention(q, k, v, causal=True, out="y")])
        options = Options(threads=2)
        target = _with_l2(1 << 20)  # the rows in several blocks, the last one short
    else:
        graph, _ = _matmul((2, 19, 40), (40, 35), epilogue=lambda b, y, i, r, s: b.relu(y))
        options = Options(microkernel_tiles=(("kc", 16),))
    compiled = compile(graph, target, options=options)
    assert _gemm_marks(compiled)
    if case == "conv-a-once":
        assert marks.parse(_gemm_marks(compiled)[0]).a == "once"
    if case == "conv-1x1":
        assert "loops=pc,b0," in _gemm_marks(compiled)[0] and "mk_rows" not in compiled.c_source
    if case == "attention":
        plan = marks.parse(_gemm_marks(compiled)[0])
        assert plan.then and plan.then_depth == "0" and "ic" in plan.loops, plan
        assert {a.tensor for a in compiled.kernels[0].kernel.arrays if a.block} == {
            "y.scores", "y.exp"}
    if case.endswith("-const"):
        assert getattr(marks.parse(_gemm_marks(compiled)[0]), case.split("-")[1]) == "const"
    if case.startswith("matmul-edges") and registry.by_name(
            marks.parse(_gemm_marks(compiled)[0]).kernel).a_rows_variant:
        assert marks.parse(_gemm_marks(compiled)[0]).a == "rows"
    proc = _run_under_asan(compiled, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("case", ["conv by rows", "conv folded", "matmul K blocks", "attention"])
def test_isl_builds_one_point_of_each_tile_and_the_c_is_the_same(case, monkeypatch):
    """Below a microkernel mark isl sees only a tile's first row at its K block's
    first step (`_tile_points`): the emitter reads the tile off the loops around the
    mark, so the C is the one built from every point."""
    import polyc.targets.cpu as cpu_backend
    b = GraphBuilder(case.replace(" ", "_"))
    if case.startswith("conv"):
        xs, ws = ((1, 16, 30, 30), (32, 16, 3, 3)) if case == "conv by rows" else \
            ((3, 24, 9, 9), (40, 24, 1, 1))
        y = b.conv2d(b.input("x", xs), b.input("w", ws), b.input("b", (ws[0],)),
                     pads=[ws[2] // 2] * 4)
        graph = b.build([b.relu(y)])
    elif case == "matmul K blocks":
        graph = b.build([b.gelu(b.matmul(b.input("a", (50, 70)), b.input("w", (70, 45))))])
    else:
        q, k, v = (b.input(n, [2, 96, 32]) for n in "qkv")
        graph = b.build([b.op("attention", q, k, v)])
    options = Options(threads=2, gemm_kernel=PORTABLE, microkernel_tiles=(("kc", 24),))
    filtered = compile(graph, "cpu", options=options, build=False)
    texts = [str(cpu_backend.without_tile_statements(k.schedule, k.kernel, k.marks(marks.Gemm)))
             for k in filtered.kernels if k.marks(marks.Gemm)]
    assert texts and all(f"mod {registry.by_name(PORTABLE).mr} = 0" in t for t in texts)
    monkeypatch.setattr(cpu_backend, "_tile_points", lambda schedule, views: schedule)
    assert compile(graph, "cpu", options=options, build=False).c_source == filtered.c_source


def test_isl_generates_no_loops_for_the_statements_a_gemm_tile_applies():
    """The init and epilogue statements of a gemm mark are applied by the tile's
    write-back: isl's AST is built without them, the contraction, a row tail (the
    softmax of attention's scores) and the tail's contraction (times v) stay."""
    from polyc.schedule_tree.tree import schedule_to_text
    from polyc.targets.cpu import without_tile_statements
    from polyc.targets.cpu.plan import plan_view

    b = GraphBuilder("att")
    q, k, v = (b.input(n, [2, 96, 32]) for n in "qkv")
    graph = b.build([b.op("attention", q, k, v)])
    result = compile(graph, "cpu", options=Options(threads=1), build=False)
    tails = gemms = 0
    for r in result.kernels:
        found = re.search(r'mark: "(gemm [^"]*)"', schedule_to_text(r.schedule))
        if found is None:
            continue
        view = plan_view(r.kernel, marks.parse(found.group(1)))
        names: list[str] = []
        without_tile_statements(r.schedule, r.kernel, r.marks(marks.Gemm)).get_domain().foreach_set(
            lambda s: names.append(s.get_tuple_name()))
        assert set(names) == {view.stmt.name, view.then.stmt.name} | {t.name for t in view.tail}
        assert view.init.name not in names and view.then.init.name not in names
        gemms += 1
        tails += bool(view.tail)
    assert gemms == 1 and tails == 1  # one kernel: scores, their softmax, the product with v


@pytest.mark.parametrize("size,chunk", [(14, 1), (56, 4)])
def test_a_team_gets_column_tiles_in_chunks_that_leave_no_thread_idle(size, chunk):
    # a 14x14 image has 14 column tiles of 16 (of 24: 10): chunks of 4 left a thread of
    # two idle a third of the time
    channels = 256 if size == 14 else 32  # enough work for a team
    graph, inputs = _conv((1, channels, size, size), (64, channels, 3, 3), pads=[1, 1, 1, 1])
    # avx2's 16-wide tiles where the target builds them (POLYC_CPU_ARCH=x86-64 has none)
    compiled = _check(graph, inputs, Options(threads=2, microkernel_isa="avx2")
                      if "avx2" in _target_isas() else Options(threads=2), atol=3e-4)
    (plan,) = _gemm_marks(compiled)
    if "par=inner" not in plan or "b=rows" not in plan:
        pytest.skip(f"this host's plan shares no virtual column tiles: {plan}")
    assert f"omp for schedule(dynamic, {chunk})" in compiled.c_source


def test_a_team_shares_row_tiles_with_the_column_tiles():
    """13 column tiles of 16 for two threads: by column tiles alone one thread took 7;
    the row tiles below are shared with them (the pair collapsed), the last row tile
    short and the bias and relu written back where a thread's half ends mid-column."""
    def bias_relu(b, y, inputs, rng, shape):
        inputs["bias"] = _rand(rng, shape[-1:])
        return b.relu(b.add(y, b.input("bias", shape[-1:])))
    graph, inputs = _matmul((200, 128), (128, 208), epilogue=bias_relu)
    compiled = _check(graph, inputs, Options(threads=2, gemm_kernel=PORTABLE))
    (plan,) = _gemm_marks(compiled)
    assert marks.parse(plan).par == "inner" and marks.parse(plan).loops == ("jr", "ir"), plan
    assert "omp for collapse(2) schedule(static)" in compiled.c_source


def test_only_loops_with_bounds_apart_collapse():
    def ast(domain):
        build = isl.AstBuild.alloc(isl.DEFAULT_CONTEXT)
        return build.node_from_schedule(isl.Schedule.from_domain(isl.UnionSet(domain))
                                        .insert_partial_schedule(isl.MultiUnionPwAff(
                                            "[{ S[i, j] -> [(i)] }, { S[i, j] -> [(j)] }]")))
    assert _rectangular_pair(ast("{ S[i, j] : 0 <= i < 10 and 3 <= j < 20 }"))
    assert not _rectangular_pair(ast("{ S[i, j] : 0 <= i < 10 and i <= j < 20 }"))
    assert not _rectangular_pair(ast("{ S[i, 0] : 0 <= i < 10 }"))  # one loop


def test_four_column_tiles_a_thread_are_too_few_to_share():
    """An 11x11 image, B packed: 121 columns, 8 tiles of 16 for two threads. Zen 3's
    conv4 256x28x28 /2 (9 tiles of 24) ran 3-7% faster by row blocks."""
    graph, inputs = _conv((1, 64, 11, 11), (64, 64, 3, 3), bias_relu=True, pads=[1] * 4)
    compiled = _check(graph, inputs, Options(threads=2, gemm_kernel=PORTABLE), atol=3e-4)
    (plan,) = _gemm_marks(compiled)
    assert marks.parse(plan).par == "rows", plan


@pytest.mark.parametrize("xs,ws,kc", [((1, 256, 7, 7), (96, 256, 3, 3), 0),  # B in place
                                      ((1, 256, 7, 7), (90, 256, 3, 3), 200),  # K blocks
                                      ((1, 512, 7, 7), (100, 512, 1, 1), 0)])  # B packed
def test_a_team_splits_the_row_blocks_when_few_column_tiles(xs, ws, kc):
    """Each thread takes whole row blocks; a packed B, which each reads whole, is
    packed by the team into one buffer (the packing's own `omp for` before the rows'),
    a copy of a window by one thread."""
    graph, inputs = _conv(xs, ws, bias_relu=True, pads=[ws[2] // 2] * 4)
    options = _packing(Options(threads=2, microkernel_tiles=(("kc", kc),) if kc else ()))
    compiled = _check(graph, inputs, options, atol=3e-4)
    (plan,) = _gemm_marks(compiled)
    mark = marks.parse(plan)
    assert mark.par == "rows", plan
    assert "ic" in mark.loops and -(-mark.m // mark.mc) >= 4  # about four blocks a thread
    src = compiled.c_source
    assert "omp for schedule(dynamic, 1)" in src
    region = src[src.index("#pragma omp parallel"):]
    shared = region.index("omp for schedule(static)") if mark.b == "packed" else -1
    assert (0 < shared < region.index("omp for schedule(dynamic, 1)")) == (mark.b == "packed")
    assert "polyc_scratch(0," not in region  # B's panels: the team's buffer, made before
