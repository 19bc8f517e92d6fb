"""polyc.import_akg: MindSpore's semantics per op (checked against numpy written from
MindSpore's operator documentation, then compiled and checked against the reference
executor), and one test per error a bad composite kernel gets."""
from __future__ import annotations

import json

import numpy as np
import pytest

import polyc
from polyc.errors import GraphError
from polyc.graph.reference import run_reference


def t(name, shape, dtype="float32", fmt="DefaultFormat", **extra):
    return {"tensor_name": name, "shape": list(shape), "data_type": dtype, "format": fmt,
            **extra}


def op(name, inputs, output, **attrs):
    """An op_desc entry; `inputs` are tensors or lists of tensors (AddN, Concat)."""
    return {"name": name, "attr": [{"name": k, "value": v} for k, v in attrs.items()] or None,
            "input_desc": [i if isinstance(i, list) else [i] for i in inputs],
            "output_desc": [output], "impl_path": ""}


def kernel(inputs, ops, outputs):
    return {"composite": True, "op": "Fused_test", "process": "cuda", "platform": "AKG",
            "input_desc": [[i] for i in inputs], "op_desc": ops, "output_desc": outputs}


def run(doc, **arrays):
    """The graph's outputs compiled for the cpu, after checking them against the
    reference executor (exactly for bool and int32)."""
    graph = polyc.import_akg(doc)
    got = polyc.compile(graph)(**arrays)
    ref = run_reference(graph, arrays)
    for name, r in ref.items():
        assert got[name].dtype == r.dtype and got[name].shape == r.shape, name
        if r.dtype.kind == "f":
            np.testing.assert_allclose(got[name], r, rtol=1e-5 if r.dtype == np.float32 else 2e-3)
        else:
            np.testing.assert_array_equal(got[name], r)
    return got


RNG = np.random.default_rng(7)


def test_elementwise_with_constant_and_scheduling_attributes_ignored():
    x = t("input_0", [4, 8])
    doc = kernel([x], [op("Mul", [x, t("input_1", [1], value=0.5)], t("output_0_0", [4, 8]),
                          pri_format="DefaultFormat", visited=True),
                       op("Sqrt", [t("output_0_0", [4, 8])], t("output_0_1", [4, 8]))],
                 [t("output_0_1", [4, 8])])
    a = RNG.uniform(0.5, 2, (4, 8)).astype(np.float32)
    np.testing.assert_allclose(run(doc, input_0=a)["output_0_1"], np.sqrt(a * 0.5), rtol=1e-6)


@pytest.mark.parametrize("ms, fn", [("Greater", np.greater), ("GreaterEqual", np.greater_equal),
                                    ("Less", np.less), ("LessEqual", np.less_equal),
                                    ("Equal", np.equal), ("NotEqual", np.not_equal)])
def test_compare_ops_give_bool(ms, fn):
    a, b = t("a", [6, 5], "float16"), t("b", [5], "float16")
    doc = kernel([a, b], [op(ms, [a, b], t("c", [6, 5], "bool"))], [t("c", [6, 5], "bool")])
    x = RNG.integers(0, 3, (6, 5)).astype(np.float16)
    y = RNG.integers(0, 3, (5,)).astype(np.float16)
    got = run(doc, a=x, b=y)["c"]
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, fn(x, y))


def test_logical_ops_select_and_is_inf_is_nan():
    x, m = t("x", [16]), t("m", [16], "bool")
    inf, nan, either = t("inf", [16], "bool"), t("nan", [16], "bool"), t("either", [16], "bool")
    keep, sel = t("keep", [16], "bool"), t("sel", [16])
    doc = kernel([x, m], [op("IsInf", [x], inf), op("IsNan", [x], nan),
                          op("LogicalOr", [inf, nan], either),
                          op("LogicalNot", [either], t("fin", [16], "bool")),
                          op("LogicalAnd", [t("fin", [16], "bool"), m], keep),
                          op("Select", [keep, x, t("zero", [1], value=0.0)], sel)],
                 [either, sel])
    xs = RNG.uniform(-3, 3, 16).astype(np.float32)
    xs[[1, 5, 9]] = [np.inf, -np.inf, np.nan]
    ms = RNG.integers(0, 2, 16).astype(bool)
    got = run(doc, x=xs, m=ms)
    np.testing.assert_array_equal(got["either"], ~np.isfinite(xs))
    np.testing.assert_array_equal(got["sel"], np.where(np.isfinite(xs) & ms, xs, 0))


