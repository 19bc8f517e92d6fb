"""3x3 convolutions of stride 1 by Winograd's F(2x2, 3x3) (targets/cpu/winograd.py): the
results against the reference executor, the plan in the tree and the report, and the
convolutions it leaves to the direct path."""
from __future__ import annotations

import subprocess
from dataclasses import replace

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.compiler import Options, compile
from polyc.graph.reference import run_reference
from polyc.schedule_tree import marks
from polyc.microkernels import registry
from polyc.targets.cpu.winograd import MIN_GAIN, blocking, conv_of

from test_build import _toolchain
from test_microkernels import _isa


def _conv(xs, o, pads=(1, 1, 1, 1), const=True, epilogue="relu", strides=(1, 1), seed=3):
    rng = np.random.default_rng(seed)
    ws = (o, xs[1], 3, 3)
    w = (rng.uniform(-1, 1, ws) / np.sqrt(9 * xs[1])).astype(np.float32)
    inputs = {"x": rng.uniform(-1, 1, xs).astype(np.float32),
              "b": rng.uniform(-1, 1, (o,)).astype(np.float32)}
    b = GraphBuilder("conv")
    if const:
        weights = b.constant("w", ws, w.ravel().tolist())
    else:
        weights, inputs["w"] = b.input("w", ws), w
    y = b.conv2d(b.input("x", xs), weights, b.input("b", (o,)), pads=list(pads),
                 strides=list(strides))
    if epilogue == "relu":
        outs = [b.relu(y)]
    elif epilogue == "silu+residual":
        shape = (xs[0], o, xs[2] + pads[0] + pads[2] - 2, xs[3] + pads[1] + pads[3] - 2)
        inputs["r"] = rng.uniform(-1, 1, shape).astype(np.float32)
        outs = [b.add(b.silu(y), b.input("r", shape))]
    else:  # the convolution an output too, and its square
        outs = [y, b.mul(y, y)]
    return b.build(outs), inputs


def _check(graph, inputs, options=Options()):
    compiled = compile(graph, options=options)
    got, want = compiled(**inputs), run_reference(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)
    return compiled


def _plans(compiled) -> list[marks.Winograd]:
    return [m for k in compiled.kernels for m in k.marks(marks.Winograd)]


@pytest.mark.parametrize("xs, o, pads, const, epilogue, threads", [
    ((2, 32, 16, 16), 40, (1, 1, 1, 1), True, "relu", 1),  # rows past the kernel's mr
    ((1, 48, 29, 29), 32, (1, 1, 1, 1), False, "relu", 1),  # odd: the last tiles half out
    ((1, 32, 20, 26), 32, (2, 0, 1, 3), True, "silu+residual", 1),  # uneven pads
    ((2, 32, 18, 18), 32, (0, 0, 0, 0), False, "both", 1),  # no pads; C an output too
    ((8, 32, 28, 28), 32, (1, 1, 1, 1), True, "relu", 2),  # each thread its own blocks
    ((1, 64, 28, 28), 64, (1, 1, 1, 1), False, "relu", 2),  # one image: a team a block
    ((1, 32, 12, 12), 32, (5, 1, 2, 5), True, "relu", 1),  # pads past a tile
], ids=["rows", "odd", "pads", "valid", "blocks", "team", "wide-pads"])
def test_winograd_matches_the_reference(xs, o, pads, const, epilogue, threads):
    graph, inputs = _conv(xs, o, pads, const, epilogue)
    compiled = _check(graph, inputs, Options(threads=threads))
    [plan] = _plans(compiled)
    assert plan.weights == ("const" if const else "call")
    assert plan.par == {1: "none", 2: "blocks" if xs[0] > 1 else "team"}[threads]


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_winograd_runs_its_products_on_each_isa_s_kernels(isa):
    graph, inputs = _conv((4, 32, 28, 28), 48)
    compiled = _check(graph, inputs, replace(_isa(isa), threads=2))
    [plan] = _plans(compiled)
    assert plan.kernel in registry.ISAS[isa]


def test_the_plan_is_in_the_tree_and_the_report_says_why():
    graph, inputs = _conv((1, 32, 16, 16), 32)
    compiled = _check(graph, inputs, Options(threads=1))
    [kernel] = compiled.kernels
    text = kernel.to_json()["schedule_text"]
    assert 'mark: "winograd S0 ' in text and 'mark: "gemm ' not in text
    assert any("Winograd's F(2x2, 3x3)" in line and "options.winograd=False" in line
               for line in kernel.fusion_report)
    direct = _check(graph, inputs, Options(threads=1, winograd=False))
    assert not _plans(direct) and direct.kernels[0].marks(marks.Gemm)
    # where the convolution's result lives (it had been "a buffer of 1 element")
    for compiled, where in ((compiled, "Winograd's transforms compute it block by block"),
                            (direct, "the microkernel computes it tile by tile")):
        assert any(f"not materialised in memory: {where}" in line
                   for line in compiled.kernels[0].fusion_report)


