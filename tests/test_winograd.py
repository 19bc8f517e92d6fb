"""3x3 convolutions of stride 1 by Winograd's F(2x2, 3x3) and F(4x4, 3x3)
(targets/cpu/winograd.py): the results against the reference executor, the plan in the
tree and the report, which tile it takes, and the convolutions it leaves to the direct
path."""
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
from polyc.targets.cpu.winograd import F4_MARGIN, blocking, conv_of

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


@pytest.mark.parametrize("xs, o, pads, const, epilogue, threads, tiles", [
    ((2, 32, 16, 16), 40, (1, 1, 1, 1), True, "relu", 1, (2, 4)),  # rows past the kernel's mr
    ((1, 48, 45, 45), 32, (1, 1, 1, 1), False, "relu", 1, (2, 4)),  # odd: last tiles part out
    ((1, 32, 20, 26), 32, (2, 0, 1, 3), True, "silu+residual", 1, (2, 4)),  # uneven pads
    ((2, 32, 34, 34), 32, (0, 0, 0, 0), False, "both", 1, (2, 4)),  # no pads; C an output too
    ((8, 32, 28, 28), 32, (1, 1, 1, 1), True, "relu", 2, (2,)),  # each thread its own blocks
    ((8, 32, 56, 56), 32, (1, 1, 1, 1), True, "relu", 2, (4,)),
    ((1, 64, 28, 28), 64, (1, 1, 1, 1), False, "relu", 2, (2,)),  # one image: a team a block
    ((1, 64, 46, 46), 64, (1, 1, 1, 1), False, "relu", 2, (4,)),
    ((1, 32, 24, 24), 32, (5, 1, 2, 5), True, "relu", 1, (2, 4)),  # pads past a tile
], ids=["rows", "odd", "pads", "valid", "blocks", "blocks-56", "team", "team-46", "wide-pads"])
def test_winograd_matches_the_reference(xs, o, pads, const, epilogue, threads, tiles):
    graph, inputs = _conv(xs, o, pads, const, epilogue)
    for tile in tiles:
        compiled = _check(graph, inputs, Options(threads=threads, winograd_tile=tile))
        [plan] = _plans(compiled)
        assert (plan.tile, plan.weights) == (tile, "const" if const else "call")
        assert plan.par == {1: "none", 2: "blocks" if xs[0] > 1 else "team"}[threads]


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
@pytest.mark.parametrize("tile", [2, 4])
def test_winograd_runs_its_products_on_each_isa_s_kernels(isa, tile):
    graph, inputs = _conv((4, 32, 28, 28), 48)
    compiled = _check(graph, inputs, replace(_isa(isa), threads=2, winograd_tile=tile))
    [plan] = _plans(compiled)
    assert plan.kernel in registry.ISAS[isa] and plan.tile == tile


def test_the_plan_is_in_the_tree_and_the_report_says_why():
    graph, inputs = _conv((1, 32, 16, 16), 32)
    compiled = _check(graph, inputs, Options(threads=1))
    [kernel] = compiled.kernels
    text = kernel.to_json()["schedule_text"]
    assert 'mark: "winograd S0 ' in text and 'mark: "gemm ' not in text
    assert any("by Winograd's F(" in line and "options.winograd=False" in line
               for line in kernel.fusion_report)
    direct = _check(graph, inputs, Options(threads=1, winograd=False))
    assert not _plans(direct) and direct.kernels[0].marks(marks.Gemm)
    # where the convolution's result lives (it had been "a buffer of 1 element")
    for compiled, where in ((compiled, "Winograd's transforms compute it block by block"),
                            (direct, "the microkernel computes it tile by tile")):
        assert any(f"not materialised in memory: {where}" in line
                   for line in compiled.kernels[0].fusion_report)


@pytest.mark.parametrize("xs, o, max_tile, tile, why", [
    ((8, 64, 56, 56), 64, 4, 4, "at least"),  # 4x4 tiles: about 1.7x fewer products
    ((8, 256, 10, 10), 256, 4, 2, "under"),  # a 10x10 image in 4x4 tiles: 1.1x, not enough
    ((8, 64, 56, 56), 64, 2, 2, "at least"),  # 4x4 would pay: the report says how to ask
], ids=["56x56", "10x10", "56x56-max-2"])
def test_of_the_tiles_allowed_4x4_where_its_products_take_enough_less_time(xs, o, max_tile,
                                                                           tile, why):
    """The choice on the portable kernel (one kernel on every host: the same panels)."""
    graph, _ = _conv(xs, o)
    options = replace(_isa("portable"), threads=1, winograd_max_tile=max_tile)
    compiled = compile(graph, options=options, build=False)
    [plan] = _plans(compiled)
    assert plan.tile == tile
    [line] = [line for line in compiled.kernels[0].fusion_report if "products take" in line]
    assert f"by Winograd's F({tile}x{tile}, 3x3)" in line and f"{why} the {F4_MARGIN}x" in line
    assert ("options.winograd_max_tile=4 would take F(4x4, 3x3)" in line) == (max_tile == 2)


