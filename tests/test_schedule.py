"""Final schedule trees against the dependences isl computed, and golden checks of what
matters in the printed trees (not full diffs, per MLIR's TestingGuide).

The legality check here is written independently of `respects_dependences`: the
lexicographic order is spelled out as constraints by the test itself, and on small
kernels every dependence pair is also enumerated and compared as Python tuples.
"""
from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.compiler import KernelResult, Options, compile
from polyc.graph.reference import run_reference
from polyc.schedule_tree.dependences import respects_dependences
from polyc.schedule_tree.model import count
from polyc.schedule_tree.tree import (
    schedule_from_text,
    schedule_to_json,
    schedule_to_text,
)
from polyc.targets.cpu import cpu_machine

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.json"))


# --- graphs --------------------------------------------------------------------------------

def _mix_reductions():
    b = GraphBuilder("reductions")
    x = b.input("x", [3, 7, 5])
    return b.build([b.reduce_max(x, axes=[0, 2], keepdims=True), b.reduce_sum(x, axes=[-1]),
                    b.reduce_prod(x), b.logsumexp(x, axes=[1])])


def _mix_contractions():
    b = GraphBuilder("contractions")
    a, w = b.input("a", [2, 3, 4]), b.input("w", [5, 4])
    x, k = b.input("x", [1, 2, 6, 5]), b.input("k", [3, 2, 3, 2])
    return b.build([b.matmul(a, w, transpose_b=True),
                    b.conv2d(x, k, strides=[2, 1], pads=[1, 0, 1, 1]),
                    b.matmul(b.input("v", [4]), b.transpose(a, perm=[0, 2, 1]))])


def _mix_movement():
    b = GraphBuilder("movement")
    x = b.input("x", [4, 6])
    y = b.concat(b.pad(x, pads=[[1, 0], [0, 0]]), b.slice(x, starts=[-3], ends=[6], steps=[1]),
                 axis=0)
    return b.build([b.reshape(b.softmax(y, axis=0), shape=[-1]), b.layer_norm(x)])


MIXES = {"reductions": _mix_reductions, "contractions": _mix_contractions,
         "movement": _mix_movement}


def _kernels(graph) -> tuple[KernelResult, ...]:
    return compile(graph, build=False).kernels


# graphs by name, compiled when a test first asks (at import, every test process compiled
# all of them whether it ran these tests or not)
GRAPHS = {**{path.stem: path for path in EXAMPLES}, **{name: make for name, make in MIXES.items()}}
SMALL = sorted(MIXES)


@functools.lru_cache(maxsize=None)
def _graph_kernels(name: str) -> tuple[KernelResult, ...]:
    source = GRAPHS[name]
    return _kernels(source if isinstance(source, Path) else source())


# --- an independent legality check ---------------------------------------------------------

def _lex_lt(ctx: isl.Context, n: int) -> isl.Map:
    """{ [t] -> [u] : t <lex u } on n dims, written out here as a disjunction."""
    t = [f"t{d}" for d in range(n)]
    u = [f"u{d}" for d in range(n)]
    cases = [" and ".join([f"{t[e]} = {u[e]}" for e in range(d)] + [f"{t[d]} < {u[d]}"])
             for d in range(n)]
    cond = " or ".join(f"({c})" for c in cases) or "false"
    return isl.Map.read_from_str(ctx, f"{{ [{', '.join(t)}] -> [{', '.join(u)}] : {cond} }}")


def _time_pairs(k: KernelResult) -> isl.UnionMap:
    """For every dependence, (time of its source, time of its sink) in the final schedule."""
    times = k.schedule.get_map()
    return k.model.dependences.apply_domain(times).apply_range(times)


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return out


def _violations(k: KernelResult) -> list[isl.Map]:
    ctx = k.schedule.get_ctx()
    bad = []
    for m in _maps(_time_pairs(k)):
        n = m.dim(isl.dim_type.in_)
        assert m.dim(isl.dim_type.out) == n, "all statements must share one time space"
        outside = m.subtract(_lex_lt(ctx, n))
        if not outside.is_empty():
            bad.append(outside)
    return bad


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_final_schedule_respects_every_dependence(name: str):
    assert {k.name: _violations(k) for k in _graph_kernels(name)} == {
        k.name: [] for k in _graph_kernels(name)}