@pytest.mark.parametrize("xs, o, strides, pads", [
    ((1, 32, 16, 16), 32, (2, 2), (1, 1, 1, 1)),  # strided
    ((1, 32, 7, 7), 32, (1, 1), (1, 1, 1, 1)),  # 7x7: its tiles' pads waste what it saves
    ((1, 16, 16, 16), 32, (1, 1), (1, 1, 1, 1)),  # too few channels for the transforms
    ((1, 64, 14, 14), 64, (1, 1), (1, 1, 1, 1)),  # too little work for a team
], ids=["strided", "7x7", "16-channels", "small"])
def test_convolutions_it_does_not_pay_on_stay_direct(xs, o, strides, pads):
    graph, inputs = _conv(xs, o, pads, strides=strides)
    assert not _plans(_check(graph, inputs, Options(threads=2)))


def test_weights_given_on_every_call_need_tiles_enough_to_serve():
    """Weights that are a graph input are transformed on every call, which over a 14x14
    image costs what its products do: direct there; constant, they are Winograd's."""
    for const in (False, True):
        graph, inputs = _conv((1, 64, 14, 14), 64, const=const)
        assert bool(_plans(_check(graph, inputs, Options(threads=1)))) == const


def test_a_dilated_or_non_3x3_window_is_no_winograd_convolution():
    b = GraphBuilder("conv")
    y = b.conv2d(b.input("x", (1, 32, 16, 16)), b.input("w", (32, 32, 3, 3)), pads=[2] * 4,
                 dilations=[2, 2])
    z = b.conv2d(b.input("x2", (1, 32, 16, 16)), b.input("w2", (32, 32, 5, 5)), pads=[2] * 4)
    compiled = compile(b.build([y, z]), options=Options(fuse=False), build=False)
    assert all(conv_of(k.kernel) is None for k in compiled.kernels)


def test_blocks_are_whole_panels_where_the_tile_rows_allow():
    """8 images of 28x28: 112 tile rows of 15 tiles (14 and the pad); 32 of them are
    480 columns, ten 48-wide panels, none wasted."""
    graph, _ = _conv((8, 128, 28, 28), 128)
    [kernel] = compile(graph, build=False).kernels
    conv = conv_of(kernel.kernel)
    assert (conv.tile_rows, conv.row_tiles) == (112, 15)
    assert blocking(conv, registry.by_name("sgemm_avx512_8x48")) == (32, 112 * 15)


def test_its_kernels_c_builds_alone_without_a_warning(tmp_path):
    """The kernels.c a user downloads (`polyc compile`): the transforms pasted, not
    linked (they are a prebuilt part otherwise), with -Werror."""
    graph, _ = _conv((1, 32, 28, 28), 32, const=False)
    compiled = compile(graph, options=Options(threads=1), build=False)
    assert "polyc_winograd_f2x3_input(" in compiled.c_source
    c_file = tmp_path / "kernels.c"
    c_file.write_text(compiled.c_source)
    command = _toolchain().command(c_file, tmp_path / "unit.so")
    proc = subprocess.run([command[0], "-Werror", *command[1:]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _random_case(seed: int):
    """A convolution Winograd takes, its sizes, pads and epilogue drawn from `seed`:
    non-square images, odd and even sides, pads from none to past a tile (drawn again
    until its tiles waste little enough of the output, `MIN_GAIN`)."""
    rng = np.random.default_rng(seed)
    while True:
        h, w = (int(v) for v in rng.integers(8, 34, 2))
        pads = tuple(int(v) for v in rng.integers(0, 4, 4))
        oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
        if 9 * oh * ow >= MIN_GAIN * 16 * -(-oh // 2) * (-(-ow // 2) + 1):
            break
    xs = (int(rng.integers(1, 4)), int(rng.integers(32, 49)), h, w)
    return (xs, int(rng.integers(32, 51)), pads, bool(rng.integers(0, 2)),
            str(rng.choice(["relu", "silu+residual", "both"])), int(rng.integers(1, 3)))


@pytest.mark.parametrize("seed", range(12))
def test_random_winograd_convolutions_match_the_reference(seed):
    xs, o, pads, const, epilogue, threads = _random_case(seed)
    graph, inputs = _conv(xs, o, pads, const, epilogue, seed=seed)
    options = Options(threads=threads)
    if not _plans(compile(graph, options=options, build=False)):  # too little for a team
        options = Options(threads=1)
    assert _plans(_check(graph, inputs, options))
