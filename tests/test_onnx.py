"""The ONNX importer: small real networks against onnxruntime, the shape arithmetic it
folds, and bad models refused with a message naming the op, the node or the field."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc  # noqa: E402
from polyc import GraphError  # noqa: E402
from polyc.cli import main as cli  # noqa: E402
from polyc.graph.reference import run_reference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import onnx_models  # noqa: E402


def model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def io(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def check(graph, inputs, want=None, rtol=1e-5, atol=1e-5):
    got = polyc.compile(graph)(**inputs)
    ref = run_reference(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], ref[name], rtol=rtol, atol=atol)
        if want is not None:
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("name", sorted(onnx_models.MODELS))
def test_small_networks_match_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    m = onnx_models.MODELS[name]()
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    graph = polyc.import_onnx(m)
    assert [t.name for t in graph.inputs] == ["x"] and graph.outputs == ("y",) or \
        list(graph.outputs) == ["y"]
    check(graph, {"x": x}, {"y": want}, rtol=1e-4, atol=1e-5)


def test_shape_arithmetic_is_folded_at_import():
    # Reshape's target computed from Shape of a static input, as exporters write it
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "first"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "first"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    m = model(nodes, [io("x", [2, 3, 4])], [io("y", [2, 12])], inits)
    graph = polyc.import_onnx(m)
    assert [n.op for n in graph.nodes] == ["reshape"]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    check(graph, {"x": x}, {"y": x.reshape(2, 12)})


def test_composed_ops_match_their_onnx_definitions():
    from onnx.reference import ReferenceEvaluator
    ops = [("LeakyRelu", {"alpha": 0.2}), ("Elu", {}), ("Selu", {}), ("HardSigmoid", {}),
           ("HardSwish", {}), ("Softplus", {}), ("Softsign", {}), ("Mish", {}), ("Sign", {}),
           ("Floor", {}), ("Ceil", {})]
    nodes = [helper.make_node(op, ["x"], [f"y{i}"], **a) for i, (op, a) in enumerate(ops)]
    m = model(nodes, [io("x", [4, 5])], [io(f"y{i}", [4, 5]) for i in range(len(ops))])
    x = np.random.default_rng(0).uniform(-3, 3, (4, 5)).astype(np.float32)
    want = dict(zip([f"y{i}" for i in range(len(ops))], ReferenceEvaluator(m).run(None, {"x": x})))
    check(polyc.import_onnx(m), {"x": x}, want)


def test_int64_and_bfloat16_values_keep_their_dtypes():
    from onnx.reference import ReferenceEvaluator
    nodes = [helper.make_node("Max", ["i", "j"], ["m"]),
             helper.make_node("Div", ["m", "j"], ["q"]),
             helper.make_node("Cast", ["i"], ["ib"], to=TensorProto.BFLOAT16),
             helper.make_node("Mul", ["ib", "x"], ["p"]),
             helper.make_node("Softmax", ["p"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)]
    m = model(nodes, [io("i", [3, 5], TensorProto.INT64), io("j", [3, 5], TensorProto.INT64),
                      io("x", [3, 5], TensorProto.BFLOAT16)],
              [io("q", [3, 5], TensorProto.INT64), io("y", [3, 5])])
    graph = polyc.import_onnx(m)
    assert [t.type.dtype for t in graph.inputs] == ["int64", "int64", "bfloat16"]
    rng = np.random.default_rng(0)
    feeds = {"i": rng.integers(-2**40, 2**40, (3, 5)), "j": rng.integers(1, 2**20, (3, 5)),
             "x": (rng.uniform(-1, 1, (3, 5)) * 2**-40).astype("bfloat16")}
    want = dict(zip(["q", "y"], ReferenceEvaluator(m).run(None, feeds)))
    got = check(graph, feeds, rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(got["q"], want["q"])
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("t,dtype", [(TensorProto.FLOAT, np.float32),
                                     (TensorProto.BFLOAT16, "bfloat16")])
def test_infinite_and_nan_constants_are_written_as_quotients(t, dtype):
    # JSON has no Infinity: a mask of -inf (attention's) arrives as num / den of finite
    # constants (a max over nothing too: the conformance cases)
    mask = np.array([[0.0, -np.inf], [np.inf, np.nan]], dtype)
    m = model([helper.make_node("Add", ["x", "mask"], ["y"])], [io("x", [2, 2], t)],
              [io("y", [2, 2], t)], [numpy_helper.from_array(mask, "mask")])
    graph = polyc.import_onnx(m)
    assert all(np.isfinite(c.data).all() for c in graph.constants)
    x = np.array([[1.5, 2.0], [-3.0, 4.0]], dtype)
    got = polyc.compile(graph)(x=x)["y"].astype(np.float64)
    np.testing.assert_array_equal(got, (x + mask).astype(np.float64))


def test_einsum_as_a_broadcast_product_and_sum():
    m = model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bkj->bik")],
              [io("a", [2, 3, 4]), io("b", [2, 5, 4])], [io("y", [2, 3, 5])])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4), np.float32), rng.standard_normal((2, 5, 4), np.float32)
    check(polyc.import_onnx(m), {"a": a, "b": b}, {"y": np.einsum("bij,bkj->bik", a, b)})


def test_grouped_1d_conv_and_pad_modes_match_onnx():
    from onnx.reference import ReferenceEvaluator
    pads = numpy_helper.from_array(np.array([0, 0, 2, 0, 0, 3], np.int64), "pads")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=2, pads=[1, 2],
                              strides=[2]),
             *[helper.make_node("Pad", ["x", "pads"], [mode], mode=mode)
               for mode in ("edge", "reflect", "wrap")]]
    m = model(nodes, [io("x", [1, 4, 6]), io("w", [6, 2, 3]), io("b", [6])],
              [io("c", [1, 6, 4]), *[io(mode, [1, 4, 11]) for mode in ("edge", "reflect", "wrap")]],
              [pads])
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 4, 6), np.float32),
             "w": rng.standard_normal((6, 2, 3), np.float32),
             "b": rng.standard_normal(6, np.float32)}
    want = dict(zip(["c", "edge", "reflect", "wrap"], ReferenceEvaluator(m).run(None, feeds)))
    check(polyc.import_onnx(m), feeds, want)


def test_an_input_with_no_elements_is_refused_or_folded_when_frozen():
    m = model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
              [io("x", [2, 0, 3])], [io("y", [2, 1, 3])],
              [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    with pytest.raises(GraphError, match=r"input x.*has no elements \(shape \[2, 0, 3\]\)"):
        polyc.import_onnx(m)
    graph = polyc.import_onnx(m, constants={"x": np.zeros((2, 0, 3), np.float32)})
    assert not graph.inputs
    np.testing.assert_array_equal(polyc.compile(graph)()["y"], np.zeros((2, 1, 3), np.float32))


def test_identity_output_and_frozen_inputs():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Identity", ["r"], ["y"])]
    m = model(nodes, [io("x", [2, 6]), io("shape", [2], TensorProto.INT64)], [io("y", [3, 4])])
    with pytest.raises(GraphError, match=r"\(Reshape\): field 'shape': shape must be a constant"):
        polyc.import_onnx(m)
    graph = polyc.import_onnx(m, constants={"shape": np.array([3, 4], np.int64)})
    assert [t.name for t in graph.inputs] == ["x"] and list(graph.outputs) == ["y"]
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    check(graph, {"x": x}, {"y": x.reshape(3, 4)})
    with pytest.raises(GraphError, match="'constants.nope'"):
        polyc.import_onnx(m, constants={"nope": np.zeros(1)})


def test_bad_models_are_refused_naming_what_is_wrong(tmp_path):
    with pytest.raises(GraphError, match="not a readable ONNX model"):
        polyc.import_onnx(b"\x08\x07garbage that is no protobuf")
    with pytest.raises(GraphError, match="no ONNX file"):
        polyc.import_onnx(tmp_path / "missing.onnx")
    topk = model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="pick")],
                 [io("x", [4]), io("k", [1], TensorProto.INT64)],
                 [io("v", [2]), io("i", [2], TensorProto.INT64)])
    with pytest.raises(GraphError, match=r"node 'pick' \(TopK\): ONNX op TopK is not supported"):
        polyc.import_onnx(topk)
    # a named dim is a symbol (test_symbolic.py); a dim with no name cannot be bound
    dynamic = model([helper.make_node("Relu", ["x"], ["y"])], [io("x", [None, 4])],
                    [io("y", [None, 4])])
    with pytest.raises(GraphError, match="input x.*dim '\\?' is neither static nor a named"):
        polyc.import_onnx(dynamic)
    undefined = model([helper.make_node("Add", ["x", "w"], ["y"])], [io("x", [4])],
                      [io("y", [4])])
    with pytest.raises(GraphError, match=r"\(Add\): field 'input': input 'w' is not defined"):
        polyc.import_onnx(undefined)
    mismatch = model([helper.make_node("Add", ["x", "z"], ["y"])], [io("x", [4]), io("z", [3])],
                     [io("y", [4])])
    with pytest.raises(GraphError, match="shape inference refuses"):
        polyc.import_onnx(mismatch)
    old = model([helper.make_node("Relu", ["x"], ["y"])], [io("x", [4])], [io("y", [4])],
                opset=11)
    with pytest.raises(GraphError, match="opset 11"):
        polyc.import_onnx(old)
    uint8 = model([helper.make_node("Relu", ["x"], ["y"])], [io("x", [4], TensorProto.UINT8)],
                  [io("y", [4], TensorProto.UINT8)])
    with pytest.raises(GraphError, match="uint8"):
        polyc.import_onnx(uint8)
    grouped = model([helper.make_node("Conv", ["x", "w"], ["y"], group=128, name="dw")],
                    [io("x", [1, 128, 3, 3]), io("w", [128, 1, 1, 1])], [io("y", [1, 128, 3, 3])])
    with pytest.raises(GraphError, match=r"node 'dw' \(Conv\): field 'group'"):
        polyc.import_onnx(grouped)


def test_hostile_value_names_stay_data():
    name = 'x"); system("rm -rf /"); /*'
    m = model([helper.make_node("Exp", [name], ["<script>y</script>"])], [io(name, [3])],
              [io("<script>y</script>", [3])])
    graph = polyc.import_onnx(m)
    x = np.array([0, 1, 2], np.float32)
    got = check(graph, {name: x})
    np.testing.assert_allclose(got["<script>y</script>"], np.exp(x), rtol=1e-6)


def test_cli_imports_and_runs_an_onnx_file(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(onnx_models.mlp(), path)
    assert cli(["import-onnx", str(path), "-o", str(tmp_path / "mlp.json")]) == 0
    graph = polyc.load_graph(tmp_path / "mlp.json")
    assert [n.op for n in graph.nodes][:2] == ["matmul", "add"]
    assert cli(["run", str(path), "--repeat", "1"]) == 0
    assert "output y" in capsys.readouterr().out
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    assert cli(["run", str(tmp_path / "bad.onnx")]) == 2
    assert "not a readable ONNX model" in capsys.readouterr().err
