"""A small transformer block through `torch.compile(..., backend=polyc.torch_backend)`.

    python examples/torch_block.py          # compiles, runs, compares with eager PyTorch

`Block` is a pre-norm encoder block: LayerNorm, multi-head attention (one Linear for
q, k and v, `scaled_dot_product_attention`, an output Linear), a residual add, LayerNorm,
Linear + GELU + Linear, a residual add. Under `torch.no_grad()` its whole ATen graph is
one polyc partition; the script prints what ran in polyc and the largest difference
from eager.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from polyc.torch_compile import TorchBackend


class Block(nn.Module):
    def __init__(self, width: int = 128, heads: int = 4, hidden: int = 512):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def main() -> None:
    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 64, 128)
    backend = TorchBackend()  # as polyc.torch_backend, with a record of its own
    with torch.no_grad():
        y = torch.compile(block, backend=backend)(x)
        expected = block(x)
    for p in backend.partitions:
        ops = sorted({op.split(".")[-2] for op in p.ops if op.startswith("aten.")})
        print(f"{p.name}: {len(p.ops)} nodes in polyc ({', '.join(ops)}); "
              f"compiled for {len(p.kernels)} shape(s), refused {len(p.refused)}")
    err = (y - expected).abs().max().item()
    print(f"max |polyc - eager| = {err:.2e}")
    assert torch.allclose(y, expected, rtol=1e-4, atol=1e-4), err


if __name__ == "__main__":
    main()