def _pairs_out_of_order(k: KernelResult) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The same property by enumeration: every (source time, sink time) as Python tuples,
    compared by Python; no isl set operation between the pairs and the verdict."""
    pairs = []

    def visit(point: isl.Point) -> None:
        n = point.get_space().dim(isl.dim_type.set) // 2
        coords = [point.get_coordinate_val(isl.dim_type.set, d).to_python()
                  for d in range(2 * n)]
        pairs.append((tuple(coords[:n]), tuple(coords[n:])))

    for m in _maps(_time_pairs(k)):
        m.wrap().foreach_point(visit)
    assert pairs or k.model.dependences.is_empty()
    return [(src, dst) for src, dst in pairs if not src < dst]


@pytest.mark.parametrize("name", SMALL)
def test_every_dependence_pair_runs_in_order(name: str):
    assert {k.name: _pairs_out_of_order(k) for k in _graph_kernels(name)} == {
        k.name: [] for k in _graph_kernels(name)}


def test_the_checks_are_not_vacuous():
    # Reductions and contractions carry dependences; a check that sees none proves nothing.
    with_deps = [k for name in GRAPHS for k in _graph_kernels(name)
                 if not k.model.dependences.is_empty()]
    assert len(with_deps) >= 10


# --- wrong schedules are caught -----------------------------------------------------------------

def _row_sum() -> KernelResult:
    b = GraphBuilder("row_sum")
    (k,) = _kernels(b.build([b.reduce_sum(b.input("x", [4, 6]), axes=[1])]))
    return k


def test_init_after_update_is_detected():
    k = _row_sum()
    lines = schedule_to_text(k.schedule).splitlines()
    filters = [n for n, line in enumerate(lines) if "- filter:" in line]
    assert [lines[n].split('"')[1] for n in filters] == ["{ S0_init[i0] }", "{ S0[i0, i1] }"]
    # swap the two filters of the sequence: every update before its init
    first, second = filters
    lines[first], lines[second] = lines[second], lines[first]
    bad = schedule_from_text("\n".join(lines), k.schedule.get_ctx())
    assert not respects_dependences(k.model, bad).is_empty()
    # and the test's own checks see it too, so their silence above means something
    assert _violations(replace(k, schedule=bad))
    assert len(_pairs_out_of_order(replace(k, schedule=bad))) == 4  # one init per row


def test_reversed_reduction_loop_is_detected():
    k = _row_sum()
    ctx = k.schedule.get_ctx()
    # the row sum's updates with the reduction loop running backwards (k from 5 down to 0):
    # each read of the partial sum then comes before the write it depends on
    bad = isl.UnionMap.read_from_str(ctx, "{ S0_init[i0] -> [i0, 0, 0]; "
                                          "S0[i0, i1] -> [i0, 1, 5 - i1] }")
    schedule = isl.Schedule.from_domain(k.model.domain).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(bad))
    assert not respects_dependences(k.model, schedule).is_empty()
    assert _violations(replace(k, schedule=schedule))


def _reverse_the_sums(state, machine, options):
    """A broken pass: the row sum's updates with the reduction loop backwards."""
    bad = isl.UnionMap.read_from_str(state.schedule.get_ctx(),
                                     "{ S0_init[i0] -> [i0, 0, 0]; S0[i0, i1] -> [i0, 1, 5 - i1] }")
    return state.with_schedule(isl.Schedule.from_domain(state.model.domain)
                               .insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(bad)))


@pytest.mark.parametrize("build", [False, True])
def test_a_pass_that_breaks_a_dependence_fails_the_compile_by_name(monkeypatch, build):
    # with the build, the checks run while gcc compiles the unit: they must still fail it
    from polyc.schedule_tree.state import Pass
    from polyc.targets.cpu import CpuBackend
    from polyc.errors import InternalError
    passes = CpuBackend.passes
    monkeypatch.setattr(CpuBackend, "passes", lambda self: (
        Pass("reverse-sums", _reverse_the_sums, changes_schedule=True),) + passes(self))
    b = GraphBuilder("row_sum")
    graph = b.build([b.reduce_sum(b.input("x", [4, 6]), axes=[1])])
    with pytest.raises(InternalError, match="reverse-sums.*violates dependences"):
        compile(graph, build=build)
    # the same pass unchecked compiles (to wrong code): the check is what failed it
    compile(graph, options={"verify": False}, build=False)


