"""Small real networks as ONNX models, written with the onnx helper API (seeded weights).

    python examples/onnx_models.py [DIR]     # writes mlp.onnx, cnn.onnx, transformer.onnx,
                                             # resnet_block.onnx
    polyc run DIR/transformer.onnx           # import, compile, run, compare with the reference

- `mlp()`: Gemm -> Relu -> Gemm -> Softmax, batch 32, 256 -> 512 -> 10.
- `cnn()`: two 3x3 convolutions (the second strided) with BatchNormalization and Relu,
  a mean over the image, Flatten and Gemm: 1x3x32x32 -> 10.
- `transformer()`: one pre-norm encoder block of 4 heads on 64 tokens of width 128:
  LayerNormalization, attention written out with MatMul / Reshape / Transpose /
  Softmax, a residual Add, LayerNormalization, MatMul + bias + Gelu + MatMul + bias,
  a residual Add.
- `resnet_block()`: ResNet-18's first basic block on 1x64x56x56: two 3x3 convolutions
  with BatchNormalization, Relu and the residual Add.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 20  # Gelu's first


def _model(name: str, nodes, inputs, outputs, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(a.astype(a.dtype), n) for n, a in weights.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9  # what onnxruntime's of 2024 and later read
    onnx.checker.check_model(model, full_check=True)
    return model


def _io(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _weights(rng, **shapes) -> dict[str, np.ndarray]:
    return {n: (rng.standard_normal(s) / np.sqrt(s[0] if len(s) > 1 else 1)).astype(np.float32)
            for n, s in shapes.items()}


def mlp(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = _weights(rng, w1=(256, 512), b1=(512,), w2=(512, 10), b2=(10,))
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("Gemm", ["a", "w2", "b2"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    return _model("mlp", nodes, [_io("x", (32, 256))], [_io("y", (32, 10))], w)


def cnn(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = _weights(rng, c1=(8, 3, 3, 3), c1b=(8,), c2=(16, 8, 3, 3), c2b=(16,),
                 fc=(16, 10), fcb=(10,))
    w |= {"bn_scale": rng.uniform(0.5, 1.5, 8).astype(np.float32),
          "bn_bias": rng.uniform(-0.1, 0.1, 8).astype(np.float32),
          "bn_mean": rng.uniform(-0.1, 0.1, 8).astype(np.float32),
          "bn_var": rng.uniform(0.5, 1.5, 8).astype(np.float32),
          "axes": np.array([2, 3], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "c1", "c1b"], ["t1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["t1", "bn_scale", "bn_bias", "bn_mean",
                                                     "bn_var"], ["t2"]),
             helper.make_node("Relu", ["t2"], ["t3"]),
             helper.make_node("Conv", ["t3", "c2", "c2b"], ["t4"], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Relu", ["t4"], ["t5"]),
             helper.make_node("ReduceMean", ["t5", "axes"], ["t6"], keepdims=1),
             helper.make_node("Flatten", ["t6"], ["t7"]),
             helper.make_node("Gemm", ["t7", "fc", "fcb"], ["y"])]
    return _model("cnn", nodes, [_io("x", (1, 3, 32, 32))], [_io("y", (1, 10))], w)


def transformer(seed: int = 0, seq: int = 64, width: int = 128, heads: int = 4) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    d = width // heads
    w = _weights(rng, wq=(width, width), wk=(width, width), wv=(width, width),
                 wo=(width, width), w1=(width, 4 * width), b1=(4 * width,),
                 w2=(4 * width, width), b2=(width,))
    w |= {"g1": np.ones(width, np.float32), "be1": np.zeros(width, np.float32),
          "g2": rng.uniform(0.5, 1.5, width).astype(np.float32),
          "be2": rng.uniform(-0.1, 0.1, width).astype(np.float32),
          "heads_shape": np.array([seq, heads, d], np.int64),
          "merged_shape": np.array([seq, width], np.int64),
          "scale": np.array(1 / np.sqrt(d), np.float32)}
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "g1", "be1"], ["ln1"]),
             *[n("MatMul", ["ln1", f"w{p}"], [f"{p}0"]) for p in "qkv"],
             *[n("Reshape", [f"{p}0", "heads_shape"], [f"{p}1"]) for p in "qkv"],
             n("Transpose", ["q1"], ["q"], perm=[1, 0, 2]),
             n("Transpose", ["k1"], ["kt"], perm=[1, 2, 0]),
             n("Transpose", ["v1"], ["v"], perm=[1, 0, 2]),
             n("MatMul", ["q", "kt"], ["scores0"]),
             n("Mul", ["scores0", "scale"], ["scores"]),
             n("Softmax", ["scores"], ["p"], axis=-1),
             n("MatMul", ["p", "v"], ["ctx0"]),
             n("Transpose", ["ctx0"], ["ctx1"], perm=[1, 0, 2]),
             n("Reshape", ["ctx1", "merged_shape"], ["ctx"]),
             n("MatMul", ["ctx", "wo"], ["attn"]),
             n("Add", ["x", "attn"], ["r1"]),
             n("LayerNormalization", ["r1", "g2", "be2"], ["ln2"]),
             n("MatMul", ["ln2", "w1"], ["h0"]),
             n("Add", ["h0", "b1"], ["h1"]),
             n("Gelu", ["h1"], ["h2"]),
             n("MatMul", ["h2", "w2"], ["h3"]),
             n("Add", ["h3", "b2"], ["h4"]),
             n("Add", ["r1", "h4"], ["y"])]
    return _model("transformer", nodes, [_io("x", (seq, width))], [_io("y", (seq, width))], w)


def resnet_block(seed: int = 0, channels: int = 64, size: int = 56) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    c = channels
    w = _weights(rng, c1=(c, c, 3, 3), c2=(c, c, 3, 3))
    for k in (1, 2):
        w |= {f"s{k}": rng.uniform(0.5, 1.5, c).astype(np.float32),
              f"b{k}": rng.uniform(-0.1, 0.1, c).astype(np.float32),
              f"m{k}": rng.uniform(-0.1, 0.1, c).astype(np.float32),
              f"v{k}": rng.uniform(0.5, 1.5, c).astype(np.float32)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "c1"], ["t1"], pads=[1, 1, 1, 1]),
             n("BatchNormalization", ["t1", "s1", "b1", "m1", "v1"], ["t2"]),
             n("Relu", ["t2"], ["t3"]),
             n("Conv", ["t3", "c2"], ["t4"], pads=[1, 1, 1, 1]),
             n("BatchNormalization", ["t4", "s2", "b2", "m2", "v2"], ["t5"]),
             n("Add", ["t5", "x"], ["t6"]),
             n("Relu", ["t6"], ["y"])]
    shape = (1, c, size, size)
    return _model("resnet_block", nodes, [_io("x", shape)], [_io("y", shape)], w)


MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "resnet_block": resnet_block}


def main(out: str = ".") -> int:
    Path(out).mkdir(parents=True, exist_ok=True)  # the README's `/tmp/models`
    for name, make in MODELS.items():
        path = Path(out) / f"{name}.onnx"
        onnx.save(make(), path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