def test_int64_and_bfloat16_tensors():
    i, x = t("i", [4, 8], "int64"), t("x", [4, 8], "bfloat16")
    ib, prod, inf = t("ib", [4, 8], "bfloat16"), t("p", [4, 8], "bfloat16"), t("inf", [4, 8], "bool")
    total, shifted = t("total", [4], "int64"), t("shifted", [4, 8], "int64")
    doc = kernel([i, x], [op("Cast", [i], ib, dst_type="bfloat16"),
                          op("Mul", [ib, x], prod), op("IsInf", [prod], inf),
                          op("ReduceSum", [i], total, axis=[1], keep_dims=False),
                          op("Add", [i, t("big", [1], "int64", value=2**40)], shifted)],
                 [prod, inf, total, shifted])
    rng = np.random.default_rng(3)  # its own: the tests after it keep RNG's values
    ints = rng.integers(-2**20, 2**20, (4, 8))
    xs = rng.uniform(-2, 2, (4, 8)).astype("bfloat16")
    xs[0, :2] = [np.inf, 3e38]  # 3e38 * an integer overflows bfloat16 too
    got = run(doc, i=ints, x=xs)
    np.testing.assert_array_equal(got["total"], ints.sum(1))
    np.testing.assert_array_equal(got["shifted"], ints + 2**40)
    with np.errstate(over="ignore"):
        want = ints.astype("bfloat16").astype(np.float32) * xs.astype(np.float32)
    np.testing.assert_allclose(got["p"].astype(np.float32), want, rtol=8e-3)
    np.testing.assert_array_equal(got["inf"], np.isinf(want.astype("bfloat16")))


def test_reductions_cast_broadcast_and_mindspore_scalars():
    x = t("x", [4, 6, 5])
    s = t("s", [1])  # MindSpore's shape of a whole reduction is [1]
    doc = kernel([x], [op("ReduceSum", [x], s, axis=[], keep_dims=False),
                       op("ReduceMax", [x], t("m", [4, 1, 5]), axis=1, keep_dims=True),
                       op("BroadcastTo", [t("m", [4, 1, 5])], t("b", [4, 6, 5]),
                          shape=[-1, 6, -1]),
                       op("Cast", [t("b", [4, 6, 5])], t("h", [4, 6, 5], "float16"),
                          dst_type="float16", is_backed_cast=False)],
                 [s, t("h", [4, 6, 5], "float16")])
    a = RNG.uniform(0.5, 2, (4, 6, 5)).astype(np.float32)
    got = run(doc, x=a)
    np.testing.assert_allclose(got["s"], [a.sum()], rtol=1e-5)
    np.testing.assert_array_equal(got["h"], np.broadcast_to(a.max(1, keepdims=True),
                                                            a.shape).astype(np.float16))


def test_matmul_transposes_and_dst_type():
    a, b = t("a", [8, 6], "float16"), t("b", [5, 8], "float16")
    doc = kernel([a, b], [op("MatMul", [a, b], t("c", [6, 5]), transpose_a=True,
                             transpose_b=True, transpose_x1=True, transpose_x2=True,
                             dst_type="float32", left_format="DefaultFormat")],
                 [t("c", [6, 5])])
    x = RNG.uniform(-1, 1, (8, 6)).astype(np.float16)
    y = RNG.uniform(-1, 1, (5, 8)).astype(np.float16)
    got = run(doc, a=x, b=y)["c"]
    np.testing.assert_allclose(got, x.astype(np.float32).T @ y.astype(np.float32).T, rtol=1e-5)