def test_the_original_order_is_legal():
    k = _row_sum()
    schedule = isl.Schedule.from_domain(k.model.domain).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(k.model.order))
    assert respects_dependences(k.model, schedule).is_empty()


# --- golden checks of the printed trees -----------------------------------------------------------

def _walk(node: dict):
    """Every node of a tree in its JSON form, top down."""
    yield node
    for child in node["children"]:
        yield from _walk(child)


def _members(schedule: isl.Schedule, statement: str) -> list[tuple[isl.UnionMap, bool]]:
    """(member restricted to `statement`, coincident) for every band member of the tree."""
    only = isl.UnionSet.read_from_str(schedule.get_ctx(), f"{{ {statement} }}")
    out = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.band:
            partial = node.band_get_partial_schedule()
            for m in range(node.band_n_member()):
                member = isl.UnionMap.from_union_pw_aff(partial.get_at(m))
                out.append((member.intersect_domain(only),
                            bool(node.band_member_get_coincident(m))))
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    return out


def test_reduction_member_is_not_coincident():
    k = _row_sum()
    members = _members(k.schedule, "S0[i0, i1]")
    ctx = k.schedule.get_ctx()
    along_k = isl.UnionMap.read_from_str(ctx, "{ S0[i0, i1] -> [i1] }")
    along_rows = isl.UnionMap.read_from_str(ctx, "{ S0[i0, i1] -> [i0] }")
    assert [c for m, c in members if m.is_equal(along_k)] == [False], members  # partial sums
    assert [c for m, c in members if m.is_equal(along_rows)] == [True], members  # rows


def _exp_graph(n: int):
    b = GraphBuilder("exp")
    return b.build([b.exp(b.input("x", [n, n]))])


def _elementwise(n: int) -> KernelResult:
    (k,) = _kernels(_exp_graph(n))
    return k


def test_parallel_mark_on_a_large_elementwise_op():
    k = _elementwise(256)
    tree = schedule_to_json(k.schedule)
    (parallel,) = [n for n in _walk(tree) if n.get("mark") == "parallel"]
    (band,) = parallel["children"]
    assert band["kind"] == "band" and band["coincident"][0] is True
    assert 'mark: "parallel"' in schedule_to_text(k.schedule)
    assert "#pragma omp parallel for" in compile(_exp_graph(256), build=False).c_source


def test_no_parallel_mark_on_a_tiny_op():
    # waking the thread team costs more than 7x7 exps
    tree = schedule_to_json(_elementwise(7).schedule)
    assert "parallel" not in [n.get("mark") for n in _walk(tree)]


def test_no_mark_is_doubled():
    tree = schedule_to_json(_elementwise(256).schedule)
    for node in _walk(tree):
        if node["kind"] == "mark":
            assert node["children"][0].get("mark") != node["mark"], node


def test_schedule_json_has_kind_children_and_band_flags():
    tree = schedule_to_json(_row_sum().schedule)
    json.dumps(tree)  # plain JSON for the service and the browser
    assert tree["kind"] == "domain" and "S0_init" in tree["domain"]
    for node in _walk(tree):
        assert isinstance(node["kind"], str) and isinstance(node["children"], list)
    # rows, then the reduction loop split off under its `reduce` mark
    rows, sums = [n for n in _walk(tree) if n["kind"] == "band"]
    assert rows["permutable"] is True and rows["coincident"] == [True]
    assert sums["members"] == len(sums["coincident"]) == 1 and sums["coincident"] == [False]
    assert [n["mark"] for n in _walk(tree) if n["kind"] == "mark"] == ["reduce"]
    assert [c["kind"] for c in sums["children"]] == ["sequence"]
    assert [f["filter"] for f in sums["children"][0]["children"]] == [
        "{ S0_init[i0] }", "{ S0[i0, i1] }"]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_schedule_text_round_trips(name: str):
    for k in _graph_kernels(name):
        _round_trips(k)


