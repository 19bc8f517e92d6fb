"""Size regimes of a symbolic compile: each decided at probes inside it, a version of a
kernel where the decisions differ, chosen per call on conditions isl writes.

Which regimes differ depends on the host (its calibrated gemm kernels, its caches), so
the tests check what holds on any host: every regime is accounted for in the report,
the C chooses among exactly the versions the trees show, on their ranges, and every
size, at the edges of the regimes above all, matches the reference executor.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import polyc
from polyc.graph.load import load_graph
from polyc.graph.reference import random_inputs, run_reference
from polyc.microkernels import registry
from polyc.symbolic import _conditions, size_regimes
from polyc.targets.cpu import cpu_machine, host_can_run
from polyc.targets.cpu.options import CpuOptions

LINEAR_GELU = {"name": "lg", "inputs": [{"name": "x", "shape": ["N", 128]},
                                        {"name": "w", "shape": [128, 256]},
                                        {"name": "b", "shape": [256]}],
               "nodes": [{"op": "linear", "inputs": ["x", "w", "b"], "outputs": ["h"]},
                         {"op": "gelu", "inputs": ["h"], "outputs": ["y"],
                          "attrs": {"approximate": "tanh"}}],
               "outputs": ["y"], "symbols": {"N": {"min": 1, "max": 2048}}}


def test_regimes_cut_at_16_and_512_largest_first_each_after_its_parent():
    assert size_regimes({"N": (1, 8192)}) == [({"N": (512, 8192)}, None),
                                              ({"N": (16, 511)}, 0), ({"N": (1, 15)}, 1)]
    assert size_regimes({"N": (20, 100)}) == [({"N": (20, 100)}, None)]
    # a piece of fewer than three values is not cut off: the probes could not fit it
    assert size_regimes({"N": (2, 16)}) == [({"N": (2, 16)}, None)]
    assert size_regimes({"N": (14, 600)}) == [({"N": (512, 600)}, None), ({"N": (14, 511)}, 0)]
    # two symbols: cut at 512 only; the boxes, each after the box one step larger in its
    # first symbol not at its largest
    assert size_regimes({"B": (1, 1024), "L": (1, 4096)}) == [
        ({"B": (512, 1024), "L": (512, 4096)}, None), ({"B": (512, 1024), "L": (1, 511)}, 0),
        ({"B": (1, 511), "L": (512, 4096)}, 0), ({"B": (1, 511), "L": (1, 511)}, 1)]
    # three: not cut (8 boxes, each up to five compiles)
    assert size_regimes({"A": (1, 99), "B": (1, 99), "C": (1, 99)}) == [
        ({"A": (1, 99), "B": (1, 99), "C": (1, 99)}, None)]


def test_conditions_are_isl_s_knowing_the_earlier_ones_failed():
    boxes = [({"N": (512, 8192)},), ({"N": (16, 511)},), ({"N": (1, 15)},)]
    got = _conditions(boxes, ["k_v0", "k_v1", "k_v2"])
    # the last holds whenever the others failed: isl writes it as true
    assert got == [("polyc_sym_N >= 512", "k_v0"), ("polyc_sym_N >= 16", "k_v1"),
                   ("1", "k_v2")]
    # a version of two boxes (one joined the other's), and the rest
    two = [({"B": (16, 64), "L": (512, 4096)}, {"B": (1, 15), "L": (512, 4096)}),
           ({"B": (1, 64), "L": (1, 511)},)]
    got = _conditions(two, ["k_v0", "k_v1"])
    assert got == [("polyc_sym_L >= 512", "k_v0"), ("1", "k_v1")]


@pytest.fixture(scope="module")
def linear_gelu():
    return polyc.compile(LINEAR_GELU)


def _versions(kernel) -> list[tuple[int, int]]:
    """The ranges of a kernel's versions, from its trees' names."""
    return [tuple(map(int, m.groups())) for name, _ in kernel.trees
            if (m := re.fullmatch(r"symbolic N in \[(\d+), (\d+)\]", name))]


def test_every_regime_is_a_version_or_says_why_not(linear_gelu):
    (kernel,) = linear_gelu.kernels
    report = "\n".join(kernel.fusion_report)
    versions = _versions(kernel)
    for lo, hi in [(512, 2048), (16, 511), (1, 15)]:
        own = any(v[0] <= lo and hi <= v[1] for v in versions)
        merged = f"N in [{lo}, {hi}]: this version too, since " in report
        assert own or merged or lo == 512, (lo, hi, report)
    if versions:  # several: each proved for its range, the ranges cover [1, 2048]
        assert sorted(versions)[0][0] == 1 and max(v[1] for v in versions) == 2048
        for i, (lo, hi) in enumerate(versions):
            assert f"version {i} for N in [{lo}, {hi}]: decided at N=" in report
    else:
        assert "schedule proved legal by isl for N in [1, 2048]" in report


def test_the_kernel_chooses_among_its_versions_in_c(linear_gelu):
    (kernel,) = linear_gelu.kernels
    versions = _versions(kernel)
    src = linear_gelu.c_source
    name = kernel.name
    if not versions:
        assert f"{name}_v0" not in src
        return
    for i in range(len(versions)):
        assert re.search(rf"\bvoid {name}_v{i}\(", src)
    dispatch = src[src.index(f"void {name}("):]
    dispatch = dispatch[:dispatch.index("}\n") + 2]
    calls = re.findall(rf"\b{name}_v(\d+)\(", dispatch)
    assert [int(c) for c in calls] == list(range(len(versions)))
    assert dispatch.count("if (") == len(versions) - 1


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 64, 300, 511, 512, 513, 1009, 2048])
def test_every_size_matches_the_reference(linear_gelu, n):
    graph = load_graph(LINEAR_GELU)
    inputs = random_inputs(graph, seed=n, symbols={"N": n})
    got, want = linear_gelu(**inputs), run_reference(graph, inputs)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4)


def test_a_softmax_decides_alike_everywhere_and_stays_one_function():
    # rows of 4096: even 13 of them are work enough for the threads (fewer columns and
    # the fewest rows run on one thread: a version without the parallel loop)
    doc = {"name": "sm", "inputs": [{"name": "x", "shape": ["N", 4096]}],
           "nodes": [{"op": "softmax", "inputs": ["x"], "outputs": ["y"]}],
           "outputs": ["y"], "symbols": {"N": {"min": 1, "max": 1024}}}
    compiled = polyc.compile(doc)
    (kernel,) = compiled.kernels
    report = "\n".join(kernel.fusion_report)
    assert "N in [16, 511]: this version too, since its first probe decides the same" in report
    assert "N in [1, 15]: this version too" in report
    assert f"{kernel.name}_v0" not in compiled.c_source
    graph = load_graph(doc)
    for n in (1, 15, 16, 700):
        inputs = random_inputs(graph, seed=n, symbols={"N": n})
        np.testing.assert_allclose(compiled(**inputs)["y"], run_reference(graph, inputs)["y"],
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kernel", ["", "sgemm_avx512_8x48", "sgemm_avx512_14x32"])
def test_a_range_of_only_a_few_rows_compiles_once(kernel):
    # probes 13, 11 and 7: the unbalanced row block was the largest tile * 2^k within
    # each (12, 6, 6 on a 6-row kernel), the probes disagreed and the compile was
    # refused; a block is now at least four tiles, one for every size in the range.
    # Its row-tile loop stays where the rows fill one tile: 7 rows on an 8-row kernel
    # had none, 13 and 11 had one; on a 14-row kernel no probe had one, yet N reaches 15
    if kernel and not set(registry.by_name(kernel).features) <= cpu_machine().features:
        pytest.skip(f"-march={cpu_machine().arch} does not build {kernel}")
    if not host_can_run(cpu_machine().arch):
        pytest.skip(f"this host cannot run -march={cpu_machine().arch} code")
    doc = {"name": "few", "inputs": [{"name": "x", "shape": ["N", 64]},
                                     {"name": "w", "shape": [64, 64]}],
           "nodes": [{"op": "matmul", "inputs": ["x", "w"], "outputs": ["y"]}],
           "outputs": ["y"], "symbols": {"N": {"min": 2, "max": 15}}}
    compiled = polyc.compile(doc, options=CpuOptions(gemm_kernel=kernel))
    (k,) = compiled.kernels
    assert "m=polyc_sym_N" in k.to_json()["schedule_text"]
    assert kernel in k.to_json()["schedule_text"]
    graph = load_graph(doc)
    for n in range(2, 16):
        inputs = random_inputs(graph, seed=n, symbols={"N": n})
        np.testing.assert_allclose(compiled(**inputs)["y"], run_reference(graph, inputs)["y"],
                                   rtol=1e-4, atol=1e-4)