def test_conv2d_nhwc():
    x, w = t("x", [2, 9, 9, 3], fmt="NHWC"), t("w", [4, 3, 3, 3], fmt="NHWC")
    doc = kernel([x, w], [op("Conv2D", [x, w], t("y", [2, 4, 4, 4], fmt="NHWC"),
                             stride=[1, 1, 2, 2], dilation=[1, 1, 1, 1],
                             pad_list=[0, 1, 1, 0], groups=1, group=1, mode=1,
                             kernel_size=[3, 3], out_channel=4, format="NCHW",
                             pad_mode="pad", pad=[0, 1, 1, 0])],
                 [t("y", [2, 4, 4, 4], fmt="NHWC")])
    rng = np.random.default_rng(11)  # its own: under xdist RNG's state depends on the worker
    xs = rng.uniform(-1, 1, (2, 9, 9, 3)).astype(np.float32)
    ws = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    got = run(doc, x=xs, w=ws)["y"]
    # pad_list is [top, bottom, left, right]: rows 0 before and 1 after, columns 1 and 0
    xp = np.pad(xs, ((0, 0), (0, 1), (1, 0), (0, 0)))
    want = np.zeros((2, 4, 4, 4), np.float64)
    for i in range(4):
        for j in range(4):
            patch = xp[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3, :]
            want[:, i, j, :] = np.einsum("nhwc,ohwc->no", patch, ws)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_pad_unpad_concat_add_n_one_hot_elem_any():
    x = t("x", [3, 5])
    idx = t("idx", [4], "int32")
    doc = kernel([x, idx], [
        op("PadAkg", [x], t("p", [3, 8]), head=[0, 1], tail=[0, 2], pad_val=0),
        op("UnPadAkg", [t("p", [3, 8])], t("u", [3, 6]), tail=[0, 2]),
        op("Concat", [[x, x]], t("c", [6, 5]), axis=0, N=2, inputNums=2, dyn_input_sizes=[2]),
        op("AddN", [[x, x, x]], t("n", [3, 5]), n=3, dyn_input_sizes=[3]),
        op("OneHot", [idx, t("on", [1], value=2.0), t("off", [1], value=-1.0)],
           t("oh", [4, 3]), depth=3, axis=-1),
        op("Greater", [x, t("half", [1], value=1.5)], t("g", [3, 5], "bool")),
        op("ElemAny", [t("g", [3, 5], "bool")], t("any", [1]), dst_type="float32")],
        [t("u", [3, 6]), t("c", [6, 5]), t("n", [3, 5]), t("oh", [4, 3]), t("any", [1])])
    xs = RNG.uniform(0.5, 1.4, (3, 5)).astype(np.float32)
    xs[2, 3] = 1.9
    ids = np.array([0, 2, 5, -1], np.int32)  # out of range: all off, as MindSpore
    got = run(doc, x=xs, idx=ids)
    np.testing.assert_array_equal(got["u"], np.pad(xs, ((0, 0), (1, 0))))
    np.testing.assert_array_equal(got["c"], np.concatenate([xs, xs]))
    np.testing.assert_allclose(got["n"], 3 * xs, rtol=1e-6)
    np.testing.assert_array_equal(got["oh"], [[2, -1, -1], [-1, -1, 2], [-1] * 3, [-1] * 3])
    np.testing.assert_array_equal(got["any"], [1.0])


def test_inplace_assign_and_assign_store_into_extra_outputs():
    w, g = t("input_0", [4, 3]), t("input_1", [4, 3])
    new, ret = t("output_0_0", [4, 3]), t("output_0_1", [4, 3])
    doc = kernel([w, g, t("input_2", [4, 3])],
                 [op("Sub", [w, g], new),
                  op("InplaceAssign", [w, new, g], ret, fake_output=True),
                  op("Assign", [t("input_2", [4, 3]), new], t("output_0_2", [4, 3]),
                     side_effect_mem=True)],
                 [ret, t("output_0_2", [4, 3])])
    graph = polyc.import_akg(json.dumps(doc))
    assert graph.outputs == ("output_0_1", "output_0_2", "input_0.assigned", "input_2.assigned")
    a, b, c = (RNG.uniform(0, 1, (4, 3)).astype(np.float32) for _ in range(3))
    got = run(doc, input_0=a, input_1=b, input_2=c)
    np.testing.assert_array_equal(got["output_0_1"], b)
    np.testing.assert_allclose(got["input_0.assigned"], a - b)
    np.testing.assert_allclose(got["input_2.assigned"], a - b)


# --- FRACTAL_NZ: Ascend's blocked layout, as data movement around the ND matrices ------