def _round_trips(k: KernelResult) -> None:
    text = schedule_to_text(k.schedule)
    assert "YOU ARE HERE" not in text
    back = schedule_from_text(text, k.schedule.get_ctx())
    # isl may print the pieces of a union in another order: compare meaning, not text
    assert back.get_map().is_equal(k.schedule.get_map())
    assert _shape(schedule_to_json(back)) == _shape(schedule_to_json(k.schedule))
    # and into a fresh context, as a pasted repro would be
    assert _shape(schedule_to_json(schedule_from_text(text))) == _shape(schedule_to_json(k.schedule))


def _shape(tree: dict) -> tuple:
    """A tree's structure and flags, without isl's text of its sets and maps."""
    flags = tuple((key, str(tree.get(key))) for key in ("kind", "mark", "members", "permutable",
                                                        "coincident"))
    return flags, tuple(_shape(c) for c in tree["children"])


def _innermost(k: KernelResult) -> list[str]:
    """The schedules of the bands right under a `simd` or `reduce` mark."""
    return [n["children"][0]["schedule"] for n in _walk(schedule_to_json(k.schedule))
            if n.get("mark") in ("simd", "reduce")]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_broadcast_operand_does_not_turn_the_loops_around(dtype):
    # isl's proximity prefers reusing c[j] across rows (j outer): interchange puts the
    # contiguous j back innermost, where every access moves by one element
    b = GraphBuilder("bias")
    (k,) = _kernels(b.build([b.add(b.input("a", [129, 257], dtype), b.input("c", [257], dtype))]))
    (inner,) = _innermost(k)
    assert "(i1)" in inner and "(i0)" not in inner, inner


def test_a_column_reduction_vectorises_along_the_row():
    # z[j] += x[i, j] (the update's i1 is j, its init's i0): the accumulators z[j] are
    # contiguous along j, as are the loads
    b = GraphBuilder("colsum")
    (k,) = _kernels(b.build([b.reduce_sum(b.input("x", [300, 64]), axes=[0])]))
    inner = _innermost(k)
    assert inner and all(("S0[i0, i1] -> [(i1)]" in s or "S0_init[i0] -> [(i0)]" in s)
                         and "S0[i0, i1] -> [(i0)]" not in s for s in inner), inner


