"""The backend registry and what the redesign promises: targets found by name, fixed
machine descriptions instead of the host, typed marks, promotions computed with isl, and
kernel states whose trees are named by the pass that made them."""
from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc import GraphBuilder, GraphError, targets
from polyc.graph.reference import run_reference
from polyc.microkernels import registry
from polyc.schedule_tree import marks
from polyc.schedule_tree.promotion import box, footprint
from polyc.targets.cpu import CpuOptions, cpu_machine, host_can_run
from polyc.targets.cpu import machine as cpu_machine_module

# one fixed machine per x86-64 feature level: what a test assumes, not what the host has
FEATURE_LEVELS = {"avx512": "x86-64-v4", "avx2": "x86-64-v3", "portable": "x86-64"}


@pytest.fixture(params=sorted(FEATURE_LEVELS))
def machine(request):
    """The cpu target built for one feature level (compiled for whatever the host is)."""
    return cpu_machine(FEATURE_LEVELS[request.param])


def _matmul(m=96, k=80, n=112):
    b = GraphBuilder("mm")
    return b.build([b.gelu(b.matmul(b.input("a", [m, k]), b.input("w", [k, n])))])


def test_targets_are_found_by_name_and_unknown_ones_are_refused():
    assert "cpu" in targets.names()
    assert targets.backend("cpu").options_type is CpuOptions
    with pytest.raises(GraphError, match="unknown target 'tpu'"):
        polyc.compile(_matmul(), "tpu", build=False)


def test_the_machine_description_decides_the_kernels(machine):
    compiled = polyc.compile(_matmul(), machine, build=False)
    (used,) = compiled.kernels[0].microkernels
    mk = registry.by_name(used)
    assert set(mk.features) <= machine.features
    assert f"-march={machine.arch}" in targets.backend("cpu").toolchain(machine).flags
    if "avx512f" not in machine.features:
        assert "avx512" not in compiled.c_source


def test_code_for_a_fixed_machine_runs_where_the_host_can(machine):
    if not host_can_run(machine.arch):
        pytest.skip(f"this host cannot run -march={machine.arch} code")
    graph = _matmul(50, 37, 29)
    compiled = polyc.compile(graph, machine)
    rng = np.random.default_rng(1)
    inputs = {"a": rng.standard_normal((50, 37)).astype(np.float32),
              "w": rng.standard_normal((37, 29)).astype(np.float32)}
    want = run_reference(graph, inputs)
    for name, value in compiled(**inputs).items():
        np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-4)


def test_a_kernel_leaves_the_x87_unit_as_it_found_it():
    """gcc 12 moved a float reduction's vector halves through an MMX register on SSE4
    without AVX and left the x87 registers, which MMX shares, marked in use: the
    caller's next long double was a NaN (numpy's longdouble, the int64 to float16 cast
    of a later kernel)."""
    machine = cpu_machine("x86-64-v2")
    if not host_can_run(machine.arch):
        pytest.skip(f"this host cannot run -march={machine.arch} code")
    b = GraphBuilder("row_max")
    graph = b.build([b.reduce_max(b.input("a", (3, 7, 5)), axes=[-1], keepdims=True)])
    a = np.arange(105, dtype=np.float32).reshape(3, 7, 5)
    (got,) = polyc.compile(graph, machine)(a=a).values()
    assert np.longdouble(5) * np.longdouble(3) == 15  # NaN after the kernel, before
    np.testing.assert_array_equal(got, a.max(-1, keepdims=True))


def test_extensions_only_intrinsics_emit_do_not_keep_a_host_from_running_an_arch(monkeypatch):
    """-march=haswell turns on hle and skylake-avx512 sgx and pku, which AMD hosts lack
    and gcc emits only through their intrinsics: such a host runs their code (it had
    counted as unable: no calibration, no tuning). avx512fp16, which gcc emits for
    _Float16's arithmetic, still counts."""
    features = {"native": {"avx2", "fma"}, "intel-avx2": {"avx2", "fma", "hle", "sgx", "pku"},
                "fp16": {"avx2", "fma", "avx512fp16"}}
    host_can_run.cache_clear()
    try:
        with monkeypatch.context() as m:
            m.setattr(cpu_machine_module, "arch_features", lambda a: frozenset(features[a]))
            assert host_can_run("intel-avx2") and not host_can_run("fp16")
    finally:
        host_can_run.cache_clear()
    # what it admits runs: haswell's code, here on any AVX2 host, Intel's or AMD's
    if not host_can_run("haswell"):
        pytest.skip("this host cannot run -march=haswell code")
    graph = _matmul(20, 17, 33)
    inputs = {"a": np.ones((20, 17), np.float32), "w": np.full((17, 33), 0.5, np.float32)}
    (got,) = polyc.compile(graph, cpu_machine("haswell"))(**inputs).values()
    (want,) = run_reference(graph, inputs).values()
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_options_of_another_target_must_be_defaults_where_this_one_lacks_them():
    backend = targets.backend("cpu")
    assert backend.options({"threads": 2}).threads == 2
    with pytest.raises(GraphError) as e:
        backend.options({"no_such_option": 1})
    assert e.value.problems[0].field == "options.no_such_option"
    assert "target 'cpu'" in str(e.value)
    common = polyc.options.Options(parallel=False)
    assert backend.options(common) == CpuOptions(parallel=False)


