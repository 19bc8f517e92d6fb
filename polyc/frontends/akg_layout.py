"""Ascend's FRACTAL_NZ layout in the AKG importer, as data movement in the graph.

A matrix [..., M, N] is stored FRACTAL_NZ as [..., N1, M1, M0, N0] (M0 = N0 = 16, the
cube's fractal; M = M1*M0, N = N1*N0): 16x16 blocks, column of blocks by column of
blocks, each block row-major, so element (m, n) sits at [n//16, m//16, m%16, n%16]
(MindSpore's TransShapeToFracNz: "N*H*W -> N*W1*H1*H0*W0"). MindSpore's ops on NZ
tensors mean the ops on the plain matrices (an elementwise op between an NZ tensor and
a DefaultFormat one broadcasts the latter against the NZ tensor's plain shape), except
that a reduction's axes are counted on the NZ shape.

The importer holds every NZ tensor in its plain (ND) form: an NZ kernel input is
transposed and reshaped to ND right after it is read, ops compute on ND, and an NZ
kernel output is reshaped and transposed back just before it is written, so the
kernel's own tensors keep their NZ shapes and fusion folds the movement into the
accesses. The corpus gives no `ori_shape`, so an NZ tensor is taken to be exactly its
blocks (no padding).

    input_0: float16[2,3,16,16] NZ  ->  input_0.nd = reshape(transpose(input_0,
                                          perm=[1,2,0,3]), [48, 32])
"""
from __future__ import annotations

from ..graph.ir import TensorType

NZ = "FRACTAL_NZ"
FRACTAL = 16  # M0 = N0 for the float types (the cube's 16x16 fractal)


def nz_problem(shape: tuple[int, ...]) -> str | None:
    """Why `shape` is not an NZ shape polyc takes (None when it is)."""
    if len(shape) < 4:
        return f"a {NZ} shape has at least 4 dims [..., N1, M1, M0, N0], got {list(shape)}"
    if shape[-2:] != (FRACTAL, FRACTAL):
        return (f"a {NZ} shape ends in the {FRACTAL}x{FRACTAL} fractal [..., {FRACTAL}, "
                f"{FRACTAL}], got {list(shape)}")
    return None


def nd_shape(nz: tuple[int, ...]) -> tuple[int, ...]:
    """[..., N1, M1, M0, N0] -> [..., M1*M0, N1*N0]."""
    *batch, n1, m1, m0, n0 = nz
    return (*batch, m1 * m0, n1 * n0)


def nz_shape(nd: tuple[int, ...]) -> tuple[int, ...] | None:
    """[..., M, N] -> [..., N/16, M/16, 16, 16]; None when M or N is not a whole
    number of fractals (or the tensor is not a matrix)."""
    if len(nd) < 2 or nd[-2] % FRACTAL or nd[-1] % FRACTAL:
        return None
    *batch, m, n = nd
    return (*batch, n // FRACTAL, m // FRACTAL, FRACTAL, FRACTAL)


def nd_type(t: TensorType) -> TensorType:
    return TensorType(nd_shape(t.shape), t.dtype)


def to_nd(imp, x: str, out: str) -> str:
    """`out`, the ND matrix of the NZ tensor `x` (emitted through the importer)."""
    k = imp.types[x].ndim - 4
    batch = list(range(k))
    blocks = imp.emit("transpose", x, perm=batch + [k + 1, k + 2, k, k + 3])
    return imp.emit("reshape", blocks, out=out, shape=list(nd_shape(imp.types[x].shape)))


def to_nz(imp, x: str, out: str) -> str:
    """`out`, the NZ tensor of the ND matrix `x` (whose type has an NZ shape)."""
    nz = nz_shape(imp.types[x].shape)
    k = len(nz) - 4
    batch = list(nz[:k])
    blocks = imp.emit("reshape", x, shape=batch + [nz[k + 1], FRACTAL, nz[k], FRACTAL])
    return imp.emit("transpose", blocks, out=out,
                    perm=list(range(k)) + [k + 2, k, k + 1, k + 3])


def nd_axes(axes: list[int], rank: int) -> tuple[list[int], str | None]:
    """A reduction's axes on an NZ shape of `rank` dims as axes of the ND matrix, or
    why they cannot be (a fractal axis reduced without its block axis, or the reverse)."""
    k = rank - 4
    norm = sorted({a + rank if a < 0 else a for a in axes} if axes else range(rank))
    if any(not 0 <= a < rank for a in norm):
        return [], f"axis out of range for {rank} dims: {axes}"
    n_axes, m_axes = {k, k + 3} & set(norm), {k + 1, k + 2} & set(norm)
    if len(n_axes) == 1 or len(m_axes) == 1:
        return [], (f"reduces half of a {NZ} matrix dim (axes {k} and {k + 3} are N, "
                    f"{k + 1} and {k + 2} are M): {axes}")
    out = [a for a in norm if a < k]
    return out + [k] * bool(m_axes) + [k + 1] * bool(n_axes), None
