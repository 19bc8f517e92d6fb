"""Budgets with graceful fallback: each budgeted stage, forced to run out with a tiny
budget, takes its cheaper answer, says so in the report, and the result still matches
the reference executor."""
from __future__ import annotations

import time

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.budget import Ledger
from polyc.compiler import compile
from polyc.errors import GraphError
from polyc.graph.reference import run_reference
from polyc.options import Options


def _check(graph, compiled, rng=np.random.default_rng(0)):
    inputs = {t.name: rng.standard_normal(t.type.shape).astype(np.float32) for t in graph.inputs}
    got, want = compiled(**inputs), run_reference(graph, inputs)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-4)


def _linear_softmax():
    # a matmul (isl's scheduler, microkernel), a softmax (fused groups) and a transpose
    # (a permutable band the tiling searches sizes for)
    b = GraphBuilder("budgets")
    x, w = b.input("x", [128, 96]), b.input("w", [96, 256])
    h = b.matmul(x, w, out="h")
    return b.build([b.op("softmax", h, axis=-1, out="y"),
                    b.op("transpose", b.exp(h, out="e"), perm=[1, 0], out="t")])


def _stages(compiled) -> set[str]:
    return {line.split(" ", 1)[0] for line in compiled.fallbacks}


def test_default_budgets_take_no_fallback():
    graph = _linear_softmax()
    compiled = compile(graph)
    assert compiled.fallbacks == ()
    _check(graph, compiled)


def test_an_isl_operation_budget_of_one_falls_back_in_every_stage():
    graph = _linear_softmax()
    compiled = compile(graph, options={"max_operations": 1})
    assert _stages(compiled) == {"fusion", "schedule", "tile"}
    # each line names what ran out, and sits in the report of its kernel
    reports = [line for k in compiled.kernels for line in k.fusion_report]
    for line in compiled.fallbacks:
        assert "options.max_operations (1)" in line
        assert line in reports
    # every proposal isl had to answer was refused: more kernels than with the default
    assert len(compiled.kernels) > len(compile(graph, build=False).kernels)
    _check(graph, compiled)


def test_a_fusion_budget_of_zero_seconds_leaves_every_node_its_own_kernel():
    graph = _linear_softmax()
    compiled = compile(graph, options={"fuse_seconds": 0})
    (line,) = compiled.fallbacks
    assert line.startswith("fusion fallback: the fuse budget of 0 s (options.fuse_seconds) "
                           "is spent after 0 proposals")
    assert len(compiled.kernels) == len(compiled.primitive.nodes)
    assert all(line in k.fusion_report for k in compiled.kernels)
    _check(graph, compiled)


def test_the_kernel_calibration_is_no_part_of_the_fusion_budget(monkeypatch):
    """A new machine's first compile measures its gemm kernels (`calibrate.rates`) from
    inside the fusion stage: work done once per machine (`budget.once`), which no
    stage's budget pays for. Here it takes 3 s against a budget of 2."""
    from polyc.targets.cpu import calibrate
    calls = []

    def slow(machine, kernels):
        calls.append(len(kernels))
        time.sleep(3.0)  # a slow host building and timing every kernel
        return measure(machine, kernels)
    measure = calibrate.measure
    monkeypatch.setattr(calibrate, "_seen", {})
    monkeypatch.setattr(calibrate, "read_cache_json", lambda name: {})
    monkeypatch.setattr(calibrate, "write_cache_json", lambda name, data: None)
    monkeypatch.setattr(calibrate, "measure", slow)
    graph = _linear_softmax()
    compiled = compile(graph, options={"fuse_seconds": 2})
    assert calls and compiled.fallbacks == ()
    assert len(compiled.kernels) < len(compiled.primitive.nodes)
    _check(graph, compiled)