def test_every_mark_prints_and_parses_back():
    for mark in [marks.Parallel(), marks.Parallel(threads=4), marks.Partials(("t1_s", "t2_m")),
                 marks.Simd(), marks.Reduce(), marks.Stream(), marks.ColumnBlock(512),
                 marks.Microkernel("sgemm_avx2_6x16", "S0"), marks.PackA("S0"),
                 marks.PackB("S0"), marks.TeamFor("S0"), marks.BRows("S0"),
                 marks.Gemm("S0", "sgemm_avx2_6x16", 1, 2, 3, 4, 5, 6, "inner", 2,
                            ("pc", "ic"), "rows")]:
        assert marks.parse(str(mark)) == mark, str(mark)
    with pytest.raises(ValueError, match="unknown schedule-tree mark"):
        marks.parse("no_such_mark S0")


def test_the_trees_are_named_by_the_pass_that_made_them():
    compiled = polyc.compile(_matmul(), build=False)
    (k,) = compiled.kernels
    names = [name for name, _ in k.trees]
    assert names[0] == "schedule" and names[-1] == "lower-cpu" and "microkernels" in names
    assert k.trees[-1][1].plain_is_equal(k.schedule)
    assert list(k.to_json()["trees"]) == names


def test_a_footprint_and_its_box_are_computed_with_isl():
    # a 2-D loop tiled by 16 x 32 over x[i, j + 1]: each tile reads a 16 x 32 box shifted
    # by one column; the last tiles are clipped by the domain
    ctx = isl.Context()
    domain = isl.UnionSet.read_from_str(ctx, "{ S[i, j] : 0 <= i < 40 and 0 <= j < 100 }")
    sched = isl.Schedule.from_domain(domain)
    band = isl.MultiUnionPwAff.read_from_str(
        ctx, "[{ S[i, j] -> [(16*floor(i/16))] }, { S[i, j] -> [(32*floor(j/32))] }]")
    node = sched.get_root().child(0).insert_partial_schedule(band).child(0)
    access = isl.UnionMap.read_from_str(ctx, "{ S[i, j] -> x[i, j + 1] }")
    fp = footprint(node, access)
    lo, extents = box(fp)
    assert extents == (16, 32)
    at = isl.Set.read_from_str(ctx, "{ [32, 96] }")
    assert lo[0].intersect_domain(at).max_val().to_python() == 32
    assert lo[1].intersect_domain(at).max_val().to_python() == 97
    # the last tile along j holds 4 columns: j + 1 in [97, 100]
    assert fp.intersect_domain(at).range().count_val().to_python() == 8 * 4


def test_the_cpu_packs_the_blocks_its_promotions_size():
    # nc 48, 3 column tiles: A would be read in place, not packed (`plan.A_IN_PLACE_TILES`)
    compiled = polyc.compile(_matmul(130, 70, 190), build=False, options=polyc.Options(
        gemm_kernel="sgemm_vec_6x16", microkernel_tiles=(("kc", 32), ("mc", 60), ("nc", 160))))
    lines = [x for x in compiled.kernels[0].fusion_report if x.startswith("promote ")]
    assert lines == [
        "promote S0.a -> mk_pa [L2, in, panels 6 0] 10x32x6 (7680 B) at "
        "(i2 - (i2) mod 60, i1 - (i1) mod 32)",
        "promote S0.b -> mk_pb [L3, in, panels 16 1] 10x32x16 (20480 B) at "
        "(i1 - (i1) mod 32, i0 - (i0) mod 160)"]
    assert "polyc_scratch(1, 7680)" in compiled.c_source
    assert "polyc_scratch(0, 20480)" in compiled.c_source


def test_an_a_read_in_place_has_no_packed_block():
    compiled = polyc.compile(_matmul(130, 70, 90), build=False, options=polyc.Options(
        gemm_kernel="sgemm_vec_6x16", microkernel_tiles=(("kc", 32), ("mc", 60), ("nc", 48))))
    lines = [x for x in compiled.kernels[0].fusion_report if x.startswith("promote ")]
    assert [x.split(" -> ")[0] for x in lines] == ["promote S0.b"]
    assert "polyc_scratch(1," not in compiled.c_source
    assert " a=rows" in compiled.kernels[0].to_json()["schedule_text"]


def test_a_null_option_takes_the_targets_default():
    # the service's schema shows `cores` as nullable (its default differs by target)
    from polyc.targets import backend
    assert backend("manycore").options({"cores": None}).cores == 64
    assert backend("npu").options({"cores": None}).cores == 1