@pytest.mark.parametrize("xs, o, strides, pads, why", [
    ((1, 32, 16, 16), 32, (2, 2), (1, 1, 1, 1), None),  # strided: no such convolution
    ((1, 32, 7, 7), 32, (1, 1), (1, 1, 1, 1),  # 7x7: its tiles' pads waste what it saves
     ["F(2x2, 3x3) does not pay (1.38x fewer multiply-adds than direct, its tiles' pads "
      "counted, under 1.8)"]),
    ((1, 16, 16, 16), 32, (1, 1), (1, 1, 1, 1),  # too few channels for the transforms
     ["16 channels in, 32 out: Winograd's transforms pay from 32 each"]),
    ((1, 64, 14, 14), 64, (1, 1), (1, 1, 1, 1),  # too little work for a team (its count
     ["F(2x2, 3x3) does not pay (", "too few for a team of 2"]),  # the kernel's panels')
], ids=["strided", "7x7", "16-channels", "small"])
def test_convolutions_it_does_not_pay_on_stay_direct_and_the_report_says_why(xs, o, strides,
                                                                            pads, why):
    graph, inputs = _conv(xs, o, pads, strides=strides)
    compiled = _check(graph, inputs, Options(threads=2))
    assert not _plans(compiled)
    lines = [line for line in compiled.kernels[0].fusion_report if "not by Winograd" in line]
    if why is None:
        assert not lines
    else:
        [line] = lines
        assert f"3x3, stride 1) direct, not by Winograd: {why[0]}" in line, line
        assert all(part in line for part in why), line
        assert line.endswith("options.winograd_tile=2 or 4 forces a tile")


def test_the_report_says_what_keeps_a_convolution_direct_when_asked_or_tuned_for():
    graph, _ = _conv((1, 32, 16, 16), 32)
    [line] = [line for line in compile(graph, options=Options(winograd=False), build=False
                                       ).kernels[0].fusion_report if "Winograd" in line]
    assert line.endswith("direct, not by Winograd: options.winograd=False asks for it")
    # 4x4 would pay where it is not allowed, 2x2 does not: the report says how to ask
    graph, _ = _conv((8, 256, 7, 7), 256)  # 2x2 tiles waste a 7x7 output, 4x4 less
    options = replace(_isa("portable"), threads=1, winograd_max_tile=2)
    [kernel] = compile(graph, options=options, build=False).kernels
    [line] = [line for line in kernel.fusion_report if "Winograd" in line]
    assert "F(2x2, 3x3) does not pay (" in line, line
    assert "F(4x4, 3x3) would: options.winograd_max_tile=4 allows it" in line


