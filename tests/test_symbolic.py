"""Symbolic dims: shape rules, load-time and call-time errors, one compile for every size.

The shape rule of every op is checked against itself: the symbolic output shape with
values substituted must be the shape the loader infers for the static graph of those
values (hypothesis draws them), and where the static graph is refused the symbolic one
must refuse the call. Compiled kernels are compared with the reference executor.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import polyc
from polyc.errors import GraphError
from polyc.graph.binding import bind_symbols
from polyc.graph.load import load_graph
from polyc.graph.ops import OPS
from polyc.graph.reference import random_inputs, run_reference
from polyc.graph.symbols import substitute_shape
from test_differential import CASES
from test_microkernels import _isa

# (op, input shapes, attrs, dtypes) per case; N and M are symbols in [1, 40]
SHAPE_CASES = [
    ("exp", [["N", 3]], {}, None),
    ("add", [["N", 1], [1, "M"]], {}, None),
    ("mul", [["N", "M"], ["M"]], {}, None),
    ("add", [["N", 3], ["M", 3]], {}, None),  # N == M assumed, checked per call
    ("greater", [["N", 4], [4]], {}, None),
    ("select", [["N", 4], ["N", 4], [1]], {}, None),
    ("reduce_sum", [["N", "M", 2]], {"axes": [1], "keepdims": True}, None),
    ("reduce_max", [["N", 5]], {}, None),
    ("matmul", [["N", 8], [8, "M"]], {}, None),
    ("matmul", [[2, "N", 8], ["M", 8]], {"transpose_b": True}, None),
    ("conv2d", [[1, 3, "N", "M"], [4, 3, 3, 3]], {"pads": [1, 1, 1, 1]}, None),
    ("conv2d", [[1, 3, "N", 9], [4, 3, 2, 2]], {"strides": [2, 2]}, None),
    ("transpose", [["N", 3, "M"]], {"perm": [2, 0, 1]}, None),
    ("reshape", [["N", 6]], {"shape": [-1, 3]}, None),
    ("reshape", [["N", "M"]], {"shape": [-1]}, None),
    ("broadcast_to", [["N", 1]], {"shape": [5, 7]}, None),
    ("slice", [["N", 6]], {"starts": [1, 0], "ends": [-1, 4]}, None),
    ("slice", [["N"]], {"starts": [2], "ends": [1000]}, None),
    ("slice", [["N"]], {"starts": [-3], "ends": [10]}, None),
    ("concat", [["N", 2], ["M", 2], [3, 2]], {"axis": 0}, None),
    ("pad", [["N", "M"]], {"pads": [[1, 2], [0, 3]]}, None),
    ("cast", [["N"]], {"to": "int32"}, None),
    ("one_hot", [["N"], [], []], {"depth": 4}, ["int32", "float32", "float32"]),
    ("softmax", [["N", "M"]], {"axis": 0}, None),
    ("log_softmax", [["N", 3]], {}, None),
    ("logsumexp", [["N", 3]], {"axes": [0]}, None),
    ("reduce_mean", [["N", "M"]], {"axes": [1]}, None),
    ("variance", [["N", 4]], {"keepdims": True}, None),
    ("layer_norm", [["N", 8], [8], [8]], {}, None),
    ("rms_norm", [["N", "M"], ["M"]], {}, None),
    ("batch_norm", [["N", 3, "M"]] + [[3]] * 4, {}, None),
    ("gelu", [["N"]], {"approximate": "tanh"}, None),
    ("silu", [["N", 2]], {}, None),
    ("linear", [["N", 8], [8, 5], [5]], {}, None),
    ("attention", [["N", 4], ["M", 4], ["M", 6]], {"causal": True}, None),
    ("reduce_min", [["N"]], {}, None),
]


def doc(op, shapes, attrs, dtypes, values=None):
    sub = (lambda d: values.get(d, d) if isinstance(d, str) else d) if values else (lambda d: d)
    names = [f"x{k}" for k in range(len(shapes))]
    return {"name": op, "inputs": [{"name": n, "shape": [sub(d) for d in s],
                                    "dtype": (dtypes or ["float32"] * len(shapes))[k]}
                                   for k, (n, s) in enumerate(zip(names, shapes))],
            "nodes": [{"op": op, "inputs": names, "outputs": ["y"], "attrs": attrs}],
            "outputs": ["y"],
            **({} if values else {"symbols": {s: {"min": 1, "max": 40} for s in
                                              {d for sh in shapes for d in sh if isinstance(d, str)}}})}


def test_every_op_has_a_shape_case():
    assert set(OPS) <= {c[0] for c in SHAPE_CASES} | {
        "neg", "abs", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "relu", "reciprocal",
        "floor", "ceil", "sub", "div", "pow", "maximum", "minimum", "less", "equal",
        "greater_equal", "less_equal", "not_equal", "reduce_prod"}  # same rule as a listed one


@pytest.mark.parametrize("case", SHAPE_CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(SHAPE_CASES)])
@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 40), m=st.integers(1, 40))
def test_shape_rule_matches_the_static_one(case, n, m):
    symbolic = load_graph(doc(*case))
    values = {"N": n, "M": m}
    try:
        static = load_graph(doc(*case, values=values))
    except GraphError:
        static = None
    shapes = {t.name: substitute_shape(t.type.shape, values) for t in symbolic.inputs}
    if static is None:  # the static graph is refused: so must the call be
        with pytest.raises(GraphError):
            bind_symbols(symbolic, shapes)
        return
    try:
        bound = bind_symbols(symbolic, shapes)
    except GraphError as e:
        # stricter than numpy only through what shape inference assumed (a symbol never
        # broadcasts as a 1, a slice's end is not clamped unless its range decides it)
        assert "(with M=" in str(e) or "(with N=" in str(e), str(e)
        assert symbolic.assumptions
        return
    assert substitute_shape(symbolic.types["y"].shape, bound) == static.types["y"].shape


# --- load-time errors ---------------------------------------------------------------

def _load_error(d) -> str:
    with pytest.raises(GraphError) as e:
        load_graph(d)
    return str(e.value)


def test_a_contradiction_for_every_value_names_the_node():
    d = {"inputs": [{"name": "x", "shape": ["N"]}],
         "nodes": [{"op": "pad", "inputs": ["x"], "outputs": ["p"], "attrs": {"pads": [[0, 1]]}},
                   {"op": "add", "inputs": ["p", "x"], "outputs": ["y"], "name": "bad"}],
         "outputs": ["y"]}
    msg = _load_error(d)
    assert "node 'bad' (add): field 'inputs'" in msg and "[N + 1] and [N]" in msg


def test_a_contradiction_outside_the_range_is_a_load_error():
    d = {"inputs": [{"name": "x", "shape": ["N"]}, {"name": "w", "shape": [100]}],
         "nodes": [{"op": "add", "inputs": ["x", "w"], "outputs": ["y"]}],
         "outputs": ["y"], "symbols": {"N": {"min": 1, "max": 64}}}
    assert "cannot be broadcast" in _load_error(d)


@pytest.mark.parametrize("symbols, field, words", [
    ({"1N": {}}, "symbols.1N", "not an identifier"),
    ({"N": {"min": 9, "max": 2}}, "symbols.N", "greater than max"),
    ({"N": {"min": 0}}, "symbols.N.min", "integer from 1"),
    ({"N": {"step": 2}}, "symbols.N.step", "unknown field"),
    ({"N": {}, "K": {}}, "symbols.K", "no input's shape uses it"),
    ([1], "symbols", "must be an object"),
])
def test_bad_symbols_name_the_field(symbols, field, words):
    d = {"inputs": [{"name": "x", "shape": ["N"]}],
         "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"],
         "symbols": symbols}
    msg = _load_error(d)
    assert f"field '{field}'" in msg and words in msg


def test_a_symbol_where_a_constant_is_required():
    d = {"inputs": [{"name": "x", "shape": ["N", 4]}],
         "nodes": [{"op": "reshape", "inputs": ["x"], "outputs": ["y"], "name": "r",
                    "attrs": {"shape": ["N", 2, 2]}}], "outputs": ["y"]}
    msg = _load_error(d)
    assert "node 'r' (reshape): field 'attrs.shape'" in msg and "symbol ('N')" in msg
    const = {"inputs": [], "nodes": [], "outputs": ["c"],
             "constants": [{"name": "c", "shape": ["N"], "data": [1.0]}]}
    assert "node 'c': field 'shape'" in _load_error(const)
    bad_dim = {"inputs": [{"name": "x", "shape": ["N+1"]}], "nodes": [], "outputs": ["x"]}
    assert "or a symbol" in _load_error(bad_dim)


def test_reshape_that_is_not_integral_for_every_value():
    d = {"inputs": [{"name": "x", "shape": ["N", 3]}],
         "nodes": [{"op": "reshape", "inputs": ["x"], "outputs": ["y"], "attrs": {"shape": [2, -1]}}],
         "outputs": ["y"]}
    assert "for every value of N" in _load_error(d)


def test_static_graphs_stay_static():
    g = load_graph(doc("matmul", [[4, 8], [8, 3]], {}, None, values={"x": 1}))
    assert not g.symbols and "symbols" not in g.to_json()
    assert all(type(d) is int for t in g.types.values() for d in t.shape)


# --- compiled: one compile, many sizes ------------------------------------------------

SOFTMAX = {"name": "sm", "inputs": [{"name": "x", "shape": ["N", 24]},
                                    {"name": "b", "shape": ["N", 1]}],
           "nodes": [{"op": "add", "inputs": ["x", "b"], "outputs": ["h"]},
                     {"op": "softmax", "inputs": ["h"], "outputs": ["y"]}],
           "outputs": ["y"], "symbols": {"N": {"min": 1, "max": 4096}}}


@pytest.fixture(scope="module")
def softmax():
    return polyc.compile(SOFTMAX)


def test_one_compile_runs_every_size(softmax):
    assert "int64_t polyc_sym_N" in softmax.c_source
    graph = load_graph(SOFTMAX)
    for n in (1, 5, 300):
        inputs = random_inputs(graph, seed=n, symbols={"N": n})
        got, want = softmax(**inputs), run_reference(graph, inputs)
        assert got["y"].shape == (n, 24)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("c,size,o,options,sliced", [
    (64, 30, 32, {"gemm_kernel": "sgemm_vec_6x16"}, True),  # a copy of 4 MB for 16 images
    # K 1152: the window kernel (AVX-512's; avx2's 6x16 packs this B)
    (128, 14, 64, {"microkernel_isa": "avx512"}, False),
], ids=["copy-past-2mb", "window-kernel"])
def test_a_symbolic_batch_of_convolutions_reads_its_windows_in_place(c, size, o, options,
                                                                     sliced):
    """A window read in place over a batch N in [1, 16] (the batch's extent a symbol in
    codegen, `analysis._b_rows`; it had fallen back to the portable loops). A padded
    copy of all 16 images that would pass SLICED_COPY at some probes and not at others
    is made image by image (`CpuOptions.fold_batch`); one under it at every probe, for
    all the images."""
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (o, c, 3, 3)).astype(np.float32) / np.float32(np.sqrt(9 * c))
    doc = {"name": "conv", "inputs": [{"name": "x", "shape": ["N", c, size, size],
                                      "dtype": "float32"}],
           "constants": [{"name": "w", "shape": [o, c, 3, 3], "dtype": "float32",
                          "data": w.ravel().tolist()}],
           "nodes": [{"op": "conv2d", "inputs": ["x", "w"], "outputs": ["y"],
                      "attrs": {"pads": [1, 1, 1, 1]}}],
           "outputs": ["y"], "symbols": {"N": {"min": 1, "max": 16}}}
    if "microkernel_isa" in options:
        _isa(options["microkernel_isa"])  # skips where the target has none or cannot run it
    compiled = polyc.compile(doc, options={"threads": 1, **options})
    (kernel,) = compiled.kernels
    assert kernel.microkernels, kernel.fusion_report
    plans = [line.split('"')[1] for line in kernel.to_json()["schedule_text"].splitlines()
             if 'mark: "gemm ' in line]
    assert len(plans) == 1 and "b=rows" in plans[0], plans
    assert ("sliced=1" in plans[0]) == sliced, plans
    graph = load_graph(doc)
    for n in (1, 2, 9, 16):
        inputs = random_inputs(graph, seed=n, symbols={"N": n})
        got, want = compiled(**inputs), run_reference(graph, inputs)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4)


def test_call_time_mismatch_names_inputs_and_symbol(softmax):
    with pytest.raises(GraphError) as e:
        softmax(x=np.ones((3, 24), np.float32), b=np.ones((4, 1), np.float32))
    assert "symbol N: 3 from input 'x' axis 0 but 4 from input 'b' axis 0" in str(e.value)
    with pytest.raises(GraphError) as e:
        softmax(x=np.ones((5000, 24), np.float32), b=np.ones((5000, 1), np.float32))
    assert "symbol N = 5000" in str(e.value) and "[1, 4096]" in str(e.value)
    with pytest.raises(GraphError) as e:
        softmax(x=np.ones((3, 25), np.float32), b=np.ones((3, 1), np.float32))
    assert "input 'x' must be float32[N,24]" in str(e.value)


def test_call_time_size_limit():
    """Kernels index with C ints: a binding that makes a tensor too large is refused."""
    big = load_graph({"inputs": [{"name": "x", "shape": ["N", 4096]}],
                      "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}],
                      "outputs": ["y"]})
    with pytest.raises(GraphError) as e:
        bind_symbols(big, {"x": (1 << 17, 4096)})
    assert "over the limit of 268435456 per tensor" in str(e.value)


def test_call_time_assumption_names_the_node():
    d = {"inputs": [{"name": "x", "shape": ["N", 3]}, {"name": "z", "shape": ["M", 3]}],
         "nodes": [{"op": "add", "inputs": ["x", "z"], "outputs": ["y"], "name": "sum"}],
         "outputs": ["y"]}
    compiled = polyc.compile(d)
    out = compiled(x=np.ones((4, 3), np.float32), z=np.ones((4, 3), np.float32))
    assert out["y"].shape == (4, 3)
    with pytest.raises(GraphError) as e:
        compiled(x=np.ones((4, 3), np.float32), z=np.ones((1, 3), np.float32))
    assert "node 'sum' (add)" in str(e.value) and "M=1, N=4" in str(e.value)


def test_other_targets_refuse_naming_the_target():
    with pytest.raises(GraphError) as e:
        polyc.compile(SOFTMAX, "npu", build=False)
    assert "field 'target'" in str(e.value) and "'npu'" in str(e.value)


# --- the differential cases, symbolic ------------------------------------------------

def _symbolic_case(c):
    """The case's graph with every input dim equal to its first input's first dim > 1
    made the symbol N, and its inputs; None when no input has such a dim."""
    from test_differential import Inputs
    b = polyc.GraphBuilder("case")
    x = Inputs(b, np.random.default_rng(20240601))
    graph = b.build(outputs=c.make(b, x))
    dims = [d for t in graph.inputs for d in t.type.shape if d > 1]
    if not dims:
        return None, None
    doc = graph.to_json()
    for t in doc["inputs"]:
        t["shape"] = ["N" if d == dims[0] else d for d in t["shape"]]
    doc["symbols"] = {"N": {"min": 2, "max": 4 * dims[0]}}
    return doc, dict(x)


# the cases a symbolic N cannot compile, each refused with a message saying why: a
# reshape that is not integral for every N, a step on a symbolic axis, a fusion the
# oracle makes at N = 5 and 7 but not at 11 (N in [2, 12])
REFUSED = {"reshape": "for every value of N", "slice-steps-negative": "a step of 3",
           "rms_norm": "fusion groups"}
# cases once refused that compile now: a mean's 1/N computed from the bound N, tiles
# not balanced to N
ONCE_REFUSED = ("reduce_mean-variance", "variance-all", "size1-everywhere",
                "parallel-elementwise-broadcast")


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES])
def test_differential_case_symbolic_at_two_sizes(c):
    doc, inputs = _symbolic_case(c)
    if doc is None:
        pytest.skip("no input dim to make symbolic")
    if c.id in REFUSED:
        with pytest.raises(GraphError) as e:
            polyc.compile(doc, build=False)
        assert REFUSED[c.id] in str(e.value)
        return
    graph = load_graph(doc)
    compiled = polyc.compile(graph)
    d = graph.symbols["N"][1] // 4
    for n in (d, d + 3):
        values = {k: np.resize(v, substitute_shape(graph.types[k].shape, {"N": n}))
                  for k, v in inputs.items()}
        try:
            want = run_reference(graph, values)
        except GraphError:  # this size breaks what the graph assumed: so must the call
            with pytest.raises(GraphError):
                compiled(**values)
            continue
        got = compiled(**values)
        for name in graph.outputs:
            np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64),
                                       rtol=1e-4, atol=1e-5, err_msg=name)


# --- front end and service -------------------------------------------------------------

def test_onnx_dim_param_is_a_symbol():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    w = np.random.default_rng(0).random((16, 8)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [onnx.numpy_helper.from_array(w, "w")])
    graph = polyc.import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert graph.to_json()["inputs"][0]["shape"] == ["batch", 16]
    compiled = polyc.compile(graph)
    for n in (1, 6):
        x = np.random.default_rng(n).random((n, 16)).astype(np.float32)
        np.testing.assert_allclose(compiled(x=x)["y"], run_reference(graph, {"x": x})["y"],
                                   rtol=1e-5, atol=1e-7)


def test_service_round_trip(tmp_path):
    import warnings
    from polyc.server import Settings, create_app
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/cache.sqlite3", workers=1))
    with TestClient(app) as client:
        r = client.post("/v1/compile", json={"graph": SOFTMAX})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert "int64_t polyc_sym_N" in answer["c_source"]
        record = client.get(f"/v1/kernels/{answer['key']}").json()
        assert record["kernels"][0]["arrays"][0]["shape"] == ["N", 24]
        again = client.post("/v1/compile", json={"graph": SOFTMAX}).json()
        assert again["cache_hit"] and again["key"] == answer["key"]  # one entry for every N
        for n in (3, 200):
            run = client.post(f"/v1/kernels/{answer['key']}/run", json={"symbols": {"N": n}})
            assert run.status_code == 200, run.text
            assert all(o["ok"] for o in run.json()["outputs"])
        bad = client.post(f"/v1/kernels/{answer['key']}/run", json={"symbols": {"N": 0}})
        assert bad.status_code == 422 and "symbols.N" in bad.text