def nz(a):
    """FRACTAL_NZ of [..., M, N] in numpy: element (m, n) at [..., n//16, m//16, m%16, n%16]."""
    *batch, m, n = a.shape
    out = np.empty((*batch, n // 16, m // 16, 16, 16), a.dtype)
    rows, cols = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
    out[..., cols // 16, rows // 16, rows % 16, cols % 16] = a
    return out


def test_fractal_nz_softmax_with_plain_operands_and_reductions_on_nz_axes():
    # a batch of 2 matrices 32 x 48: NZ [2, N1=3, M1=2, 16, 16]
    x, bias = t("x", [2, 3, 2, 16, 16], fmt="FRACTAL_NZ"), t("bias", [48])
    a, e = t("a", [2, 3, 2, 16, 16], fmt="FRACTAL_NZ"), t("e", [2, 3, 2, 16, 16], fmt="FRACTAL_NZ")
    m5, m, d = t("m5", [2, 1, 2, 16, 1]), t("m", [2, 32, 1]), t("d", [2, 3, 2, 16, 16], fmt="FRACTAL_NZ")
    rows, cols = t("rows", [2, 2, 16]), t("cols", [2, 3, 1, 1, 16])
    batch = t("batch", [3, 2, 16, 16], fmt="FRACTAL_NZ")
    softmax = [op("Add", [x, bias], a, pri_format="FRACTAL_NZ"),
               op("ReduceMax", [a], m5, axis=[1, 4], keep_dims=True),
               op("Reshape", [m5], m, shape=[2, 32, 1]),
               op("Sub", [a, m], d),
               op("Exp", [d], e),
               op("ReduceSum", [e], rows, axis=[-4, -1], keep_dims=False)]
    doc = kernel([x, bias], softmax + [
        op("ReduceSum", [e], cols, axis=[2, 3], keep_dims=True),
        op("ReduceSum", [e], batch, axis=[0], keep_dims=False)], [e, rows, cols, batch])
    xd = RNG.uniform(-2, 2, (2, 32, 48)).astype(np.float32)
    bd = RNG.uniform(-1, 1, (48,)).astype(np.float32)
    graph = polyc.import_akg(doc)
    assert graph.types["x"].shape == (2, 3, 2, 16, 16) and graph.types["e"].shape == (2, 3, 2, 16, 16)
    got = run(doc, x=nz(xd), bias=bd)
    ad = xd + bd
    ed = np.exp(ad - ad.max(-1, keepdims=True))
    np.testing.assert_allclose(got["e"], nz(ed), rtol=1e-5)
    np.testing.assert_allclose(got["rows"], ed.sum(-1).reshape(2, 2, 16), rtol=1e-5)
    np.testing.assert_allclose(got["cols"], ed.sum(-2).reshape(2, 3, 1, 1, 16), rtol=1e-5)
    np.testing.assert_allclose(got["batch"], nz(ed.sum(0)), rtol=1e-5)
    # the movement folds into the accesses of the row-wise kernel: one, as AKG's
    assert len(polyc.compile(polyc.import_akg(kernel([x, bias], softmax, [e, rows]))).kernels) == 1


def test_fractal_nz_matmul_with_bias_and_transposed_operand():
    # [32 x 64] @ [64 x 48] + bias, float16 in and out; then A^T B with A stored [64 x 32],
    # into float32
    a, b = t("a", [4, 2, 16, 16], "float16", "FRACTAL_NZ"), t("b", [3, 4, 16, 16], "float16", "FRACTAL_NZ")
    bias, at = t("bias", [48], "float16"), t("at", [2, 4, 16, 16], "float16", "FRACTAL_NZ")
    y = t("y", [3, 2, 16, 16], "float16", "FRACTAL_NZ")
    z = t("z", [3, 2, 16, 16], "float32", "FRACTAL_NZ")
    doc = kernel([a, b, bias, at], [
        op("MatMul", [a, b, bias], y, transpose_a=False, transpose_b=False, dst_type="float16",
           left_format="FRACTAL_NZ", right_format="FRACTAL_NZ"),
        op("MatMul", [at, b], z, transpose_a=True, transpose_b=False, dst_type="float32")],
        [y, z])
    # small integers: every sum is exact in either order, so a value out of place shows
    ad = RNG.integers(-3, 4, (32, 64)).astype(np.float16)
    bd = RNG.integers(-3, 4, (64, 48)).astype(np.float16)
    cd = RNG.integers(-3, 4, (48,)).astype(np.float16)
    got = run(doc, a=nz(ad), b=nz(bd), bias=cd, at=nz(np.ascontiguousarray(ad.T)))
    exact = ad.astype(np.float32) @ bd.astype(np.float32)
    np.testing.assert_array_equal(got["y"], nz((exact + cd).astype(np.float16)))
    np.testing.assert_array_equal(got["z"], nz(exact))


def test_fractal_nz_errors_name_the_op_and_field():
    x = t("x", [2, 2, 16, 16], fmt="FRACTAL_NZ")
    msg = error(small(op("Reshape", [x], t("y", [1024]), shape=[1024]), inputs=[x],
                      outputs=[t("y", [1024])]))
    assert "node 'y' (Reshape)" in msg and "Reshape of FRACTAL_NZ tensors is not supported" in msg
    msg = error(small(op("ReduceSum", [x], t("y", [2, 1, 16, 16]), axis=[1], keep_dims=True),
                      inputs=[x], outputs=[t("y", [2, 1, 16, 16])]))
    assert "field 'attr.axis'" in msg and "reduces half of a FRACTAL_NZ matrix dim" in msg
    msg = error(small(op("Neg", [t("x", [2, 2, 16, 16])], t("y", [2, 2, 16, 16])), inputs=[x],
                      outputs=[t("y", [2, 2, 16, 16])]))
    assert "field 'input_desc[0]'" in msg and "described as 'DefaultFormat'" in msg
    bad = t("x", [2, 2, 16, 8], fmt="FRACTAL_NZ")
    assert "16x16 fractal" in error(small(inputs=[bad]))
    assert "at least 4 dims" in error(small(inputs=[t("x", [16, 16], fmt="FRACTAL_NZ")]))


def test_mul_in_nc1hwc0_broadcasts_over_n_h_w_only():
    g, x = t("g", [1, 2, 1, 1, 16]), t("x", [2, 2, 3, 3, 16])
    doc = kernel([g, x], [op("Mul", [g, x], t("y", [2, 2, 3, 3, 16]),
                             data_format=["NC1HWC0", "NC1HWC0"])], [t("y", [2, 2, 3, 3, 16])])
    gd = RNG.uniform(-1, 1, (1, 2, 1, 1, 16)).astype(np.float32)
    xd = RNG.uniform(-1, 1, (2, 2, 3, 3, 16)).astype(np.float32)
    np.testing.assert_allclose(run(doc, g=gd, x=xd)["y"], gd * xd, rtol=1e-6)
    c = t("c", [2, 1, 3, 3, 16])
    msg = error(kernel([c, x], [op("Mul", [c, x], t("y", [2, 2, 3, 3, 16]),
                                   data_format=["NC1HWC0", "NC1HWC0"])],
                       [t("y", [2, 2, 3, 3, 16])]))
    assert "field 'attr.data_format'" in msg and "'NC1HWC0'" in msg


def test_import_from_path(tmp_path):
    x = t("x", [3])
    path = tmp_path / "k.info"
    path.write_text(json.dumps(kernel([x], [op("Neg", [x], t("y", [3]))], [t("y", [3])])))
    graph = polyc.import_akg(path)
    assert [n.op for n in graph.nodes] == ["neg"] and graph.outputs == ("y",)


# --- errors: each names the op and the field --------------------------------------------

def error(doc) -> str:
    with pytest.raises(GraphError) as e:
        polyc.import_akg(doc)
    return str(e.value)


def small(*ops, inputs=None, outputs=None):
    x = t("x", [4, 8])
    return kernel(inputs or [x], list(ops), outputs or [t("y", [4, 8])])


def test_truncated_file(tmp_path):
    text = json.dumps(small(op("Neg", [t("x", [4, 8])], t("y", [4, 8]))))
    path = tmp_path / "cut.info"
    path.write_text(text[: len(text) // 2])
    assert "invalid JSON" in error(path)


def test_malformed_kernel():
    assert "field 'op_desc'" in error({"op": "k", "output_desc": [], "op_desc": {}})
    assert "unknown field" in error({**small(), "shapes": 1})


def test_input_referenced_before_defined():
    msg = error(small(op("Neg", [t("z", [4, 8])], t("w", [4, 8])),
                      op("Neg", [t("w", [4, 8])], t("z", [4, 8]))))
    assert "node 'w' (Neg)" in msg and "field 'input_desc[0]'" in msg
    assert "neither a kernel input nor the output of an earlier op" in msg


def test_shape_that_contradicts_the_op():
    msg = error(small(op("Add", [t("x", [4, 8]), t("x", [4, 8])], t("y", [4, 9]))))
    assert "node 'y' (Add)" in msg and "field 'output_desc'" in msg and "[4,9]" in msg
    msg = error(small(op("Add", [t("x", [4, 8]), t("c", [3], value=[1, 2, 3])],
                         t("y", [4, 8]))))
    assert "node 'y' (Add)" in msg and "cannot be broadcast" in msg
    msg = error(small(op("Neg", [t("x", [8, 4])], t("y", [4, 8]))))
    assert "field 'input_desc[0]'" in msg and "float32[4,8]" in msg


def test_attribute_of_the_wrong_type_and_unknown_attribute():
    msg = error(small(op("ReduceSum", [t("x", [4, 8])], t("y", [4, 8]), axis="1",
                         keep_dims=True)))
    assert "node 'y' (ReduceSum)" in msg and "field 'attr.axis'" in msg and "integer" in msg
    msg = error(small(op("Neg", [t("x", [4, 8])], t("y", [4, 8]), approximate=True)))
    assert "field 'attr.approximate'" in msg and "unknown attribute" in msg


def test_refused_by_name():
    nz = t("x", [4, 8], fmt="FRACTAL_NZ")
    assert "FRACTAL_NZ" in error(small(op("Neg", [nz], t("y", [4, 8])), inputs=[nz]))
    msg = error(small(op("Custom", [t("x", [4, 8])], t("y", [4, 8]), func_name="f")))
    assert "node 'y' (Custom)" in msg and "not supported" in msg
    u = t("x", [4, 8], "uint32")
    assert "data_type 'uint32' is not supported" in error(small(inputs=[u]))


def test_unknown_op_and_constant_of_the_wrong_size():
    assert "unknown op 'Frobnicate'" in error(small(op("Frobnicate", [t("x", [4, 8])],
                                                       t("y", [4, 8]))))
    msg = error(small(op("Mul", [t("x", [4, 8]), t("c", [2], value=[1.0])], t("y", [4, 8]))))
    assert "node 'y' (Mul)" in msg and "value of 'c'" in msg


# --- the command line and the service take the format -----------------------------------

NEG = kernel([t("x", [4, 8])], [op("Neg", [t("x", [4, 8])], t("y", [4, 8]))], [t("y", [4, 8])])


def test_cli_format_akg(tmp_path, capsys):
    from polyc.cli import main
    path = tmp_path / "k.info"
    path.write_text(json.dumps(NEG))
    assert main(["compile", "--format", "akg", str(path), "-o", str(tmp_path / "out")]) == 0
    assert "void polyc_k0" in (tmp_path / "out" / "kernels.c").read_text()
    bad = tmp_path / "bad.info"
    bad.write_text(json.dumps(small(op("Neg", [t("x", [4, 8])], t("y", [4, 8]), axis=1))))
    assert main(["run", "--format", "akg", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "'y' (Neg)" in err and "attr.axis" in err and "Traceback" not in err


def test_service_compiles_akg(tmp_path):
    import warnings

    from polyc.server import Settings, create_app
    with warnings.catch_warnings():  # starlette's notice about its httpx dependency
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/cache.sqlite3", workers=1))
    with TestClient(app) as client:
        r = client.post("/v1/compile", json={"akg": NEG})
        assert r.status_code == 200, r.text
        assert "void polyc_k0" in r.json()["c_source"]
        bad = client.post("/v1/compile", json={"akg": small(
            op("Neg", [t("x", [4, 8])], t("y", [4, 8]), axis=1))})
        assert bad.status_code == 422 and "attr.axis" in bad.json()["detail"]
        assert bad.json()["errors"][0]["pointer"].startswith("/akg")
        both = client.post("/v1/compile", json={"akg": NEG, "graph": {}})
        assert both.status_code == 422 and "exactly one" in both.text
        assert client.post("/v1/compile", json={}).status_code == 422


def test_mutated_corpus_files_get_graph_errors_never_crashes():
    """Real kernels with fields replaced by values of other kinds, or removed: every
    outcome is a graph or a GraphError."""
    import copy
    import random
    from pathlib import Path
    sample = sorted((Path(__file__).parent / "data" / "akg").rglob("*.info"))
    docs = [json.loads(p.read_text()) for p in sample]
    junk = [None, 0, -1, 1.5, "x", [], {}, [1], [[]], {"a": 1}, True, "bool", "NHWC", [-1, 2],
            2 ** 40]
    rng = random.Random(23)

    def places(o, path=()):
        yield path
        items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
        for k, v in items:
            yield from places(v, path + (k,))

    for _ in range(1500):
        doc = copy.deepcopy(rng.choice(docs))
        path = rng.choice(list(places(doc))[1:])
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        if rng.random() < 0.2 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = rng.choice(junk)
        try:
            polyc.import_akg(doc)
        except GraphError:
            pass
