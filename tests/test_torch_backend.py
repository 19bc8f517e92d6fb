"""polyc.torch_backend: torch.compile graphs run as polyc kernels where polyc supports
their ops, in PyTorch elsewhere, and always give eager PyTorch's answer (values, dtypes,
gradients). Skipped when PyTorch is not installed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: polyc.torch_backend "
                                            "is not tested")
import torch.nn.functional as F  # noqa: E402

from polyc.codegen.runtime import Program  # noqa: E402
from polyc.torch_compile import TorchBackend, _array  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from torch_block import Block  # noqa: E402


def _compile(fn, **kw):
    backend = TorchBackend()
    return torch.compile(fn, backend=backend, **kw), backend


def _ops(backend) -> set[str]:
    return {op.split(".")[-2] for p in backend.partitions for op in p.ops if op.startswith("aten")}


def test_transformer_block_is_one_partition_and_matches_eager():
    torch.manual_seed(0)
    block = Block(width=64, heads=4, hidden=128).eval()
    x = torch.randn(2, 16, 64)
    fn, backend = _compile(block)
    with torch.no_grad():
        got, expected = fn(x), block(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert len(backend.partitions) == 1
    p = backend.partitions[0]
    assert len(p.kernels) == 1 and not p.refused
    assert {"addmm", "native_layer_norm", "gelu", "_scaled_dot_product_flash_attention_for_cpu",
            "split", "transpose", "add"} <= _ops(backend)


def _mix(x, y, i):
    a = (x + 2.0) * y - 1.5 / (y.abs() + 1)
    b = torch.where(x > y, torch.exp(-a), torch.tanh(a)).clamp(-0.5, 0.7)
    c = torch.sigmoid(b) + torch.relu(x) - F.silu(y) + torch.rsqrt(y * y + 1) + torch.log1p(x.abs())
    d = c.sum(-1, keepdim=True) + c.mean(0) + c.amax(-1, keepdim=True)
    e = torch.cat([d, F.log_softmax(c, 0)], 1)[:, 1:9]
    f = e.permute(1, 0) @ x + (i * 3).float().mean()
    return F.gelu(f, approximate="tanh"), i > 2, torch.pow(x.abs() + 1, 1.5), f.t()


def test_elementwise_reductions_and_data_movement_match_eager():
    x, y = torch.randn(6, 10), torch.randn(6, 10)
    i = torch.arange(12, dtype=torch.int32).view(6, 2)
    fn, backend = _compile(_mix)
    got, expected = fn(x, y, i), _mix(x, y, i)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    # a result PyTorch lays out transposed comes back with the same strides
    assert got[3].stride() == expected[3].stride()
    assert {"where", "gt", "clamp", "cat", "slice", "mm", "_log_softmax", "amax", "pow",
            "_to_copy"} <= _ops(backend)
    assert all(len(p.kernels) == 1 and not p.refused for p in backend.partitions)


def test_small_cnn_and_attention_with_masks_match_eager():
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8),
                        nn.LeakyReLU(0.1), nn.Hardtanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(8, 4)).eval()
    for m in net:  # statistics other than 0 and 1, so that batch norm does something
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)

    def fn(img, q, k, v, mask):
        return (net(img), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask).masked_fill(q > 1, 7))

    args = (torch.randn(2, 3, 16, 16), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 6, 4),
            torch.randn(1, 2, 6, 4), torch.randn(8, 6))
    compiled, backend = _compile(fn)
    with torch.no_grad():
        got, expected = compiled(*args), fn(*args)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    assert {"convolution", "_native_batch_norm_legit_no_training", "leaky_relu", "hardtanh",
            "_scaled_dot_product_flash_attention_for_cpu", "masked_fill"} <= _ops(backend)
    attention = [op for p in backend.partitions for op in p.ops if "scaled_dot_product" in op]
    assert len(attention) == 2  # the masked one too
    assert all(len(p.kernels) == 1 and not p.refused for p in backend.partitions)


def test_tensors_the_converter_adds_never_clash_with_fx_names():
    # FX names the multiplications mul, mul_1, mul_2; addmm's beta adds one more
    def fn(b, x, w):
        return torch.addmm(b, x, w, beta=0.5) * 2 * 3 * 4

    args = (torch.randn(3), torch.randn(2, 4), torch.randn(4, 3))
    compiled, backend = _compile(fn)
    torch.testing.assert_close(compiled(*args), fn(*args))
    [p] = backend.partitions
    assert len(p.kernels) == 1 and not p.refused


def test_unsupported_op_stays_with_pytorch():
    def fn(x):
        return torch.softmax(torch.cumsum(torch.relu(x) * 2, dim=1), dim=-1)

    x = torch.randn(8, 16)
    compiled, backend = _compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))
    assert len(backend.partitions) == 2
    assert "cumsum" not in _ops(backend)


def test_float64_and_float16_match_eager():
    def fn(a, b):
        return torch.softmax(a, -1) * 3, F.gelu(b) + b

    a, b = torch.randn(5, 7, dtype=torch.float64), torch.randn(6, 8).half()
    compiled, backend = _compile(fn)
    (ga, gb), (ea, eb) = compiled(a, b), fn(a, b)
    assert ga.dtype == torch.float64 and gb.dtype == torch.float16
    torch.testing.assert_close(ga, ea, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gb, eb, rtol=1e-3, atol=1e-3)
    assert all(len(p.kernels) == 1 for p in backend.partitions)


def test_bfloat16_and_int64_match_eager():
    def fn(a, i):
        return torch.softmax(a * 2 + 1, -1), i * 3 + 2**40

    a, i = torch.randn(6, 8, dtype=torch.bfloat16), torch.randint(-2**40, 2**40, (6, 8))
    compiled, backend = _compile(fn)
    (ga, gi), (ea, ei) = compiled(a, i), fn(a, i)
    assert ga.dtype == torch.bfloat16 and gi.dtype == torch.int64
    torch.testing.assert_close(ga, ea, rtol=1.6e-2, atol=1e-2)
    assert torch.equal(gi, ei)
    assert [len(p.kernels) for p in backend.partitions] == [1]
    assert _array(a).view(np.uint16).tolist() == a.view(torch.int16).numpy().view(
        np.uint16).tolist() and _array(a).ctypes.data == a.data_ptr()


def test_shapes_polyc_refuses_run_in_pytorch_with_a_warning():
    compiled, backend = _compile(lambda x: torch.softmax(x, -1) * 2)
    x = torch.randn(0, 4)  # polyc tensors have no zero-sized dims
    with pytest.warns(UserWarning, match="runs in PyTorch for these shapes: .*>= 1"):
        got = compiled(x)
    assert got.shape == (0, 4)
    [p] = backend.partitions
    assert not p.kernels and len(p.refused) == 1


def test_views_alone_are_left_to_pytorch():
    compiled, backend = _compile(lambda x: x.t().reshape(-1)[2:])
    x = torch.randn(4, 5)
    torch.testing.assert_close(compiled(x), x.t().reshape(-1)[2:])
    assert backend.partitions == []


def test_dynamic_dims_compile_once_for_every_size():
    fn, backend = _compile(lambda x, g: F.layer_norm(x, (x.shape[-1],), g) * 2, dynamic=True)
    g = torch.randn(32)
    for rows in (3, 3, 7, 300):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(fn(x, g), F.layer_norm(x, (32,), g) * 2)
    [p] = backend.partitions
    assert p.dynamic and p.symbolic is not None and not p.kernels and not p.refused


def test_a_norm_over_a_dynamic_axis_compiles_once():
    fn, backend = _compile(lambda x: torch.softmax(F.layer_norm(x, (x.shape[-1],)), -1)
                           + x.mean(-1, keepdim=True), dynamic=True)
    for cols in (5, 7, 64):
        x = torch.randn(4, cols)
        torch.testing.assert_close(fn(x), torch.softmax(F.layer_norm(x, (cols,)), -1)
                                   + x.mean(-1, keepdim=True), rtol=1e-4, atol=1e-5)
    [p] = backend.partitions
    assert p.symbolic is not None and not p.kernels


def test_transformer_block_over_a_dynamic_length_compiles_once():
    torch.manual_seed(0)
    block = Block(width=32, heads=2, hidden=64).eval()
    fn, backend = _compile(block)
    with torch.no_grad():
        for length in (8, 5, 21):
            x = torch.randn(1, length, 32)
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(fn(x), block(x), rtol=1e-4, atol=1e-5)
    [p] = backend.partitions
    assert p.symbolic is not None and not p.kernels
    # the four linear layers and P @ V keep their microkernels: only the scores with
    # their softmax (all the columns of a row in one block) run the portable loops
    assert sum(bool(k.microkernels) for k in p.symbolic.compiled.kernels) == 5


def test_what_polyc_cannot_write_with_symbols_is_compiled_per_shape():
    """A scalar computed from a size (x.shape[0]) would be a constant of one size."""
    fn, backend = _compile(lambda x: x.sum(0) / x.shape[0] + 1, dynamic=True)
    with pytest.warns(UserWarning, match="compiled per shape.*depends on a dynamic size"):
        for rows in (3, 7):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(fn(x), x.sum(0) / rows + 1)
    [p] = backend.partitions
    assert p.symbolic is None and len(p.kernels) == 2


def test_compiled_once_per_shape_without_dynamic_dims():
    fn, backend = _compile(lambda x, g: F.layer_norm(x, (x.shape[-1],), g) * 2, dynamic=False)
    g = torch.randn(32)
    for rows in (3, 3):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(fn(x, g), F.layer_norm(x, (32,), g) * 2)
    [p] = backend.partitions
    assert not p.dynamic and len(p.kernels) == 1 and not p.refused


def test_training_gradients_match_eager():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                              torch.nn.Linear(32, 4))
    x = torch.randn(8, 16, requires_grad=True)
    fn, backend = _compile(net)
    fn(x).square().sum().backward()
    got = [x.grad] + [p.grad for p in net.parameters()]
    x.grad = None
    net.zero_grad()
    net(x).square().sum().backward()
    for g, e in zip(got, [x.grad] + [p.grad for p in net.parameters()]):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    assert backend.partitions  # the forward and the backward both ran partitions in polyc


def test_tensors_are_passed_without_copies(monkeypatch):
    """The kernels read a contiguous input's memory and write the result tensor's own
    (`Program.run_at`); a strided input is copied dense first. A simulated chip's
    program has no such call: numpy's views of the same tensors go to its `__call__`."""
    seen = []
    run_at = Program.run_at
    monkeypatch.setattr(Program, "run_at",
                        lambda self, at: seen.append((self, dict(at))) or run_at(self, at))
    for target in ("cpu", "manycore"):
        backend = TorchBackend(target=target)
        fn = torch.compile(lambda x: torch.softmax(x, -1) * 2, backend=backend)
        x, strided = torch.randn(8, 32), torch.randn(32, 8).t()
        for t in (x, strided):
            seen.clear()
            y = fn(t)
            torch.testing.assert_close(y, torch.softmax(t, -1) * 2)
            [(program, at)] = seen
            assert program.run_at(at) == (target == "cpu")
            if target == "cpu":
                assert (t.data_ptr() in at.values()) == (t is x) and y.data_ptr() in at.values()
    # the symbolic compiles' inputs: numpy's views, a strided tensor copied dense
    t = torch.randn(4, 6)
    assert _array(t).ctypes.data == t.data_ptr()
    assert np.array_equal(_array(t.t()), t.t().numpy())


def test_import_polyc_does_not_import_torch():
    code = "import sys, polyc; polyc.compile; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