@pytest.mark.parametrize("threads", [0, 3, 1])
def test_a_large_column_sum_runs_its_columns_in_one_block_per_thread(threads):
    # s[j] += x[i, j]: the row loop carries the sum, so threads share blocks of columns
    # in a loop put outside it; every dependence stays inside a block
    blocks = threads or cpu_machine().cores
    blocks = blocks if blocks > 1 else 0
    b = GraphBuilder("colsum")
    graph = b.build([b.reduce_sum(b.input("x", [300, 1000]), axes=[0], out="s")])
    compiled = compile(graph, options=Options(threads=threads))
    tree = schedule_to_json(compiled.kernels[0].schedule)
    marks = [n for n in _walk(tree) if n.get("mark", "").split(" ")[0] == "parallel"]
    if not blocks:
        assert not marks
    else:
        (parallel,) = marks
        block = parallel["children"][0]
        # the team asked for is fixed on the loop
        assert parallel["mark"] == (f"parallel threads={threads}" if threads else "parallel")
        assert block["coincident"] == [True] and "floor((i0)/" in block["schedule"]
        width = (-(-1000 // blocks) + 15) // 16 * 16
        assert f"floor((i0)/{width})" in block["schedule"]
        assert "#pragma omp parallel for" in compiled.c_source
    x = np.random.default_rng(0).standard_normal((300, 1000)).astype(np.float32)
    np.testing.assert_allclose(compiled(x=x)["s"], x.sum(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [0, 3, 1])
def test_a_large_full_reduction_gives_each_thread_its_own_partial_results(threads):
    # s += x[i, j] over both loops: no loop is free of the reductions' dependences, so
    # threads reduce rows into private copies of s, m and q's sum, combined after the loop
    parallel = (threads or cpu_machine().cores) > 1
    b = GraphBuilder("fullsum")
    x = b.input("x", [300, 1000])
    graph = b.build([b.reduce_sum(x, axes=[0, 1], out="s"), b.reduce_max(x, out="m"),
                     b.op("reduce_mean", b.mul(x, x), axes=[0, 1], out="q")])
    compiled = compile(graph, options=Options(threads=threads))
    tree = schedule_to_json(compiled.kernels[0].schedule)
    marks = [n["mark"] for n in _walk(tree) if n["kind"] == "mark"]
    partials = [m for m in marks if m.startswith("partials ")]
    if parallel:
        assert (f"parallel threads={threads}" if threads else "parallel") in marks
        assert len(partials) == 1 and len(partials[0].split()) == 4
        assert "#pragma omp for ordered schedule(static, 1)" in compiled.c_source
    else:
        assert not partials and "parallel" not in marks
    xs = np.random.default_rng(0).standard_normal((300, 1000)).astype(np.float32)
    got = compiled(x=xs)
    np.testing.assert_allclose(got["s"], xs.astype(np.float64).sum(), rtol=1e-4)
    np.testing.assert_allclose(got["q"], (xs.astype(np.float64) ** 2).mean(), rtol=1e-5)
    assert got["m"] == xs.max()
    for row in (0, 150, 299):  # a NaN any thread sees wins
        xs2 = xs.copy()
        xs2[row, 500] = np.nan
        assert np.isnan(compiled(x=xs2)["m"])


def test_a_full_reduction_rounds_alike_on_every_run():
    # eight threads' partial sums folded in order of arrival gave 19 different sums in
    # 200 runs; folded in thread order, one
    b = GraphBuilder("fullsum")
    x, y = b.input("x", [300, 1000]), b.input("y", [300, 1000])
    graph = b.build([b.reduce_sum(x, axes=[0, 1], out="s"), b.relu(y, out="r")])
    compiled = compile(graph, options=Options(threads=8))
    assert compiled.c_source.count("num_threads(8)") == 2  # the sum's team and relu's
    xs = np.random.default_rng(0).standard_normal((300, 1000)).astype(np.float32)
    sums = {compiled(x=xs, y=xs)["s"].tobytes() for _ in range(200)}
    assert len(sums) == 1
    np.testing.assert_allclose(np.frombuffer(sums.pop(), np.float32)[0],
                               xs.astype(np.float64).sum(), rtol=1e-4)


def test_int32_full_reductions_wrap_and_split_between_threads():
    b = GraphBuilder("ints")
    k = b.input("k", [300, 1000], "int32")
    graph = b.build([b.reduce_sum(k, axes=[0, 1], out="s"), b.reduce_min(k, out="lo")])
    compiled = compile(graph, options=Options(threads=2))
    assert "partials " in schedule_to_text(compiled.kernels[0].schedule)
    ks = np.random.default_rng(2).integers(-2**31, 2**31, (300, 1000)).astype(np.int32)
    got, want = compiled(k=ks), run_reference(graph, {"k": ks})
    assert got["s"] == want["s"] and got["lo"] == want["lo"] == ks.min()


@pytest.mark.parametrize("points, n", [
    # a box: counted by its extents (isl's count visits every point: 1e13 never ends)
    ("{ A[i, j, k] : 0 <= i < 100000 and 0 <= j < 100000 and 5 <= k < 1005 }", 10**13),
    ("{ A[i, j] : 0 <= i < 4 and 0 <= j < 3 or 4 <= i < 6 and 0 <= j < 3 }", 18),  # coalesced
    ("{ A[] }", 1),
    ("{ A[i, j] : 0 <= i < 5 and i <= j < 9 }", 35),  # not boxes: isl's count
    ("{ A[i] : 0 <= i < 10 and i mod 2 = 0 }", 5),
    ("{ A[i, j] : 0 <= i < 4 and 0 <= j < 3 or 6 <= i < 8 and 0 <= j < 3 }", 18),
    ("{ A[i] : 1 = 0 }", 0),
])
def test_footprints_are_counted_exactly(points, n):
    assert count(isl.Set(points)) == n