def test_a_scheduling_budget_of_zero_seconds_keeps_the_original_order():
    # without the softmax, which would take the transpose in as an independent part
    b = GraphBuilder("budgets")
    h = b.matmul(b.input("x", [128, 96]), b.input("w", [96, 256]), out="h")
    graph = b.build([b.op("transpose", b.exp(h, out="e"), perm=[1, 0], out="t")])
    compiled = compile(graph, options={"schedule_seconds": 0})
    assert _stages(compiled) == {"schedule"}
    single = [k for k in compiled.kernels if len(k.kernel.nodes) == 1]
    assert single and all(any("original order" in line for line in k.fusion_report)
                          for k in single)
    # the fallback's bands still carry the flags: the matmul keeps its microkernel
    assert any(k.microkernels for k in compiled.kernels)
    _check(graph, compiled)


def test_a_tiling_budget_of_zero_seconds_uses_default_tiles():
    b = GraphBuilder("t")
    x = b.input("x", [300, 256])
    graph = b.build([b.op("transpose", b.exp(x), perm=[1, 0], out="y")])
    fitted = compile(graph, build=False).kernels[-1].schedule
    compiled = compile(graph, options={"tile_seconds": 0})
    assert len(compiled.fallbacks) == len(compiled.kernels)  # one line per kernel
    for line, kernel in zip(compiled.fallbacks, compiled.kernels):
        assert line.startswith(f"tile fallback: kernel {kernel.name}: the tile budget of 0 s")
        assert "default tile sizes (32 per loop, 64 innermost)" in line
    text = str(compiled.kernels[-1].schedule)  # the transpose's, tiled 32 x 64
    assert "mod 32" in text and "mod 64" in text and text != str(fitted)
    _check(graph, compiled)


def test_budgets_are_options_in_the_cache_key():
    assert Options(fuse_seconds=5).to_json() != Options().to_json()
    assert Options(fuse_seconds=5).to_json() == Options(fuse_seconds=5.0).to_json()
    with pytest.raises(GraphError, match="options.tile_seconds.*must be 0 to"):
        Options(tile_seconds=-1)


def test_a_ledger_counts_a_stage_across_kernels_and_records_a_fallback_once():
    ledger = Ledger({"fuse": 1.0, "schedule": 0.0, "tile": 1.0})
    assert ledger.exhausted("schedule") and not ledger.exhausted("fuse")
    with ledger.timing("fuse"):
        pass
    assert 0 <= ledger.spent["fuse"] < 1.0
    ledger.fell_back("tile fallback: x")
    ledger.fell_back("tile fallback: x")
    assert ledger.fallbacks == ["tile fallback: x"]


def test_each_probe_of_a_symbolic_compile_has_budgets_of_its_own(monkeypatch):
    """A symbolic compile runs the static pipeline at several sizes (its probes): each
    starts with nothing spent, so one budget is not shared out over all of them, and
    their fallbacks are the compile's."""
    import polyc.compiler as compiler
    static, seen = compiler.compile_graph, []

    def probe(graph, backend, machine, options, trace, *args, **kw):
        seen.append((dict(trace.ledger.spent), trace.ledger.fallbacks))
        return static(graph, backend, machine, options, trace, *args, **kw)

    monkeypatch.setattr(compiler, "compile_graph", probe)
    compiled = compile({"name": "sym", "inputs": [{"name": "x", "shape": ["N", 16]}],
                        "nodes": [{"op": "softmax", "inputs": ["x"], "outputs": ["y"]}],
                        "outputs": ["y"], "symbols": {"N": {"min": 1, "max": 64}}})
    assert len(seen) >= 3
    assert all(spent == {} for spent, _ in seen)
    assert all(fallbacks is compiled.trace.ledger.fallbacks for _, fallbacks in seen)


def test_a_probe_ledger_spends_apart_and_records_together():
    main = Ledger({"fuse": 1.0, "schedule": 1.0, "tile": 1.0}, spent={"fuse": 1.0})
    probe = main.for_probe()
    assert main.exhausted("fuse") and not probe.exhausted("fuse")
    probe.fallbacks.append("fusion fallback: ...")
    assert main.fallbacks == ["fusion fallback: ..."]
