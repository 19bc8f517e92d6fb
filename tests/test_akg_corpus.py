"""The AKG corpus as conformance (benchmarks/akg_corpus.py), on the sample vendored in
tests/data/akg (Apache-2.0, see its LICENSE and NOTICE) and, when `POLYC_AKG_CORPUS`
names the whole corpus, on a spread sample of it."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "data" / "akg"
_spec = importlib.util.spec_from_file_location(
    "akg_corpus", HERE.parent / "benchmarks" / "akg_corpus.py")
akg_corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(akg_corpus)

# The vendored files polyc refuses, and why (every other one must match).
REFUSED = {
    "Fused_Custom_add_parallel_1.info": "Custom is not supported",
    "complex_add.info": "data_type 'complex64' is not supported",
}


FILES = akg_corpus.corpus_files(SAMPLE)


def test_the_sample_is_vendored():
    assert len(FILES) >= 30
    assert set(REFUSED) <= {f.name for f in FILES}


# one test per file, so that the sample (half a minute a target) spreads over the test
# processes; on the simulated chips too (AKG's graphs come from an Ascend NPU: the NZ
# MatMul, whose operands' transposes no scratchpad tile held, was refused there)
@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "manycore", "npu"])
@pytest.mark.parametrize("path", FILES, ids=lambda f: str(f.relative_to(SAMPLE)))
def test_vendored_file_matches_or_is_refused_for_its_reason(path, target):
    r = akg_corpus.check_file(path, target=target)
    if path.name in REFUSED:
        assert r["verdict"] == "refused" and REFUSED[path.name] in r["reason"], r
    else:
        assert r["verdict"] == "match", r


def test_report_counts_the_verdicts_compile_times_and_kernels():
    refused = next(f for f in FILES if f.name in REFUSED)
    matched = [f for f in FILES if f.name not in REFUSED][:2]
    table = akg_corpus.report([akg_corpus.check_file(f) for f in (refused, *matched)], SAMPLE)
    assert f"match     {2:5}" in table and f"refused   {1:5}" in table
    assert "fusion: " in table and "compile time p50" in table


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("POLYC_AKG_CORPUS"),
                    reason="set POLYC_AKG_CORPUS to the corpus folder to check a sample of it")
def test_corpus_sample_from_environment():
    corpus = Path(os.environ["POLYC_AKG_CORPUS"])
    results = []
    akg_corpus.run_files(akg_corpus.sample(akg_corpus.corpus_files(corpus), 24), timeout=120,
                         jobs=1, run_limit_mib=256, on_result=results.append)
    bad = [r for r in results if r["verdict"] in ("wrong", "crashed", "timeout")]
    assert not bad, bad


def test_without_a_corpus_the_script_says_so(capsys, monkeypatch):
    monkeypatch.delenv("POLYC_AKG_CORPUS", raising=False)
    assert akg_corpus.main([]) == 0
    assert "no corpus" in capsys.readouterr().out


def test_the_worker_survives_a_file_that_kills_it(tmp_path, monkeypatch):
    """A file whose check kills the process is 'crashed' and the next gets a new worker."""
    monkeypatch.setattr(akg_corpus, "check_file", lambda path, **kw: (
        os._exit(3) if path.name == "die.info" else {"file": str(path), "verdict": "match"}))
    files = [tmp_path / "die.info", tmp_path / "ok.info"]
    results = []
    akg_corpus.run_files(files, timeout=30, jobs=1, run_limit_mib=1, on_result=results.append)
    assert [r["verdict"] for r in results] == ["crashed", "match"]
    assert "exit code 3" in results[0]["reason"]


def test_compare_tolerances():
    import numpy as np
    ref = np.array([1.0, 2.0, np.nan], np.float32)
    assert akg_corpus.compare(ref.copy(), ref) is None
    assert akg_corpus.compare(ref * np.float32(1 + 1e-6), ref) is None
    assert akg_corpus.compare(ref * np.float32(1.01), ref) > 1
    h = np.array([1.0, 1000.0], np.float16)
    assert akg_corpus.compare(h + np.float16(0.0005), h) is None
    assert akg_corpus.compare(np.array([True]), np.array([False])) == float("inf")


def test_an_ill_conditioned_output_is_judged_against_float64():
    # y = (x + 1e4) - 1e4 loses x's low bits in float32, whatever the order: an answer no
    # further from the float64 value than the reference is no wrong answer; noise is
    import numpy as np

    import polyc
    from polyc.graph.reference import run_reference
    b = polyc.GraphBuilder("cancel")
    x, big = b.input("x", [64]), b.constant("big", [1], [1e4])
    graph = b.build([b.sub(b.add(x, big), big)])
    inputs = {"x": np.random.default_rng(0).standard_normal(64).astype(np.float32) * 1e-3}
    ref = run_reference(graph, inputs)
    (name,) = ref
    exact = {name: inputs["x"]}  # the float64 value, rounded once
    errors = {name: akg_corpus.compare(exact[name], ref[name])}
    assert errors[name] is not None  # beyond the tolerance of the reference
    note = akg_corpus.ill_conditioned(graph, inputs, exact, ref, errors)
    assert note.startswith("ill-conditioned: ") and name in note
    noisy = {name: ref[name] + np.float32(0.01)}
    assert akg_corpus.ill_conditioned(graph, inputs, noisy, ref, errors) == ""


def test_an_output_that_an_ulp_on_the_inputs_moves_may_be_off_by_as_much():
    # y = (a - b) * 1000 with a ~ b ~ 1000: the reference is exact (a - b is), but an ulp
    # on a or b (6e-5) moves the exact y by ~0.06-0.12; an answer within that is float32's
    # accuracy, one ten times further is wrong
    import numpy as np

    import polyc
    from polyc.graph.reference import run_reference
    b = polyc.GraphBuilder("amplify")
    a, c = b.input("a", [32]), b.input("b", [32])
    graph = b.build([b.mul(b.sub(a, c), b.constant("k", [1], [1e3]))])
    rng = np.random.default_rng(0)
    inputs = {"a": (1000 + rng.uniform(0, 1, 32)).astype(np.float32),
              "b": (1000 + rng.uniform(0, 1, 32)).astype(np.float32)}
    ref = run_reference(graph, inputs)
    (name,) = ref
    near = {name: ref[name] + np.float32(0.03)}
    errors = {name: akg_corpus.compare(near[name], ref[name])}
    assert errors[name] is not None
    note = akg_corpus.ill_conditioned(graph, inputs, near, ref, errors)
    assert note.startswith("ill-conditioned: ") and "an ulp on the inputs" in note
    far = {name: ref[name] + np.float32(1.0)}
    assert akg_corpus.ill_conditioned(graph, inputs, far, ref, errors) == ""