def test_weights_given_on_every_call_need_tiles_enough_to_serve():
    """Weights that are a graph input are transformed on every call, which over a 14x14
    image costs what its products do: direct there; constant, they are Winograd's."""
    for const in (False, True):
        graph, inputs = _conv((1, 64, 14, 14), 64, const=const)
        compiled = _check(graph, inputs, Options(threads=1))
        assert bool(_plans(compiled)) == const
        assert any("weights given on every call, transformed on every call: 56 tiles, "
                   "under the 128" in line for line in compiled.kernels[0].fusion_report
                   ) == (not const)


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
    """The kernels.c a user downloads (`polyc compile`): both transforms pasted (one
    kernel each), not linked (they are prebuilt parts otherwise), with -Werror."""
    b = GraphBuilder("convs")
    y = b.conv2d(b.input("x", (1, 32, 56, 56)), b.input("w", (32, 32, 3, 3)), pads=[1] * 4)
    # 4 images of 12x12: 168 tiles of 2x2, 48 of 4x4, too few for weights given each call
    z = b.conv2d(b.input("x2", (4, 32, 12, 12)), b.input("w2", (32, 32, 3, 3)), pads=[1] * 4)
    compiled = compile(b.build([y, z]), options=Options(threads=1, winograd_max_tile=4),
                       build=False)
    assert sorted(m.tile for m in _plans(compiled)) == [2, 4]
    assert "polyc_winograd_f2x3_input(" in compiled.c_source
    assert "polyc_winograd_f4x3_input(" in compiled.c_source
    c_file = tmp_path / "kernels.c"
    c_file.write_text(compiled.c_source)
    command = _toolchain().command(c_file, tmp_path / "unit.so")
    proc = subprocess.run([command[0], "-Werror", *command[1:]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _random_case(seed: int):
    """A convolution Winograd takes at the tile drawn, its sizes, pads, epilogue and team
    drawn from `seed`: non-square images, odd and even sides, pads from none to past a
    tile (all drawn again until the plan takes it)."""
    rng = np.random.default_rng(seed)
    while True:
        xs = (int(rng.integers(1, 4)), int(rng.integers(32, 49)), *map(int, rng.integers(8, 50, 2)))
        pads = tuple(int(v) for v in rng.integers(0, 4, 4))
        graph, inputs = _conv(xs, int(rng.integers(32, 51)), pads, bool(rng.integers(0, 2)),
                              str(rng.choice(["relu", "silu+residual", "both"])), seed=seed)
        options = Options(threads=int(rng.integers(1, 3)), winograd_tile=int(rng.choice([2, 4])))
        if _plans(compile(graph, options=options, build=False)):
            return graph, inputs, options


@pytest.mark.parametrize("seed", range(12))
def test_random_winograd_convolutions_match_the_reference(seed):
    graph, inputs, options = _random_case(seed)
    [plan] = _plans(_check(graph, inputs, options))
    assert plan.tile == options.winograd_tile


def test_tune_measures_the_direct_convolution_and_each_tile_and_the_plan_follows(
        tmp_path, monkeypatch, seeded_cache, capsys):
    import json

    from polyc.cli import main
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path))
    graph, _ = _conv((1, 32, 28, 28), 32)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(graph.to_json()))
    assert main(["tune", str(path), "--budget", "6", "--repeat", "1", "--threads", "1",
                 "-O", "winograd_max_tile=4"]) == 0
    out = capsys.readouterr().out
    measured = [line for line in out.splitlines() if line.endswith(" ms") and ": best: " not in line]
    for how in ("direct ", "winograd 2x2 ", "winograd 4x4 "):
        assert any(f" {how}" in line for line in measured), out
    [best] = [line.split(": best: ")[1] for line in out.splitlines() if ": best: " in line]
    compiled = compile(graph, options=Options(threads=1, winograd_max_tile=4), build=False)
    plans = _plans(compiled)
    if best.startswith("direct "):
        assert not plans and compiled.kernels[0].marks(marks.Gemm)
    else:
        [plan] = plans
        assert best.startswith(f"winograd {plan.tile}x{plan.tile} {plan.kernel} ")
        assert any("measured fastest by polyc tune" in line
                   for line in compiled.kernels[0].fusion_report)


@pytest.mark.parametrize("stored, max_tile, tile", [(0, 2, None), (2, 2, 2), (4, 4, 4), (4, 2, 2)],
                         ids=["direct", "2x2", "4x4", "4x4-not-allowed"])
def test_a_tuned_choice_is_taken_over_the_plan_s_rules(tmp_path, monkeypatch, seeded_cache,
                                                       stored, max_tile, tile):
    """1x32x16x16: the rules take F(2x2, 3x3) (4x4 tiles keep too little of the gain
    once rounded to panels); what polyc tune stored wins, even where the rules refuse,
    within the tiles `winograd_max_tile` allows."""
    from polyc.targets.cpu import cpu_machine, tuning
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path))
    graph, inputs = _conv((1, 32, 16, 16), 32)
    options = replace(_isa("portable"), threads=1, winograd_max_tile=max_tile)
    [kernel] = compile(graph, options=options, build=False).kernels
    assert [p.tile for p in kernel.marks(marks.Winograd)] == [2]
    tuning.store(kernel.kernel, cpu_machine(), 1, "sgemm_vec_6x16", {}, 1e-3, winograd=stored)
    compiled = _check(graph, inputs, options)
    assert [p.tile for p in _plans(compiled)] == ([tile] if tile else [])
    # (stored 0: the direct convolution's contraction on the kernel stored)
    assert any("measured fastest by polyc tune" in line
               for line in compiled.kernels[0].fusion_report) == (stored <= max_tile)


def test_4x4_tiles_interpolate_where_their_rounding_stays_small():
    """F(4x4, 3x3) on the points 0, 1, -1, 1/2, -2: 2.4e-6 and 2.9e-6 of the largest
    output off the float64 reference here; on the usual 0, 1, -1, 2, -2, 7.9e-6 and
    6.1e-6. F(2x2, 3x3) rounds less still."""
    for xs in ((1, 256, 16, 16), (2, 128, 20, 20)):
        graph, inputs = _conv(xs, 64, epilogue="both")
        want = run_reference(graph, inputs)[graph.outputs[0]]
        error = {}
        for tile in (2, 4):
            got = compile(graph, options=Options(threads=1, winograd_tile=tile))(**inputs)
            error[tile] = np.abs(got[graph.outputs[0]] - want).max() / np.abs(want).max()
        assert error[2] < error[4] < 4.5e-6, error
