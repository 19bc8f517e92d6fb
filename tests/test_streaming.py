"""Non-temporal stores: which loops the cpu lowering marks `stream`, and that the kernels it
streams still match the reference on every dtype and alignment.

The decision depends on the last cache level (an output at least half its size), so the
tests give the compiler a target whose L3 is 64 KiB: small graphs take the streaming path.
"""
from __future__ import annotations

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.compiler import compile
from polyc.graph.reference import run_reference
from polyc.schedule_tree.tree import schedule_to_text
from polyc.targets.cpu import CpuBackend, cpu_machine


@pytest.fixture
def small_l3(monkeypatch):
    small = cpu_machine().with_capacity("L3", 64 << 10)
    monkeypatch.setattr(CpuBackend, "machine", lambda self: small)
    assert CpuBackend().machine().role("block").capacity == 64 << 10


def _streamed(compiled) -> list[str]:
    """Kernels with a `stream` mark, checked against the C they became."""
    names = [k.kernel.name for k in compiled.kernels if 'mark: "stream"' in schedule_to_text(k.schedule)]
    assert ("polyc_stream(&" in compiled.c_source) == bool(names)
    return names


def _check(graph, inputs, out=None):
    compiled = compile(graph)
    got = compiled(out=out, **inputs)
    want = run_reference(graph, inputs)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)
    return compiled


def _misaligned(shape, dtype, offset_bytes):
    """A C-contiguous array starting `offset_bytes` past a 64-byte boundary."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset_bytes
    return raw[start:start + size].view(dtype).reshape(shape)


@pytest.mark.parametrize("offset", [0, 4, 16, 32])
def test_softmax_rows_stream_at_any_alignment(small_l3, offset):
    # 1001-wide rows: each row starts at another alignment, so every head / tail path of
    # polyc_stream runs; the output itself starts `offset` bytes past a line
    b = GraphBuilder("softmax")
    graph = b.build([b.softmax(b.input("x", [37, 1001]), out="y")])
    x = np.random.default_rng(0).standard_normal((37, 1001)).astype(np.float32)
    out = {"y": _misaligned((37, 1001), np.float32, offset)}
    compiled = _check(graph, {"x": x}, out)
    assert _streamed(compiled) == [compiled.kernels[0].kernel.name]
    assert "polyc_stream_fence()" in compiled.c_source


def test_layer_norm_streams_its_output_and_keeps_its_locals(small_l3):
    b = GraphBuilder("ln")
    x, g, beta = b.input("x", [64, 515]), b.input("g", [515]), b.input("b", [515])
    graph = b.build([b.layer_norm(x, g, beta, out="y")])
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((64, 515)).astype(np.float32),
              "g": rng.standard_normal(515).astype(np.float32),
              "b": rng.standard_normal(515).astype(np.float32)}
    assert _streamed(_check(graph, inputs))


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_other_dtypes_stream(small_l3, dtype):
    b = GraphBuilder("add")
    graph = b.build([b.add(b.input("a", [129, 257], dtype), b.input("c", [257], dtype), out="y")])
    rng = np.random.default_rng(2)
    inputs = {"a": rng.integers(-9, 9, (129, 257)).astype(dtype),
              "c": rng.integers(-9, 9, 257).astype(dtype)}
    assert _streamed(_check(graph, inputs))


def test_a_loop_writing_an_output_another_statement_reads_is_not_streamed(small_l3):
    # y is an output and z's input in the same loop: non-temporal stores would send y
    # away from the cache that z is about to read it from
    b = GraphBuilder("chain")
    y = b.exp(b.input("x", [64, 300]), out="y")
    graph = b.build([y, b.neg(y, out="z")])
    compiled = _check(graph, {"x": np.random.default_rng(3).standard_normal((64, 300))
                              .astype(np.float32)})
    assert len(compiled.kernels) == 1 and _streamed(compiled) == []


def test_outputs_smaller_than_half_the_last_cache_are_not_streamed():
    # on the host's real memory model a small softmax stays in cache for its consumer
    b = GraphBuilder("softmax")
    graph = b.build([b.softmax(b.input("x", [37, 1001]), out="y")])
    assert _streamed(compile(graph, build=False)) == []


def test_a_one_dimensional_loop_streams_in_parallel_chunks(small_l3):
    # parallel, simd and stream on one loop: the threads share out the staged chunks
    b = GraphBuilder("exp")
    graph = b.build([b.exp(b.input("x", [100003]), out="y")])
    compiled = _check(graph, {"x": np.random.default_rng(4).standard_normal(100003)
                              .astype(np.float32)})
    assert _streamed(compiled)
    assert "#pragma omp parallel for" in compiled.c_source
